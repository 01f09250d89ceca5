"""BOCD+V tells a trend from a change: trends, slow drift, seasonality and fine-grained ramps are no change
points; a step on top of any of them still is."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from failslow.detect import detect_matrix, detect_series

N = 480
T = np.arange(N, dtype=np.float64)


def _noisy(level: np.ndarray, seed: int, jitter: float = 0.02) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return level * (1.0 + jitter * rng.standard_normal(level.shape[0]))


def _season(period: int, amplitude: float) -> np.ndarray:
    return 1.0 + amplitude * np.sin(2.0 * np.pi * T / period)


def _stairs(n_steps: int, top: float, span: int) -> np.ndarray:
    """A batch-size ramp: the iteration time grows from 1 to ``top`` in ``n_steps`` equal stairs."""
    level = np.ones(N)
    for k in range(n_steps):
        level[(k + 1) * span // n_steps:] = 1.0 + (top - 1.0) * (k + 1) / n_steps
    return level


NO_CHANGE: dict[str, Callable[[], np.ndarray]] = {
    "linear trend, doubling": lambda: 1.0 + T / N,
    "linear trend, halving": lambda: 2.0 - T / N,
    "growth by 1 % per sample": lambda: 1.01 ** T,
    "slow drift, +20 %": lambda: 1.0 + 0.2 * T / N,
    "batch-size ramp, 40 stairs to 3x": lambda: _stairs(40, 3.0, 400),
    "seasonality, period 8, +-30 %": lambda: _season(8, 0.3),
    "seasonality, period 20, +-30 %, on a doubling trend": lambda: _season(20, 0.3) * (1.0 + T / N),
    "seasonality, period 24, +-15 %": lambda: _season(24, 0.15),
}


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("name", list(NO_CHANGE))
def test_trend_drift_and_seasonality_are_no_change_points(name: str, seed: int) -> None:
    x = _noisy(NO_CHANGE[name](), seed)
    res = detect_series(x, "bocd-v")
    # A seasonal swing can only be told from a change once the series has shown it twice (and the
    # detector keeps 49 samples): the first two periods may look like level shifts.
    settle = 48 if "seasonality" in name else 0
    late = [c.index for c in res.change_points if c.index >= settle]
    assert late == [], (name, [(c.index, round(c.ratio, 2)) for c in res.change_points])
    assert all(onset < settle for onset, _, _ in res.events)


STEP_ON: dict[str, Callable[[], np.ndarray]] = {
    "a linear trend": lambda: 1.0 + 0.5 * T / N,
    "growth by 0.2 % per sample": lambda: 1.002 ** T,
    "a falling trend": lambda: 2.0 - T / N,
    "seasonality, period 20": lambda: _season(20, 0.2),
}


@pytest.mark.parametrize("name", list(STEP_ON))
def test_a_step_on_a_trend_or_season_is_still_found(name: str) -> None:
    step = np.where(T >= 400, 1.3, 1.0)
    x = _noisy(STEP_ON[name]() * step, 7)
    res = detect_series(x, "bocd-v")
    found = [c for c in res.change_points if abs(c.index - 400) <= 3]
    assert len(found) == 1, [(c.index, round(c.ratio, 2)) for c in res.change_points]
    assert found[0].detected_at - 400 <= 12 and found[0].ratio > 1.15
    if "seasonality" not in name:
        # Nothing else: the trend goes on after the step and is no change. (Right after a step on a
        # seasonal series the season is not yet established at the new level, so its next swing can be
        # a change point until a period has passed.)
        assert [c.index for c in res.change_points] == [found[0].index]
        assert res.events == [(found[0].index, found[0].detected_at, -1)]


def test_trend_and_season_decisions_are_the_same_vectorised() -> None:
    """The service's vectorised detector makes the batch form's decisions on trends and seasons too."""
    cols = [_noisy(NO_CHANGE[n](), 4) for n in NO_CHANGE] + [_noisy(STEP_ON[n]() * np.where(T >= 400, 1.3, 1.0), 5)
                                                              for n in STEP_ON]
    x = np.stack(cols, axis=1)
    x[[50, 51, 300], 1] = np.nan  # missing samples: the lag layout must skip them alike
    mat = detect_matrix(x, "bocd-v")
    for k in range(x.shape[1]):
        one = detect_series(x[:, k], "bocd-v")
        assert [(c.index, c.detected_at) for c in one.change_points] == \
            [(c.index, c.detected_at) for c in mat[k].change_points], k
        assert one.events == mat[k].events


def _recovery_in_stairs(stair: int, noise: float, seed: int) -> np.ndarray:
    """A slowdown undone in stairs, as the testbed's closed loop measured it: 0.42 s healthy, 1.03 s under the
    fault, then 0.70, 0.59, 0.45 (``stair`` samples each) and 0.38 s as the remediator's splits went back."""
    level = np.array([0.42] * 150 + [1.03] * 60 + [0.70] * stair + [0.59] * stair + [0.45] * stair + [0.38] * 80)
    return _noisy(level, seed, noise)


@pytest.mark.parametrize("stair", [3, 6, 12, 20])
def test_a_recovery_in_stairs_ends_the_event(stair: int) -> None:
    """The trend check does not judge the end of an event: a recovery in stairs reads as a trend the next stair
    continues, and with the check its last stairs were never confirmed, so the event never closed."""
    for noise in (0.01, 0.03):
        for seed in range(4):
            x = _recovery_in_stairs(stair, noise, seed)
            mat = detect_matrix(x[:, None], "bocd-v")[0]
            for res in (detect_series(x, "bocd-v"), mat):
                assert len(res.events) == 1, (noise, seed, res.events)
                onset, _, end = res.events[0]
                assert 150 <= onset <= 152
                assert 210 < end <= 210 + 3 * stair + 6, (noise, seed, res.events)


def test_a_recovery_in_a_long_descent_ends_the_event() -> None:
    """No confirmed change ends an event whose level came back through a long noisy descent: the regime since
    the last change holds the whole descent and the step to the level now is fewer than ``z`` standard errors
    of it. The levels are those of a testbed closed loop (rank 1, 5 s polls): 0.42 s healthy, 1.2 s under
    the fault, 0.68 s after the first split, then the splits going back and the fault gone. Sixteen samples
    back in a row end the event, and a job that stays slow is not ended by the same rule."""
    descent = [0.685, 0.695, 0.635, 0.62, 0.615, 0.604, 0.564, 0.524, 0.524, 0.449, 0.438, 0.476, 0.503, 0.528,
               0.509, 0.567, 0.549, 0.45, 0.456, 0.459]
    for seed in range(4):
        x = _noisy(np.array([0.42] * 120 + [1.2] * 12 + descent + [0.36] * 40), seed, 0.02)
        res = detect_series(x, "bocd-v")
        mat = detect_matrix(x[:, None], "bocd-v")[0]
        for r in (res, mat):
            assert len(r.events) == 1, (seed, r.events)
            onset, _, end = r.events[0]
            assert 120 <= onset <= 122 and 132 < end <= 132 + len(descent) + 16, (seed, r.events)
        # the same descent stopping at 0.60 s (1.43x, more than a fifth of the rise left): still open
        slow = _noisy(np.array([0.42] * 120 + [1.2] * 12 + descent[:4] + [0.60] * 60), seed, 0.02)
        assert [e[2] for e in detect_series(slow, "bocd-v").events] == [-1], seed

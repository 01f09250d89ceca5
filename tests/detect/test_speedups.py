"""Speed-ups: a short one that ends is no slowdown; a lasting one is the new normal a later slowdown is seen from.

The bug: while healthy, :class:`~failslow.detect.EventTracker` moved its reference down to the faster level
as soon as a speed-up was confirmed, so the end of a speed-up of 5 samples or more (a return to the level the
job had run at all along) read as a 1.4-2x slowdown against it and opened an event that never closed (the
old level was now the "normal"). The rule now: a rise is judged against the higher of the level before it
and the level before a speed-up that began fewer than ``SETTLE`` (32) samples earlier; a speed-up that has
lasted ``SETTLE`` samples is the job's new normal.
"""

from __future__ import annotations

import numpy as np
import pytest

from failslow.detect import SETTLE, EventTracker, detect_matrix, detect_series

ONSET = 100
N = 300


def speedup(length: int, factor: float, noise: float, seed: int, n: int = N) -> np.ndarray:
    """A flat series around 1.0 (relative noise ``noise``) at ``factor`` (< 1: faster) on
    ``[ONSET, ONSET + length)``, back to 1.0 after."""
    rng = np.random.default_rng(seed)
    x = 1.0 + noise * rng.standard_normal(n)
    x[ONSET:ONSET + length] *= factor
    return x


CASES = [(length, factor, noise, seed) for length in range(3, 13) for factor in (0.7, 0.5)
         for noise in (0.01, 0.03) for seed in range(3)]


@pytest.mark.parametrize(("length", "factor"), [(n, f) for n in range(3, 13) for f in (0.7, 0.5)])
def test_a_short_speedup_that_ends_opens_no_event(length: int, factor: float) -> None:
    for noise in (0.01, 0.03):
        for seed in range(3):
            res = detect_series(speedup(length, factor, noise, 100 * seed + length), "bocd-v")
            assert res.events == [], (noise, seed, res.events, res.change_points)
            if length >= 5:
                # The detector still sees both changes; only the event layer reads the second as a return.
                assert [c.index for c in res.change_points] == [ONSET, ONSET + length]


def test_the_vectorised_detector_agrees_on_short_speedups() -> None:
    xs = [speedup(n, f, noise, 100 * seed + n) for n, f, noise, seed in CASES]
    mat = detect_matrix(np.stack(xs, axis=1), "bocd-v")
    for x, r in zip(xs, mat, strict=True):
        one = detect_series(x, "bocd-v")
        assert r.events == one.events == []
        assert [(c.index, c.detected_at) for c in one.change_points] == \
            [(c.index, c.detected_at) for c in r.change_points]


@pytest.mark.parametrize("factor", [0.7, 0.5])
def test_a_short_speedup_then_a_real_slowdown_is_measured_from_the_old_level(factor: float) -> None:
    """Back from an 8-sample speed-up straight to 1.5x the level the job ran at: a slowdown of 1.5x, opened at
    the end of the speed-up, against the level from before it; it closes when the job is back at that level."""
    x = speedup(8, factor, 0.01, 5)
    x[108:160] *= 1.5
    res = detect_series(x, "bocd-v")
    assert [(e[0], e[2]) for e in res.events] == [(108, 160)]
    assert [round(c.level_after / 1.0, 1) for c in res.change_points] == [factor, 1.5, 1.0]
    vec = detect_matrix(x[:, None], "bocd-v")[0]
    assert vec.events == res.events


@pytest.mark.parametrize("factor", [0.7, 0.5])
def test_a_lasting_speedup_is_the_new_normal(factor: float) -> None:
    """The job got faster for good (an optimisation, a remediation): 1.5x that faster level later is a
    slowdown, opened where it starts, measured against the faster level; so is a return to the old level."""
    rng = np.random.default_rng(3)
    x = 1.0 + 0.01 * rng.standard_normal(400)
    x[100:] *= factor
    x[220:300] *= 1.5
    res = detect_series(x, "bocd-v")
    assert [(e[0], e[2]) for e in res.events] == [(220, 300)]
    assert detect_matrix(x[:, None], "bocd-v")[0].events == res.events
    back = 1.0 + 0.01 * rng.standard_normal(400)
    back[100:220] *= factor  # 120 samples faster, then the old level: a slowdown from the new normal
    res = detect_series(back, "bocd-v")
    assert [e[0] for e in res.events] == [220]


def test_how_long_a_speedup_must_last_to_be_the_new_normal() -> None:
    """Well under SETTLE samples and back: no event; well over it and back: a slowdown from the faster level."""
    for length, events in ((SETTLE - 8, 0), (SETTLE + 16, 1)):
        for seed in range(3):
            res = detect_series(speedup(length, 0.7, 0.01, seed), "bocd-v")
            assert len(res.events) == events, (length, seed, res.events)


def test_a_speedup_in_steps_counts_from_its_first_step() -> None:
    """0.8x then 0.6x (10 samples each) and back: the return is judged against the level before the first
    step, so it is no slowdown."""
    rng = np.random.default_rng(9)
    x = 1.0 + 0.01 * rng.standard_normal(N)
    x[100:110] *= 0.8
    x[110:120] *= 0.6
    res = detect_series(x, "bocd-v")
    assert [c.index for c in res.change_points] == [100, 110, 120]
    assert res.events == []


def test_warmup_still_sets_the_reference_and_a_later_slowdown_is_seen() -> None:
    """Slow first iterations (a 1.6x plateau of 20, then easing down) are a speed-up that becomes the normal:
    a 1.3x slowdown 60 samples later opens an event at its start, measured against the level after warm-up."""
    rng = np.random.default_rng(4)
    x = 2.0 * (1.0 + 0.01 * rng.standard_normal(300))
    x[:20] *= 1.6
    x[0] *= 40.0  # the usual first iteration: checkpoint load, compilation
    x[80:200] *= 1.3
    res = detect_series(x, "bocd-v")
    assert [(e[0], e[2]) for e in res.events] == [(80, 200)]
    assert res.change_points[0].index == 20 and res.change_points[0].ratio < 0.7
    assert detect_matrix(x[:, None], "bocd-v")[0].events == res.events


def test_tracker_rule_directly() -> None:
    """The event layer alone: a rise to the pre-speed-up level within SETTLE is no event, after it is."""
    one = np.ones(1, dtype=bool)

    def feed(tr: EventTracker, c: int, before: float, after: float) -> tuple[bool, bool]:
        o, r = tr.observe(one, np.array([c]), np.array([before]), np.array([after]))
        return bool(o[0]), bool(r[0])

    tr = EventTracker(1, 0.10)
    assert feed(tr, 100, 1.0, 0.7) == (False, False)
    assert feed(tr, 100 + SETTLE - 1, 0.7, 1.0) == (False, False)  # the speed-up's end
    assert feed(tr, 200, 1.0, 1.2) == (True, False)  # nothing pending any more: 1.2x is a slowdown
    tr = EventTracker(1, 0.10)
    feed(tr, 100, 1.0, 0.7)
    assert feed(tr, 100 + SETTLE, 0.7, 1.0) == (True, False)  # the faster level had become the normal
    assert tr.open_baseline()[0] == pytest.approx(0.7)
    tr = EventTracker(1, 0.10)
    feed(tr, 100, 1.0, 0.7)
    assert feed(tr, 110, 0.7, 1.5) == (True, False)  # beyond the old level: measured against it
    assert tr.open_baseline()[0] == pytest.approx(1.0) and tr.slowdown()[0] == pytest.approx(1.5)


def test_tracker_state_round_trip_keeps_a_pending_speedup() -> None:
    one = np.ones(1, dtype=bool)
    tr = EventTracker(1, 0.10)
    tr.observe(one, np.array([100]), np.array([1.0]), np.array([0.7]))
    again = EventTracker(1, 0.10)
    again.load_state_dict(tr.state_dict())
    o, _ = again.observe(one, np.array([110]), np.array([0.7]), np.array([1.0]))
    assert not o[0]
    old = {k: v for k, v in tr.state_dict().items() if k not in ("high", "since")}  # an older snapshot
    again = EventTracker(1, 0.10)
    again.load_state_dict(old)
    assert np.isnan(again.high).all() and (again.since == -1).all()

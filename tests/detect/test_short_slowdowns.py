"""Short slowdowns (3-12 samples) are opened and closed again, by BOCD+V's streaming and batch forms alike.

A slowdown of a few samples used to open an event that never closed: its end, a return to exactly the level
from before it, was judged against a "trend" read through the samples across the slowdown's own confirmed
change (mostly the healthy level from before it) and against a "season" of the same samples, so it stood off
neither and was never confirmed; the event stayed open for the next 160+ samples. Slowdowns of 8 samples or
more closed only because their samples tilted that trend line.

How short is still seen: a change is confirmed once ``n_min`` (5) samples of the new regime exist and at
least 75 % of them (``consistency``) moved, so a slowdown of ``n_min`` samples or more always opens an event;
one of 4 sometimes does (BOCD places the regime start at its first sample and the fifth sample, already
healthy, is the one outlier allowed); one of 3 never does. How soon it closes: the end is itself a change
that needs ``n_min`` samples of the healthy level, so it is confirmed ``n_min - 1`` samples after the
first healthy sample at the earliest; we allow one sample more (BOCD may place the restart one late).
"""

from __future__ import annotations

import numpy as np
import pytest

from failslow.detect import SeriesResult, VerifyConfig, detect_matrix, detect_series

ONSET = 100
N = 300
N_MIN = VerifyConfig().n_min
CLOSE_WITHIN = N_MIN  # the end is confirmed at most this many samples after the first healthy one


def short_slowdown(length: int, factor: float, noise: float, seed: int) -> np.ndarray:
    """A flat series around 1.0 (relative noise ``noise``) slowed by ``factor`` on ``[ONSET, ONSET + length)``."""
    rng = np.random.default_rng(seed)
    x = 1.0 + noise * rng.standard_normal(N)
    x[ONSET:ONSET + length] *= factor
    return x


def check_closed(res: SeriesResult, length: int) -> None:
    """The event (if one opened) started at the slowdown and its end was confirmed within the bound."""
    end = ONSET + length
    if length >= N_MIN:
        assert len(res.events) == 1, res.events
    assert len(res.events) <= 1, res.events
    confirmed = {c.index: c.detected_at for c in res.change_points}
    for onset, _, closed_at in res.events:
        assert onset == ONSET
        assert closed_at != -1, f"a {length}-sample slowdown left its event open"
        assert abs(closed_at - end) <= 1, (closed_at, end)
        assert N_MIN - 1 <= confirmed[closed_at] - end <= CLOSE_WITHIN, (confirmed[closed_at], end)


CASES = [(length, factor, noise, seed) for length in range(3, 13) for factor in (1.4, 2.0)
         for noise in (0.01, 0.03) for seed in range(3)]


@pytest.mark.parametrize(("length", "factor"), [(n, f) for n in range(3, 13) for f in (1.4, 2.0)])
def test_a_short_slowdown_opens_and_closes(length: int, factor: float) -> None:
    for noise in (0.01, 0.03):
        for seed in range(3):
            res = detect_series(short_slowdown(length, factor, noise, 100 * seed + length), "bocd-v")
            check_closed(res, length)
            if length < N_MIN - 1:
                assert res.events == []


def test_the_colleagues_case_closes_at_once() -> None:
    """The report: ~1.0 with small noise, 1.4x for 5-7 samples, back to 1.0: closed, not fail-slow for 160+."""
    for length in (5, 6, 7):
        res = detect_series(short_slowdown(length, 1.4, 0.01, 0), "bocd-v")
        assert len(res.events) == 1 and res.events[0][2] == ONSET + length
        assert all(c.index <= ONSET + length for c in res.change_points)  # nothing else happened


def test_streaming_and_batch_forms_agree_on_short_slowdowns() -> None:
    """The vectorised detector (every case at once, the service's form) makes the batch form's decisions."""
    xs = [short_slowdown(n, f, noise, 100 * seed + n) for n, f, noise, seed in CASES]
    mat = detect_matrix(np.stack(xs, axis=1), "bocd-v")
    for x, (n, _, _, _), r in zip(xs, CASES, mat, strict=True):
        one = detect_series(x, "bocd-v")
        assert one.events == r.events
        assert [(c.index, c.detected_at) for c in one.change_points] == \
            [(c.index, c.detected_at) for c in r.change_points]
        check_closed(r, n)


def test_a_staircase_still_is_one_event_and_a_short_stair_back_still_closes_it() -> None:
    """Continuing a change (the next stair up) is still read against the slope across the earlier stair;
    only a move back toward the level before the regime is judged against the regime's own level."""
    rng = np.random.default_rng(7)
    x = 1.0 + 0.01 * rng.standard_normal(N)
    x[100:106] *= 1.3
    x[106:112] *= 1.7  # a second stair, 6 samples after the first
    res = detect_series(x, "bocd-v")
    assert [c.index for c in res.change_points] == [100, 106, 112]
    assert [(e[0], e[2]) for e in res.events] == [(100, 112)]

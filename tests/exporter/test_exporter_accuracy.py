"""The accuracy scorer used by the bench and the integration test (pure parts, with literals)."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.accuracy import score_rank
from failslow.errors import InputError


def test_score_rank_aligns_by_end_time_and_measures_window_error() -> None:
    rng = np.random.default_rng(0)
    truth = list(0.5 + 0.1 * rng.random(40))
    ends = list(1000 + np.cumsum(truth))
    # the exporter marks each iteration 30 ms before the trainer does and starts 3 iterations late
    marks = np.asarray(ends[2:]) - 0.03
    hist = list(zip(np.diff(marks).tolist(), marks[1:].tolist(), strict=True))
    n, windows, mean_e, med_e, max_e, run_e, tmean = score_rank(hist, truth, ends, window=10)
    assert n == 37 and windows == 28
    assert max(mean_e, med_e, max_e, abs(run_e)) < 1e-9  # a constant offset cancels exactly
    assert tmean == pytest.approx(np.mean(truth[3:]))
    # one stall between the mark and the trainer's step end moves the windows that hold one of the two
    marks2 = marks.copy()
    marks2[20:] -= 0.2
    hist2 = list(zip(np.diff(marks2).tolist(), marks2[1:].tolist(), strict=True))
    _, _, mean2, med2, max2, _, _ = score_rank(hist2, truth, ends, window=10)
    assert max2 > 2.0 and med2 < mean2 < max2
    with pytest.raises(InputError):
        score_rank([], truth, ends)


def test_score_rank_matches_each_iteration_when_the_exporter_skips_one() -> None:
    # The exporter does not report the iteration that straddles a re-estimation: every later one must
    # still be compared with its own trainer iteration (a single index shift misaligned them all).
    rng = np.random.default_rng(1)
    truth = list(0.4 + 0.3 * rng.random(50))
    ends = list(1000 + np.cumsum(truth))
    marks = np.asarray(ends) - 0.02
    hist = [(float(marks[i] - marks[i - 1]), float(marks[i])) for i in range(1, 50) if i != 25]
    n, windows, mean_e, _med, max_e, run_e, _ = score_rank(hist, truth, ends, window=10)
    assert n == 47 and windows == 38
    assert max(mean_e, max_e, abs(run_e)) < 1e-9

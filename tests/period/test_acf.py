"""The batch period estimate (`estimate_period`) on seeded synthetic call streams with ground truth."""

from __future__ import annotations

import numpy as np
import pytest
from period_scenarios import SCENARIOS, features

from failslow.errors import InputError
from failslow.period import PeriodTracker, encode_symbols, estimate_period
from failslow.period import synth as ps


@pytest.mark.parametrize("identical", [False, True], ids=["features", "all_identical"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batch_period_is_exact(name: str, identical: bool, seed: int) -> None:
    tr = ps.generate([SCENARIOS[name]()], [30], seed=seed)
    feats = features(tr, identical)
    est = estimate_period(tr.t_start, encode_symbols(*feats) if feats else None)
    assert est is not None
    assert est.period == tr.period[0]
    # durations between boundary calls telescope to the true total over the same iterations
    k = len(est.iteration_s)
    assert k >= 28
    assert abs(np.mean(est.iteration_s) / np.mean(tr.iteration_s) - 1) < 0.01


def test_aperiodic_noise_has_no_period() -> None:
    rng = np.random.default_rng(5)
    t = np.cumsum(rng.exponential(0.01, size=2000))
    est = estimate_period(t)
    assert est is None or est.confidence < 0.1


def test_bad_input_raises() -> None:
    with pytest.raises(InputError):
        estimate_period([0.0, np.nan, 1.0])
    with pytest.raises(InputError):
        estimate_period([0.0, 1.0], [1])
    with pytest.raises(InputError):
        encode_symbols([1, 2], [1])
    with pytest.raises(InputError):
        PeriodTracker(buffer=2)
    tr = PeriodTracker()
    tr.update([0.0, 1.0], [1, 1])
    with pytest.raises(InputError):
        tr.update([2.0], [1], [2])  # feature count changed
    assert estimate_period([1.0, 2.0]) is None  # too short to hold repeats

"""BOCD core: posterior bookkeeping, change localisation, truncation, state round trips, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from failslow.detect.bocd import BOCD, BOCDConfig
from failslow.errors import InputError


def _step_series(seed: int = 0, n0: int = 120, n1: int = 60, lo: float = 1.0, hi: float = 1.3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.r_[rng.normal(lo, 0.02 * lo, n0), rng.normal(hi, 0.02 * lo, n1)]


def test_posterior_is_normalised_and_bounded() -> None:
    b = BOCD(3, BOCDConfig(max_run=16))
    rng = np.random.default_rng(1)
    for _ in range(100):
        b.update(rng.normal(5.0, 0.1, 3))
        post = b.run_length_posterior()
        assert post.shape == (3, 16)
        np.testing.assert_allclose(post.sum(axis=1), 1.0, rtol=1e-9)
    # A stationary series ends up with its mass in the folded tail bin ("at least max_run - 1").
    assert np.all(post.argmax(axis=1) == 15)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_step_change_restarts_the_run_at_the_first_new_sample(dtype: str) -> None:
    x = _step_series()
    b = BOCD(1, BOCDConfig(dtype=dtype))
    runs = [int(b.update(np.array([v])).run_length[0]) for v in x]
    t = 120 + 5
    assert t - runs[t] == 120, "the MAP regime start must be the first sample after the step"
    assert runs[119] >= 60


def test_vectorised_equals_one_at_a_time() -> None:
    rng = np.random.default_rng(2)
    xs = np.stack([_step_series(s, lo=float(rng.uniform(0.5, 5))) for s in range(4)], axis=1)
    batch = BOCD(4)
    singles = [BOCD(1) for _ in range(4)]
    for row in xs:
        rb = batch.update(row).run_length
        rs = [int(s.update(row[i : i + 1]).run_length[0]) for i, s in enumerate(singles)]
        assert list(rb) == rs


def test_state_round_trip_resumes_identically() -> None:
    x = _step_series(3)
    a = BOCD(1)
    for v in x[:100]:
        a.update(np.array([v]))
    b = BOCD(1)
    b.load_state_dict({k: np.copy(v) for k, v in a.state_dict().items()})
    for v in x[100:]:
        ra, rb = a.update(np.array([v])), b.update(np.array([v]))
        assert ra.run_length[0] == rb.run_length[0]
        assert ra.probability[0] == pytest.approx(rb.probability[0])


def test_missing_samples_are_tolerated() -> None:
    x = _step_series(4)
    x[[10, 50, 130]] = np.nan
    b = BOCD(1)
    runs = [int(b.update(np.array([v])).run_length[0]) for v in x]
    assert 125 - runs[125] == 120
    assert np.all(np.isfinite(b.run_length_posterior()))


def test_grow_keeps_existing_series() -> None:
    b = BOCD(2)
    for v in _step_series(5)[:80]:
        b.update(np.array([v, v]))
    before = b.run_length_posterior()
    b.grow(5)
    after = b.run_length_posterior()
    np.testing.assert_allclose(after[:2], before)
    r = b.update(np.array([1.0, 1.0, 7.0, 7.0, 7.0]))
    assert list(r.run_length[2:]) == [0, 0, 0]


@pytest.mark.parametrize("kw", [{"hazard": 0.0}, {"hazard": 1.5}, {"max_run": 1}, {"kappa0": 0.0},
                                {"ew": 0.0}, {"dtype": "int8"}, {"block": 0}])
def test_bad_config_is_rejected(kw: dict[str, object]) -> None:
    with pytest.raises(InputError):
        BOCDConfig(**kw)  # type: ignore[arg-type]


def test_bad_update_is_rejected() -> None:
    b = BOCD(2)
    with pytest.raises(InputError):
        b.update(np.array([1.0]))
    with pytest.raises(InputError):
        b.update(np.array([1.0, np.inf]))


def test_batch_run_lengths_equal_streaming() -> None:
    from failslow.detect.bocd import run_lengths
    x = _step_series(6)
    x[[3, 40, 121]] = np.nan
    b = BOCD(1)
    steps = [b.update(np.array([v])) for v in x]
    tr = run_lengths(x)
    assert list(tr.run_length) == [int(s.run_length[0]) for s in steps]
    np.testing.assert_allclose(tr.probability, [float(s.probability[0]) for s in steps], rtol=1e-9)


def test_float32_state_makes_the_float64_decisions_on_labelled_jobs() -> None:
    """The service runs BOCD+V with float32 state (half the memory traffic): same events as float64."""
    from failslow.detect import make_detector
    from failslow.detect.synthetic import generate_suite

    jobs = generate_suite(7, 40, n=800)
    x = np.stack([j.values for j in jobs], axis=1)
    events: dict[str, list[tuple[int, int, int]]] = {}
    for dtype in ("float64", "float32"):
        # Blocks smaller than the series count, so the block loop is covered too.
        det = make_detector("bocd-v", x.shape[1], bocd=BOCDConfig(dtype=dtype, block=16))
        out = []
        for t in range(x.shape[0]):
            v = det.update(x[t])
            out += [(t, int(i), int(v.onset[i])) for i in np.flatnonzero(v.opened | v.recovered)]
        events[dtype] = out
    assert len(events["float64"]) >= 20  # the suite has fail-slows to find
    assert events["float32"] == events["float64"]

"""Uneven ("tcp") sharing of the server link: water-filling, fan completions, the σ fit, the simulation."""

from __future__ import annotations

import numpy as np
import pytest

from failslow.errors import InputError
from failslow.predict import predict, simulate
from failslow.predict.des import fan_completion, fit_sharing_sigma, weighted_share
from failslow.predict.profile import parse_profile, profile_to_doc
from tests.predict.profiles import make_profile


def test_weighted_share_is_proportional_and_respects_the_cap() -> None:
    assert weighted_share([1.0, 1.0], 10.0, 10.0) == pytest.approx([5.0, 5.0])
    assert weighted_share([3.0, 1.0], 8.0, 10.0) == pytest.approx([6.0, 2.0])
    # The heavy flow is capped; what it cannot use goes to the others.
    assert weighted_share([8.0, 1.0, 1.0], 10.0, 4.0) == pytest.approx([4.0, 3.0, 3.0])
    assert sum(weighted_share([0.2, 5.0, 1.3, 0.7], 7.0, 7.0)) == pytest.approx(7.0)


def test_fan_completion_spans_processor_sharing_to_one_at_a_time() -> None:
    np.testing.assert_allclose(fan_completion(4, 0.0, rounds=5), [4.0] * 4)
    wide = fan_completion(4, 10.0, rounds=200)
    np.testing.assert_allclose(wide, [1.0, 2.0, 3.0, 4.0], atol=0.2)
    mid = fan_completion(4, 0.7, rounds=200)
    assert mid[-1] == pytest.approx(4.0)  # work-conserving: the last ends at K transfers' worth
    assert 1.0 < mid[0] < 4.0 and np.all(np.diff(mid) >= 0)


def test_sigma_fit_recovers_the_sigma_that_made_the_curves() -> None:
    truth = 0.8
    curves = {k: fan_completion(k, truth, rounds=400, seed=7) for k in (2, 4, 6)}
    got = fit_sharing_sigma(curves, grid=np.arange(0.0, 2.01, 0.1))
    assert got == pytest.approx(truth, abs=0.2)
    assert fit_sharing_sigma({k: [float(k)] * k for k in (2, 4)}, grid=[0.0, 0.5, 1.0]) == 0.0


def _with_sigma(sigma: float):
    doc = profile_to_doc(make_profile(jitter=0.1))
    doc["link"]["sharing"] = {"down_sigma": sigma, "up_sigma": sigma}
    return parse_profile(doc)


def test_tcp_sharing_with_sigma_zero_is_processor_sharing() -> None:
    p = _with_sigma(0.0)
    for k in (1, 3, 5):
        a = simulate(p, k, "ps-sync", steps=30, sharing="ps", seed=3).samples_per_s
        b = simulate(p, k, "ps-sync", steps=30, sharing="tcp", seed=3).samples_per_s
        assert b == pytest.approx(a, rel=1e-9)


def test_uneven_sharing_lets_early_workers_compute_while_others_download() -> None:
    # Sync PS at K = 6: with uneven sharing some workers start computing early, so their uploads are
    # spread out and the step is shorter than under perfectly even sharing (all start together).
    ps = simulate(_with_sigma(1.0), 6, "ps-sync", steps=60, sharing="ps", seed=1).samples_per_s
    tcp = simulate(_with_sigma(1.0), 6, "ps-sync", steps=60, sharing="tcp", seed=1).samples_per_s
    fcfs = simulate(_with_sigma(1.0), 6, "ps-sync", steps=60, sharing="fcfs", seed=1).samples_per_s
    assert ps < tcp <= fcfs * 1.02
    # The profile's σ makes tcp the ps-sync fine default; without one it stays processor sharing.
    assert predict(_with_sigma(1.0), [6], arch="ps-sync", model="fine", steps=60, seed=1).details[6]["sharing"] == "tcp"
    assert predict(make_profile(jitter=0.1), [6], arch="ps-sync", model="fine", steps=60).details[6]["sharing"] == "ps"


def test_bad_sharing_inputs() -> None:
    doc = profile_to_doc(make_profile())
    doc["link"]["sharing"] = {"down_sigma": 50, "up_sigma": 1}
    with pytest.raises(InputError, match="implausible"):
        parse_profile(doc)
    doc["link"]["sharing"] = "uneven"
    with pytest.raises(InputError, match=r"link\.sharing"):
        parse_profile(doc)
    with pytest.raises(InputError, match="ps, fcfs or tcp"):
        simulate(make_profile(), 2, "ps-sync", sharing="fair")  # type: ignore[arg-type]


def test_coarse_tcp_sits_between_processor_sharing_and_fcfs_and_is_the_default_with_a_sigma() -> None:
    from failslow.predict.coarse import coarse_throughput, ps_sync_step_time

    zero, one = _with_sigma(0.0), _with_sigma(1.0)
    for k in (2, 5):
        assert ps_sync_step_time(zero, k, link="tcp") == pytest.approx(ps_sync_step_time(zero, k, link="ps"))
        t_tcp = ps_sync_step_time(one, k, link="tcp")
        assert ps_sync_step_time(one, k, link="fcfs") < t_tcp < ps_sync_step_time(one, k, link="ps")
        assert coarse_throughput(one, k, "ps-sync") == pytest.approx(k * one.batch_size / t_tcp)
        # Without a measured σ the default stays the hybrid.
        plain = make_profile(jitter=0.1)
        assert coarse_throughput(plain, k, "ps-sync") == pytest.approx(
            k * plain.batch_size / ps_sync_step_time(plain, k, link="hybrid"))
    # Coarse and fine tcp describe the same link: they agree within a few percent.
    coarse = predict(one, [4], arch="ps-sync", model="coarse").throughput[4]
    fine = predict(one, [4], arch="ps-sync", model="fine", steps=200, seed=2).throughput[4]
    assert coarse == pytest.approx(fine, rel=0.06)

"""Coarse models against hand-computed values, against each other, and against the simulation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from failslow.errors import InputError
from failslow.predict import predict
from failslow.predict.coarse import (
    coarse_throughput,
    expected_max,
    expected_order_stats,
    ps_async,
    ps_sync_step_time,
    ring_step_time,
)
from failslow.predict.des import simulate
from failslow.predict.mva import Station, mva_exact, mva_schweitzer, mva_single_class
from failslow.predict.profile import Profile
from tests.predict.profiles import make_profile

# make_profile(): F = 0.12 s, B = 0.12 s, M = 2.1 MB, B_eff = 9.5 MB/s, α = 2 ms, update 5 ms, accumulate 1 ms
F, BW, M_BYTES, ALPHA = 0.12, 9.5e6, 2.1e6, 0.002


def test_ring_closed_form_known_value(profile: Profile) -> None:
    for k in (1, 2, 4, 8):
        comm = 0.0 if k == 1 else 2 * (k - 1) * (M_BYTES / (k * BW) + ALPHA)
        assert ring_step_time(profile, k) == pytest.approx(F + 0.12 + 0.005 + comm)
    assert coarse_throughput(profile, 4, "ring") == pytest.approx(4 * 32 / ring_step_time(profile, 4))


def test_ring_overlap_never_slower_than_no_overlap_and_at_least_compute(profile: Profile) -> None:
    for k in (2, 4, 8):
        ov = ring_step_time(profile, k, overlap=True)
        # The overlap form pays latency per layer bucket, so it can lose when latency dominates; with a
        # latency-free link it must not be slower than all-at-the-end.
        assert ov >= F + 0.12 + 0.005
    free = make_profile(latency=0.0)
    for k in (2, 4, 8):
        assert ring_step_time(free, k, overlap=True) <= ring_step_time(free, k, overlap=False) + 1e-12


def test_ps_sync_known_values(profile: Profile) -> None:
    m = M_BYTES / BW
    c = 0.24 + 0.005  # forward + backward + packing/unpacking messages (the profiled update)
    for k in (1, 2, 5):
        ps = ps_sync_step_time(profile, k, link="ps")
        # The server sums k gradients and applies the mean: k + 1 passes of accumulate.
        assert ps == pytest.approx(k * m + ALPHA + c + k * m + ALPHA + (k + 1) * 0.001)
        fcfs = ps_sync_step_time(profile, k, link="fcfs")
        # Downloads staggered: worker i starts computing at i·m; uploads then queue if m > gap (here gap = m).
        assert fcfs == pytest.approx(max(k * m + m, m + k * m) + c + 2 * ALPHA + 0.001 + 0.001)
        assert ps_sync_step_time(profile, k, link="hybrid") == pytest.approx((ps + fcfs) / 2)
    assert ps_sync_step_time(profile, 1, link="ps") == pytest.approx(ps_sync_step_time(profile, 1, link="fcfs"))


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_ring_closed_form_matches_simulation(profile: Profile, k: int, overlap: bool) -> None:
    sim = simulate(profile, k, "ring", steps=12, warmup=2, overlap=overlap)
    assert sim.samples_per_s == pytest.approx(coarse_throughput(profile, k, "ring", overlap=overlap), rel=1e-9)


@pytest.mark.parametrize("link", ["ps", "fcfs"])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_ps_sync_closed_forms_match_simulation_without_overlap(profile: Profile, k: int, link: str) -> None:
    sim = simulate(profile, k, "ps-sync", steps=12, warmup=2, sharing=link)  # type: ignore[arg-type]
    want = coarse_throughput(profile, k, "ps-sync", link=link)
    assert sim.samples_per_s == pytest.approx(want, rel=1e-9)


def test_async_single_worker_is_the_plain_cycle(profile: Profile) -> None:
    m = M_BYTES / BW
    cycle = 2 * m + 0.24 + 0.005 + 2 * ALPHA + 2 * 0.001
    for link in ("ps", "fcfs"):
        assert coarse_throughput(profile, 1, "ps-async", link=link) == pytest.approx(32 / cycle)
        sim = simulate(profile, 1, "ps-async", steps=12, warmup=2, sharing=link)  # type: ignore[arg-type]
        assert sim.samples_per_s == pytest.approx(32 / cycle)


def test_async_saturates_at_the_link_bound(profile: Profile) -> None:
    m = M_BYTES / BW
    bound = 32 / m
    x = [coarse_throughput(profile, k, "ps-async", link="auto") for k in range(1, 11)]  # exact MVA up to 10
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(x))  # more workers never hurt
    assert x[-1] <= bound * (1 + 1e-9)
    assert x[-1] >= 0.95 * bound
    approx = ps_async(profile, 16)  # Bard–Schweitzer beyond the exact range
    assert not approx.exact
    assert 0.95 * bound <= approx.total_steps_per_s * 32 <= bound * (1 + 1e-9)
    sim = simulate(profile, 8, "ps-async", steps=40, warmup=5, sharing="fcfs")
    assert sim.samples_per_s == pytest.approx(bound, rel=0.01)


def test_async_threshold_picks_fcfs_only_when_busy(profile: Profile) -> None:
    assert ps_async(profile, 1).link_kind == "ps"
    busy = ps_async(profile, 8)
    assert busy.link_kind == "fcfs" and busy.link_utilisation >= 0.8
    assert ps_async(profile, 8, threshold=1.5).link_kind == "ps"
    # The default (hybrid) is the mean of the two disciplines.
    both = [coarse_throughput(profile, 6, "ps-async", link=lk) for lk in ("ps", "fcfs")]
    assert coarse_throughput(profile, 6, "ps-async") == pytest.approx(sum(both) / 2)
    assert both[0] < both[1]  # deterministic FCFS queues less than processor sharing


def test_async_mva_agrees_with_simulation_away_from_saturation() -> None:
    # Links light (fast network), compute dominant and variable (so workers do not move in lockstep, which
    # MVA's product form does not know about): the network is near its delay-only limit.
    p = make_profile(latency=0.0, jitter=0.3).with_bandwidth(200e6)
    for k in (2, 4, 8):
        sim = simulate(p, k, "ps-async", steps=150, warmup=5, sharing="ps", seed=1)
        assert coarse_throughput(p, k, "ps-async") == pytest.approx(sim.samples_per_s, rel=0.05)


def test_mva_exact_equals_single_class_for_identical_workers() -> None:
    for kinds, cv2 in ((("ps", "ps"), (1.0, 1.0)), (("fcfs", "ps"), (0.0, 1.0)), (("fcfs", "fcfs"), (1.0, 0.5))):
        for k in (1, 3, 6):
            st = [Station("a", np.full(k, 0.1), kinds[0], cv2[0]), Station("b", np.full(k, 0.05), kinds[1], cv2[1])]
            exact = mva_exact(st, np.full(k, 0.3)).throughput.sum()
            single = mva_single_class(np.array([0.1, 0.05]), 0.3, k, list(kinds), np.array(cv2))[-1]
            assert exact == pytest.approx(single, rel=1e-12)


def test_mva_textbook_values() -> None:
    # One PS queue D = 1 and think time Z = 1: X(1) = 1/2, X(2) = 2/(1 + (1+1/2) + 1) ... by recursion.
    x = mva_single_class(np.array([1.0]), 1.0, 3)
    assert x[0] == pytest.approx(0.5)
    q1 = 0.5 * 1.0
    r2 = 1.0 * (1 + q1)
    assert x[1] == pytest.approx(2 / (r2 + 1.0))
    q2 = x[1] * r2
    assert x[2] == pytest.approx(3 / (1.0 * (1 + q2) + 1.0))
    # Large populations approach the bottleneck bound 1/D_max.
    assert mva_single_class(np.array([0.2, 0.1]), 0.5, 200)[-1] == pytest.approx(5.0, rel=1e-3)


def test_mva_schweitzer_close_to_exact_including_heterogeneous_classes() -> None:
    rng = np.random.default_rng(3)
    for k in (2, 5, 9):
        st = [Station("down", rng.uniform(0.05, 0.1, k)), Station("up", rng.uniform(0.05, 0.1, k)),
              Station("cpu", np.full(k, 0.01), "fcfs", 0.0)]
        delay = rng.uniform(0.2, 0.6, k)
        ex = mva_exact(st, delay)
        ap = mva_schweitzer(st, delay)
        assert ap.throughput.sum() == pytest.approx(ex.throughput.sum(), rel=0.06)
        # Slower workers (longer delay) get fewer cycles in both solutions.
        order = np.argsort(delay)
        assert ex.throughput[order[0]] > ex.throughput[order[-1]]
        assert ap.throughput[order[0]] > ap.throughput[order[-1]]


def test_mva_rejects_bad_input() -> None:
    with pytest.raises(InputError):
        mva_exact([Station("a", np.ones(3))], np.ones(2))
    with pytest.raises(InputError):
        mva_exact([Station("a", -np.ones(2))], np.ones(2))
    with pytest.raises(InputError):
        mva_exact([Station("a", np.ones(17))], np.ones(17))
    with pytest.raises(InputError):
        mva_single_class(np.ones(1), 0.0, 0)


def test_heterogeneous_workers_slow_the_barrier_and_their_own_async_share(profile: Profile) -> None:
    k = 4
    base = ring_step_time(profile, k)
    slow = ring_step_time(profile, k, slowdown=[2.0, 1.0, 1.0, 1.0])
    assert slow == pytest.approx(base + (F + 0.12 + 0.005))
    pred = ps_async(profile, k, slowdown=[3.0, 1.0, 1.0, 1.0])
    assert pred.steps_per_s[0] < pred.steps_per_s[1]
    assert pred.total_steps_per_s < ps_async(profile, k).total_steps_per_s
    sim = simulate(profile, k, "ring", steps=10, warmup=2, slowdown=[2.0, 1.0, 1.0, 1.0])
    assert sim.samples_per_s == pytest.approx(k * 32 / slow)


def test_simulation_is_seeded_and_barrier_pays_for_variance() -> None:
    p = make_profile(jitter=0.3, latency=0.0).with_bandwidth(1e12)
    a = simulate(p, 8, "ring", steps=40, seed=7)
    b = simulate(p, 8, "ring", steps=40, seed=7)
    assert a.samples_per_s == b.samples_per_s
    # With variable steps, 8 workers waiting for the slowest run below 8× one worker's mean rate.
    one = simulate(p, 1, "ring", steps=400, seed=7)
    assert a.samples_per_s < 0.97 * 8 * one.samples_per_s


def test_predict_entry_point_and_errors(profile: Profile) -> None:
    pred = predict(profile, [1, 2, 4], arch="ps-sync", model="fine", steps=10, warmup=1)
    assert set(pred.throughput) == {1, 2, 4}
    assert pred.to_json()["throughput"]["2"] == pytest.approx(pred.throughput[2])
    doubled = predict(profile, [4], bandwidth=2 * profile.bandwidth_bytes_per_s)
    assert doubled.throughput[4] > predict(profile, [4]).throughput[4]
    for bad in ({"arch": "mesh"}, {"model": "exact"}, {"link": "carrier-pigeon", "model": "fine"}):
        with pytest.raises(InputError):
            predict(profile, [2], **bad)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        predict(profile, [0])
    with pytest.raises(InputError):
        predict(profile, [])
    with pytest.raises(InputError):
        predict(profile, [2], slowdown=[0.0])


def test_expected_max_and_order_statistics_match_monte_carlo() -> None:
    rng = np.random.default_rng(0)
    x = rng.lognormal(0.0, 0.3, 40)
    assert expected_max(x, np.ones(1)) == pytest.approx(x.mean())
    draws = rng.choice(x, (200_000, 8))
    assert expected_max(x, np.ones(8)) == pytest.approx(draws.max(axis=1).mean(), rel=0.01)
    np.testing.assert_allclose(expected_order_stats(x, 8), np.sort(draws, axis=1).mean(axis=0), rtol=0.01)
    assert expected_order_stats(x, 8).mean() == pytest.approx(x.mean())
    f = np.array([1.0, 1.0, 2.0])
    assert expected_max(x, f) == pytest.approx((rng.choice(x, (200_000, 3)) * f).max(axis=1).mean(), rel=0.01)


@pytest.mark.parametrize("arch", ["ring", "ps-sync"])
def test_barrier_closed_forms_track_the_simulation_with_variable_steps(arch: str) -> None:
    # With step-to-step variance the closed forms use the expected max / order statistics of compute;
    # the simulation draws steps and waits at the barrier for real. They must agree closely.
    p = make_profile(jitter=0.25, latency=0.0)
    for k in (2, 4, 8):
        sim = simulate(p, k, arch, steps=400, warmup=5, sharing="ps", seed=3)  # type: ignore[arg-type]
        link = None if arch == "ring" else "ps"
        assert coarse_throughput(p, k, arch, link=link) == pytest.approx(sim.samples_per_s, rel=0.03)  # type: ignore[arg-type]

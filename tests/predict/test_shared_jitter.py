"""The ring barrier's max over K with jitter shared by all workers (step_w = shared + independent_w)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from failslow.errors import InputError
from failslow.predict import parse_profile, predict
from failslow.predict.coarse import expected_max, ring_step_time
from failslow.predict.des import simulate
from failslow.predict.profile import profile_to_doc
from testbed.dparch.measure import merge_profiles
from testbed.dparch.run import profile_doc
from tests.predict.profiles import make_profile, raw_profile_job

SAMPLES = np.random.default_rng(3).lognormal(np.log(0.09), 0.2, size=200)


def test_no_shared_jitter_is_the_independent_max() -> None:
    f = np.ones(8)
    assert expected_max(SAMPLES, f, 0.0) == expected_max(SAMPLES, f)
    # Independent: the max of 8 draws is well above the mean (what the ring model paid before).
    assert expected_max(SAMPLES, f) > SAMPLES.mean() * 1.2


def test_fully_shared_jitter_makes_the_max_the_mean() -> None:
    assert expected_max(SAMPLES, np.ones(8), 1.0) == pytest.approx(SAMPLES.mean(), rel=1e-12)
    # A slowed worker still sets the pace when nothing is independent.
    assert expected_max(SAMPLES, np.array([1.0, 1.5, 1.0]), 1.0) == pytest.approx(1.5 * SAMPLES.mean(), rel=1e-12)


@pytest.mark.parametrize("rho", [0.3, 0.7])
def test_shared_max_matches_a_monte_carlo_of_the_additive_model(rho: float) -> None:
    # step_w = μ + √ρ (S − μ) + √(1−ρ) (Y_w − μ), S and Y_w drawn from the samples: the common S moves
    # every worker alike, so the expected max is that of the independent parts.
    rng = np.random.default_rng(11)
    k, n = 8, 200_000
    mu = SAMPLES.mean()
    s = rng.choice(SAMPLES, size=(n, 1))
    y = rng.choice(SAMPLES, size=(n, k))
    x = mu + np.sqrt(rho) * (s - mu) + np.sqrt(1 - rho) * (y - mu)
    mc = float(x.max(axis=1).mean())
    got = expected_max(SAMPLES, np.ones(k), rho)
    assert got == pytest.approx(mc, rel=2e-3)
    # ... and the old independent max over-states it (the under-prediction at K = 7, 8).
    assert expected_max(SAMPLES, np.ones(k)) > mc * (1 + 0.2 * (1 - np.sqrt(1 - rho)))


def test_shared_fraction_outside_0_1_is_rejected() -> None:
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(InputError, match="shared jitter"):
            expected_max(SAMPLES, np.ones(2), bad)


def _ring_profile(rho: float, seed: int = 0, n: int = 4000):
    """A profile whose ring samples and peer steps share a fraction rho of their variance."""
    rng = np.random.default_rng(seed)
    p = make_profile(jitter=0.1)
    base = p.forward_s.sum() + p.backward_s.sum()
    shared = rng.standard_normal(n)
    mine = base * (1 + 0.15 * (np.sqrt(rho) * shared + np.sqrt(1 - rho) * rng.standard_normal(n)))
    peer = base * (1 + 0.15 * (np.sqrt(rho) * shared + np.sqrt(1 - rho) * rng.standard_normal(n)))
    share = np.concatenate([p.forward_s, p.backward_s]) / base
    rows = np.clip(mine, 0.01, None)[:, None] * share[None, :]
    nl = p.n_layers
    return replace(p, ring_step_forward_s=rows[:, :nl], ring_step_backward_s=rows[:, nl:],
                   ring_peer_step_s=np.clip(peer, 0.01, None))


@pytest.mark.parametrize("rho", [0.0, 0.4, 0.8])
def test_profile_estimates_the_shared_fraction_from_the_paired_ring_steps(rho: float) -> None:
    p = _ring_profile(rho)
    assert p.ring_shared_jitter == pytest.approx(rho, abs=0.05)
    assert p.after_allreduce().shared_jitter == pytest.approx(p.ring_shared_jitter)
    # Without the peer's steps nothing is known to be shared: the independent max, as before.
    assert replace(p, ring_peer_step_s=np.zeros(0)).after_allreduce().shared_jitter == 0.0
    # Anti-correlated noise is not "negative sharing".
    anti = replace(p, ring_peer_step_s=2 * p.ring_peer_step_s.mean() - p.ring_peer_step_s)
    assert anti.ring_shared_jitter == (0.0 if rho > 0 else anti.ring_shared_jitter)
    assert 0.0 <= anti.ring_shared_jitter <= 0.05


def test_ring_prediction_lies_between_the_mean_and_the_independent_max() -> None:
    p = _ring_profile(0.6)
    pk = p.after_allreduce()
    indep = ring_step_time(replace(pk, shared_jitter=0.0), 8)
    shared = ring_step_time(pk, 8)
    full = ring_step_time(replace(pk, shared_jitter=1.0), 8)
    assert full < shared < indep
    comm = 2 * 7 * (pk.model_bytes / (8 * pk.ring_bandwidth) + pk.ring_hop_latency)
    sf, sb = pk.step_samples()
    assert full == pytest.approx(float((sf.sum(axis=1) + sb.sum(axis=1)).mean()) + pk.update_s + comm, rel=1e-9)
    # predict() uses it for K > 1 (a lone worker has no barrier).
    thr = predict(p, [1, 8], arch="ring", model="coarse").throughput
    assert thr[8] == pytest.approx(8 * pk.batch_size / shared, rel=1e-9)


def test_simulation_carries_the_shared_jitter_and_agrees_with_the_closed_form() -> None:
    pk = _ring_profile(0.6, n=400).after_allreduce()
    for rho in (0.0, 0.6):
        q = replace(pk, shared_jitter=rho)
        sim = simulate(q, 8, "ring", steps=400, seed=1).samples_per_s
        closed = 8 * q.batch_size / ring_step_time(q, 8)
        assert sim == pytest.approx(closed, rel=0.03)
    assert (simulate(replace(pk, shared_jitter=0.6), 8, "ring", steps=400, seed=1).samples_per_s
            > simulate(replace(pk, shared_jitter=0.0), 8, "ring", steps=400, seed=1).samples_per_s * 1.02)


def test_peer_steps_parse_round_trip_and_must_be_paired() -> None:
    p = _ring_profile(0.5, n=50)
    doc = profile_to_doc(p)
    q = parse_profile(doc)
    np.testing.assert_allclose(q.ring_peer_step_s, p.ring_peer_step_s)
    assert q.ring_shared_jitter == pytest.approx(p.ring_shared_jitter)
    doc["steps"]["ring_peer_step_s"] = doc["steps"]["ring_peer_step_s"][:-1]
    with pytest.raises(InputError, match="paired step by step"):
        parse_profile(doc)
    doc["steps"]["ring_peer_step_s"] = [[0.1]] * 50
    with pytest.raises(InputError, match="ring_peer_step_s"):
        parse_profile(doc)


def test_profiling_job_keeps_the_peers_ring_steps_and_merging_scales_them_with_the_run() -> None:
    job = raw_profile_job(0.1)
    job["ranks"]["1"] = {"ring_peer_step_wall_s": [0.11, 0.13, 0.12]}
    job["ranks"]["0"]["ring_step_wall_s"] = [0.12, 0.14, 0.125]
    doc = profile_doc(job)
    np.testing.assert_allclose(doc["steps"]["ring_peer_step_s"], [0.108, 0.128, 0.118])  # less the update
    p = parse_profile(doc)
    assert p.ring_shared_jitter > 0.8
    slow = profile_doc(job)
    slow["steps"]["ring_forward_s"] = [[x * 2 for x in r] for r in slow["steps"]["ring_forward_s"]]
    slow["steps"]["ring_backward_s"] = [[x * 2 for x in r] for r in slow["steps"]["ring_backward_s"]]
    slow["steps"]["ring_peer_step_s"] = [x * 2 for x in slow["steps"]["ring_peer_step_s"]]
    merged = merge_profiles([doc, slow])
    # Each run is scaled to the pooled level, its peer's steps alike: the pairs stay paired.
    peer = np.asarray(merged["steps"]["ring_peer_step_s"])
    assert peer.shape == (6,)
    np.testing.assert_allclose(peer[3:], peer[:3], rtol=1e-9)
    # A profiling run without the peer's steps (older trainer): merged without them.
    old = profile_doc(raw_profile_job(0.1))
    assert "ring_peer_step_s" not in old["steps"]
    assert "ring_peer_step_s" not in merge_profiles([doc, old])["steps"]

"""The ring's collective with compute-staggered entries (issue #7, session 4) and the per-step run record."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from failslow.errors import InputError
from failslow.predict import parse_profile, predict
from failslow.predict.coarse import ring_step_time
from failslow.predict.profile import Profile, profile_to_doc
from testbed.dparch.measure import finish_profile, job_detail, net_ring_table, ring_net_fit
from tests.predict.profiles import job_doc, make_profile

M = 1_330_000


def _ring_profile(**kw: float | None) -> Profile:
    p = make_profile(jitter=0.1)
    return replace(p, ring_step_forward_s=p.step_forward_s, ring_step_backward_s=p.step_backward_s,
                   ring_efficiency=0.9, ring_latency_s=0.003, **kw)


def test_staggered_rounds_are_timed_from_the_last_entry_and_their_skew_kept() -> None:
    # Round 1: member 1 computes 30 ms longer and enters last; the collective then takes 40 ms.
    job = job_doc("net-ring", 2, {
        "0": {"allreduce_s": [0.05], "start": [1.0], "end": [1.05],
              "stagger_start": [2.00, 3.00], "stagger_end": [2.07, 3.06]},
        "1": {"allreduce_s": [0.05], "start": [1.0], "end": [1.05],
              "stagger_start": [2.03, 3.01], "stagger_end": [2.07, 3.06]},
    })
    out = net_ring_table(job)
    assert out["stagger_pure_s"] == pytest.approx([0.04, 0.05])
    assert out["stagger_pure_median_s"] == pytest.approx(0.045)
    assert out["stagger_entry_skew_s"] == pytest.approx([0.015, 0.005])
    # Without staggered rounds (older sweeps) the table is as before.
    del job["ranks"]["0"]["stagger_start"], job["ranks"]["1"]["stagger_start"]
    assert "stagger_pure_median_s" not in net_ring_table(job)


def test_staggered_hop_is_fitted_over_k_into_the_profile() -> None:
    b, alpha, b_s, alpha_s = 9e6, 0.0025, 10e6, 0.0012  # make_profile's links: 10 MB/s nominal
    table = {str(k): {"bytes": M, "pure_median_s": 2 * (k - 1) * (M / (k * b) + alpha),
                      "stagger_pure_median_s": 2 * (k - 1) * (M / (k * b_s) + alpha_s)} for k in range(2, 9)}
    fit = ring_net_fit(table, 10e6, key="stagger_pure_median_s")
    assert fit is not None
    assert fit["efficiency"] == pytest.approx(1.0)
    assert fit["latency_s"] == pytest.approx(alpha_s)
    doc = {"profiles": [profile_to_doc(make_profile(jitter=0.1))], "net": {"ring": table}}
    doc["profiles"][0]["link"]["allreduce"] = {"efficiency": 0.9, "latency_s": 0.003}
    finish_profile(doc)
    p = parse_profile(doc["profile"])
    assert (p.ring_efficiency, p.ring_latency_s) == (pytest.approx(0.9), pytest.approx(alpha))
    assert p.ring_stagger_efficiency == pytest.approx(1.0)
    assert p.ring_stagger_latency_s == pytest.approx(alpha_s)
    # A sweep without staggered rounds gets no staggered hop.
    for v in table.values():
        del v["stagger_pure_median_s"]
    doc2 = {"profiles": [profile_to_doc(make_profile(jitter=0.1))], "net": {"ring": table}}
    doc2["profiles"][0]["link"]["allreduce"] = {"efficiency": 0.9, "latency_s": 0.003}
    finish_profile(doc2)
    assert "allreduce_staggered" not in doc2["profile"]["link"]


def test_staggered_hop_round_trips_and_bad_values_are_input_errors() -> None:
    p = _ring_profile(ring_stagger_efficiency=1.0, ring_stagger_latency_s=0.001)
    q = parse_profile(profile_to_doc(p))
    assert (q.ring_stagger_efficiency, q.ring_stagger_latency_s) == (1.0, 0.001)
    doc = profile_to_doc(p)
    doc["link"]["allreduce_staggered"] = {"efficiency": 7.0, "latency_s": 0.001}
    with pytest.raises(InputError, match="staggered"):
        parse_profile(doc)
    doc["link"]["allreduce_staggered"] = [1.0]
    with pytest.raises(InputError, match="allreduce_staggered"):
        parse_profile(doc)


def test_staggered_hop_is_a_what_if_and_predict_keeps_the_simultaneous_one() -> None:
    # The session-4 holds did not show a shorter collective with staggered entries, so `predict` does
    # not use the measurement: a profile with it predicts exactly as one without.
    plain = _ring_profile()
    stag = _ring_profile(ring_stagger_efficiency=1.0, ring_stagger_latency_s=0.001)
    for model in ("coarse", "fine"):
        a = predict(plain, list(range(1, 9)), arch="ring", model=model, steps=60)
        b = predict(stag, list(range(1, 9)), arch="ring", model=model, steps=60)
        assert a.throughput == b.throughput
    # The what-if swaps the hop in: K = 1 has no collective, K > 1 pays 2(K−1)(M/(K·B_stag) + α_stag).
    what_if = stag.with_staggered_hop()
    assert plain.with_staggered_hop() is plain
    for k in (2, 4, 8):
        t_plain = ring_step_time(plain.after_allreduce(), k)
        t_stag = ring_step_time(what_if.after_allreduce(), k)
        saved = 2 * (k - 1) * (M_of(plain) / (k * 10e6 * 0.9) + 0.003 - M_of(plain) / (k * 10e6) - 0.001)
        assert t_plain - t_stag == pytest.approx(saved, rel=1e-9)
    assert ring_step_time(what_if.after_allreduce(), 1) == ring_step_time(plain.after_allreduce(), 1)
    # Deterministic steps: T = T_F + T_B + u + 2(K−1)(M/(K·B) + α), whichever hop is swapped in.
    det = replace(make_profile(), ring_stagger_efficiency=1.0, ring_stagger_latency_s=0.001).with_staggered_hop()
    k = 4
    want = det.forward_s.sum() + det.backward_s.sum() + det.update_s + 2 * (k - 1) * (M_of(det) / (k * 10e6) + 0.001)
    assert ring_step_time(det.after_allreduce(), k) == pytest.approx(want, rel=1e-12)


def test_run_detail_keeps_every_steps_phases_on_the_shared_clock() -> None:
    job = {"ranks": {"0": {"phases_s": [(0.1, 0.05, 0.001), (0.11, 0.04, 0.002)], "step_end_s": [5.0, 5.2],
                           "compute_cpu_s": [0.01, 0.02]}}}
    d = job_detail(job)["0"]
    assert d["steps_s"] == [[5.0, 0.1, 0.05, 0.001], [5.2, 0.11, 0.04, 0.002]]
    ends = np.array([s[0] for s in d["steps_s"]])
    assert np.all(np.diff(ends) > 0)


def M_of(p: Profile) -> float:
    return p.model_bytes

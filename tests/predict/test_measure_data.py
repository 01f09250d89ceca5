"""The sweep's data handling without running it: merged profiles, combined holds, microbenchmark tables."""

from __future__ import annotations

import numpy as np
import pytest

from failslow.predict import parse_profile, predict
from failslow.predict.profile import profile_to_doc
from testbed.dparch.measure import (
    combine,
    host_share,
    merge_profiles,
    net_ps_table,
    net_ring_table,
    pool_net_ring,
    proc_stat,
    ring_net_fit,
)
from testbed.dparch.run import RunError, profile_doc, whole_steps
from tests.predict.profiles import job_doc, make_profile, raw_profile_job


def _prof_doc(scale: float) -> dict:
    p = make_profile(jitter=0.1)
    doc = profile_to_doc(p)
    doc["steps"]["forward_s"] = (p.step_forward_s * scale).tolist()
    doc["steps"]["idle_forward_s"] = (p.step_forward_s * scale * 0.8).tolist()
    doc["steps"]["idle_backward_s"] = p.step_backward_s.tolist()
    doc["link"]["allreduce"] = {"efficiency": 0.9, "latency_s": 0.001}
    return doc


def test_merge_takes_medians_so_one_slow_profiling_run_does_not_move_the_profile() -> None:
    merged = merge_profiles([_prof_doc(1.0), _prof_doc(1.0), _prof_doc(5.0)])
    one = _prof_doc(1.0)
    for got, want in zip(merged["layers"], one["layers"], strict=True):
        assert got["forward_s"] == pytest.approx(np.median([r[one["layers"].index(want)] for r in
                                                            one["steps"]["forward_s"]]), rel=0.35)
    assert len(merged["steps"]["forward_s"]) == 3 * 40
    assert len(merged["steps"]["idle_forward_s"]) == 3 * 40
    p = parse_profile(merged)
    assert p.after_idle().forward_s.sum() < p.forward_s.sum()


def test_predict_uses_after_idle_steps_except_for_a_lone_ring_worker() -> None:
    p = parse_profile(_prof_doc(1.0))
    slow = parse_profile({**_prof_doc(1.0), "steps": {k: v for k, v in _prof_doc(1.0)["steps"].items()
                                                       if not k.startswith("idle")}})
    ring = predict(p, [1, 2], arch="ring")
    plain = predict(slow, [1, 2], arch="ring")
    assert ring.throughput[1] == pytest.approx(plain.throughput[1])  # back to back at K = 1
    assert ring.throughput[2] > plain.throughput[2]  # faster after-idle steps at K = 2
    assert predict(p, [1], arch="ps-sync").throughput[1] > predict(slow, [1], arch="ps-sync").throughput[1]


def test_combine_keeps_each_holds_profile_for_its_architectures() -> None:
    a = {"spec": {"rate": "200mbit"}, "repeats": 4, "profile": _prof_doc(1.0), "profiles": [_prof_doc(1.0)],
         "runs": [{"arch": "ring", "workers": 1, "samples_per_s": 10.0}],
         "net": {"ring": {"2": {"median_s": 0.1}}}}
    b = {"spec": {"rate": "200mbit"}, "repeats": 3, "profile": _prof_doc(2.0), "profiles": [_prof_doc(2.0)] * 2,
         "runs": [{"arch": "ps-sync", "workers": 1, "samples_per_s": 5.0},
                  {"arch": "ps-async", "workers": 1, "samples_per_s": 6.0}],
         "net": {"ps": {"1": {"fanout_median_s": [0.05]}}}}
    doc = combine([a, b])
    assert doc["repeats"] == 4 and len(doc["runs"]) == 3
    assert doc["profiles_by_arch"]["ring"] is a["profile"]
    assert doc["profiles_by_arch"]["ps-sync"] is b["profile"] and doc["profiles_by_arch"]["ps-async"] is b["profile"]
    assert set(doc["net"]) == {"ring", "ps"}
    assert [p["archs"] for p in doc["parts"]] == [["ring"], ["ps-async", "ps-sync"]]
    with pytest.raises(ValueError):
        combine([])


def test_network_microbenchmark_tables() -> None:
    ring = net_ring_table(job_doc("net-ring", 2, {"0": {"allreduce_s": [0.1, 0.3, 0.2]},
                                          "1": {"allreduce_s": [0.15, 0.1, 0.2]}}))
    assert ring["allreduce_s"] == [0.15, 0.3, 0.2]  # the slowest member of each round
    assert ring["median_s"] == pytest.approx(0.2)
    assert ring["bytes"] == 4 * (4 * 4 + 4 + 4 * 2 + 2)
    ps = net_ps_table(job_doc("net-ps", 2, {
        "0": {"fanout_start": [10.0, 20.0], "fanin_done": [[31.0, 30.5], [41.0, 41.5]]},
        "1": {"fanout_done": [10.5, 20.4], "fanin_start": [30.0, 40.0]},
        "2": {"fanout_done": [10.2, 20.6], "fanin_start": [30.1, 40.1]},
    }))
    assert ps["fanout_s"] == [pytest.approx([0.2, 0.5]), pytest.approx([0.4, 0.6])]
    assert ps["fanin_s"] == [pytest.approx([0.4, 0.9]), pytest.approx([0.9, 1.4])]
    assert ps["fanout_median_s"] == pytest.approx([0.3, 0.55])


def test_ring_microbenchmark_takes_out_entry_skew_and_fits_one_hop() -> None:
    # Member 1 enters 30 ms late; the collective itself then takes 50 ms for both.
    job = job_doc("net-ring", 2, {"0": {"allreduce_s": [0.08], "start": [1.00], "end": [1.08]},
                               "1": {"allreduce_s": [0.05], "start": [1.03], "end": [1.08]}})
    assert net_ring_table(job)["pure_median_s"] == pytest.approx(0.05)
    m, b, alpha = 1_330_000, 20e6, 0.002
    table = {str(k): {"bytes": m, "pure_median_s": 2 * (k - 1) * (m / (k * b) + alpha)} for k in range(2, 9)}
    fit = ring_net_fit(table, 25e6)
    assert fit is not None
    assert fit["efficiency"] == pytest.approx(0.8)
    assert fit["latency_s"] == pytest.approx(alpha)
    assert ring_net_fit({"2": table["2"]}, 25e6) is None


def test_ring_microbenchmark_slices_pool_their_rounds() -> None:
    # Two slices of one K, the second with a slow round: medians over all rounds, not of the slices.
    first = net_ring_table(job_doc("net-ring", 2, {"0": {"allreduce_s": [0.05, 0.06], "start": [1.0, 2.0], "end": [1.05, 2.06]},
                                           "1": {"allreduce_s": [0.05, 0.06], "start": [1.0, 2.0], "end": [1.05, 2.06]}}))
    second = net_ring_table(job_doc("net-ring", 2, {"0": {"allreduce_s": [0.07, 0.30], "start": [3.0, 4.0], "end": [3.07, 4.3]},
                                            "1": {"allreduce_s": [0.07, 0.30], "start": [3.0, 4.0], "end": [3.07, 4.3]}}))
    one = pool_net_ring(None, first)
    assert one["slices"] == 1 and one["pure_median_s"] == pytest.approx(0.055)
    both = pool_net_ring(one, second)
    assert both["slices"] == 2
    assert both["pure_s"] == pytest.approx([0.05, 0.06, 0.07, 0.30])
    assert both["pure_median_s"] == pytest.approx(0.065) and both["median_s"] == pytest.approx(0.065)
    assert first["pure_s"] == pytest.approx([0.05, 0.06])  # the slices are left as they were


def test_whole_steps_put_every_stall_of_a_step_into_its_layers() -> None:
    fwd = [[0.01, 0.02], [0.01, 0.01]]
    bwd = [[0.02, 0.05], [0.02, 0.02]]
    # Step walls 0.12 and 0.07 s with a 0.01 s update: the layers must add up to 0.11 and 0.06.
    f, b = whole_steps(fwd, bwd, [0.12, 0.07], 0.01)
    assert sum(f[0]) + sum(b[0]) == pytest.approx(0.11)
    assert sum(f[1]) + sum(b[1]) == pytest.approx(0.06)
    assert f[0][1] / b[0][1] == pytest.approx(0.02 / 0.05)  # proportions kept
    assert whole_steps(fwd, bwd, None) == (fwd, bwd)  # older runs: unchanged
    with pytest.raises(RunError, match="differ in length"):
        whole_steps(fwd, bwd, [0.1])


def test_profile_doc_steps_add_up_to_the_measured_steps_and_ps_workers_use_after_transfer_ones() -> None:
    doc = profile_doc(raw_profile_job(0.1))
    p = parse_profile(doc)
    upd = 0.002
    # Back to back: samples + update = the loop's measured step.
    np.testing.assert_allclose(p.step_forward_s.sum(axis=1) + p.step_backward_s.sum(axis=1) + upd, 0.1)
    np.testing.assert_allclose(p.after_idle().step_forward_s.sum(axis=1)
                               + p.after_idle().step_backward_s.sum(axis=1) + upd, 0.09)
    t = p.after_transfer()
    np.testing.assert_allclose(t.step_forward_s.sum(axis=1) + t.step_backward_s.sum(axis=1) + upd, 0.11)
    r = p.after_allreduce()
    np.testing.assert_allclose(r.step_forward_s.sum(axis=1) + r.step_backward_s.sum(axis=1) + upd, 0.12)
    assert doc["meta"]["step_layer_sum_s"] == pytest.approx(0.08)
    # Round trip keeps the after-transfer samples; merging keeps them too.
    q = parse_profile(profile_to_doc(p))
    np.testing.assert_allclose(q.net_step_forward_s, p.net_step_forward_s)
    merged = parse_profile(merge_profiles([doc, profile_doc(raw_profile_job(0.1))]))
    assert merged.net_step_forward_s.shape == (6, 2) and merged.ring_step_forward_s.shape == (6, 2)
    np.testing.assert_allclose(q.ring_step_forward_s, p.ring_step_forward_s)
    # A lone ring worker runs back to back, the ring's K > 1 after all-reduces, a PS worker after a transfer.
    ring = predict(p, [1, 2], arch="ring", model="coarse").throughput
    assert ring[1] == pytest.approx(512 / 0.1, rel=1e-9)
    comm = 2 * (p.model_bytes / (2 * p.ring_bandwidth) + p.ring_hop_latency)
    assert ring[2] == pytest.approx(2 * 512 / (0.12 + comm), rel=1e-9)  # identical steps: max = the step
    ps1 = predict(p, [1], arch="ps-sync", model="coarse").throughput[1]
    idle_only = parse_profile({**doc, "steps": {k: v for k, v in doc["steps"].items() if not k.startswith("net")}})
    assert ps1 < predict(idle_only, [1], arch="ps-sync", model="coarse").throughput[1]


def test_host_share_reads_busy_idle_and_steal() -> None:
    before = [100, 0, 50, 800, 50, 0, 0, 0]
    after = [300, 0, 100, 1400, 50, 0, 0, 150]  # +250 busy, +600 idle, +150 steal of 1000
    assert host_share(before, after) == pytest.approx({"busy": 0.25, "idle": 0.6, "steal": 0.15})
    now = proc_stat()
    assert len(now) == 8 and all(x >= 0 for x in now)

"""Real testbed jobs: training, report, trace, run-time faults and their effect, control knobs.

Every job here starts real rank processes (torch.distributed over gloo) and, as root, real network
namespaces, tc qdiscs and cgroups. They are small and short; nothing is mocked.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from testbed.adapter import FileControlAdapter, TestbedAdapter, TrainingAdapter
from testbed.config import ModelConfig
from testbed.launcher import JobConfig, Testbed
from testbed.netns import show_qdisc
from testbed.state import leftovers
from tests.integration.polling import run_until

pytestmark = [pytest.mark.integration, pytest.mark.testbed]

ROOT = os.geteuid() == 0


def _nothing_left(prefix: str) -> None:
    assert leftovers(prefix) == {"namespaces": [], "cgroups": [], "processes": []}


def test_run_cli_report_and_trace(failslow_cmd: list[str], tmp_path: Path) -> None:
    report, trace = tmp_path / "report.json", tmp_path / "trace-job.parquet"
    p = subprocess.run([*failslow_cmd, "testbed", "run", "--dp", "2", "--pp", "2", "--iterations", "8",
                        "--micro-batches", "3", "--report", str(report), "--trace", str(trace), "--job", "t1"],
                       capture_output=True, text=True, timeout=240, check=False)
    assert p.returncode == 0, p.stderr
    rep = json.loads(report.read_text())
    assert rep["namespaces"] is ROOT and rep["layout"]["world_size"] == 4 and rep["layout"]["num_nodes"] == 4
    assert sorted(rep["iteration_time_s"]) == ["0", "1", "2", "3"]
    for r in "0123":
        assert len(rep["iteration_time_s"][r]) == 8 and min(rep["iteration_time_s"][r]) > 0
        ends = rep["iteration_end_unix_s"][r]
        assert all(b > a for a, b in itertools.pairwise(ends))
        assert rep["iterations"][r] == list(range(8))
    # real training: the loss falls well below ln(256) = 5.55 of a uniform guess
    assert len(rep["losses"]) == 8 and rep["losses"][0] > 5.0 and rep["losses"][-1] < rep["losses"][0] - 0.8
    assert rep["faults"] == []
    # trace in the what-if schema, Megatron op names, one compute op per micro-batch and direction
    t = pq.read_table(trace).to_pydict()
    assert list(t) == ["dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id", "mc",
                       "gmc", "mb_id"]
    ops = set(t["optype"])
    assert {"forward-compute", "backward-compute", "forward-send", "forward-recv", "backward-send",
            "backward-recv", "grads-all-reduce", "optimizer"} <= ops
    n = len(t["rank"])
    for rank in range(4):
        stage = rank // 2  # rank = dp + DP * pp
        rows = [i for i in range(n) if t["rank"][i] == rank]
        assert {t["stage"][i] for i in rows} == {stage} and {t["dp_rank"][i] for i in rows} == {rank % 2}
        for step in range(8):
            fwd = sorted(t["mb_id"][i] for i in rows if t["step"][i] == step and t["optype"][i] == "forward-compute")
            assert fwd == [0, 1, 2]
            sends = [i for i in rows if t["step"][i] == step and t["optype"][i] == "forward-send"]
            assert len(sends) == (3 if stage == 0 else 0)
    assert min(t["duration"]) >= 0 and min(t["start_ts"]) >= 0
    meta = yaml.safe_load((tmp_path / "meta-job.yaml").read_text())
    assert meta == {"trial_name": "job", "run_id": 0, "dp_size": 2, "dsp_size": 1, "pp_size": 2, "tp_size": 1,
                    "vpp_size": 1, "world_size": 4}
    _nothing_left(rep["prefix"])
    assert not Path(rep["run_dir"]).exists()  # the temporary run directory goes too


def _slowest(rep: dict[str, Any]) -> list[tuple[float, float, float]]:
    """(start, end, duration) of each iteration, taking the slowest rank."""
    ranks = list(rep["iteration_time_s"])
    out = []
    for i in range(min(len(rep["iteration_time_s"][r]) for r in ranks)):
        end = max(rep["iteration_end_unix_s"][r][i] for r in ranks)
        start = min(rep["iteration_end_unix_s"][r][i] - rep["iteration_time_s"][r][i] for r in ranks)
        out.append((start, end, max(rep["iteration_time_s"][r][i] for r in ranks)))
    return out


def test_cpu_and_link_faults_at_run_time(tmp_path: Path) -> None:
    """Python API: inject a CPU fault, then a link fault, mid-run; both really act and slow their iterations."""
    # a higher job CPU weight than the default 2, as in the benchmark: when neighbours saturate the
    # machine a starved rank gets little more than the quota anyway, and the CPU fault shows nothing
    cfg = JobConfig(dp=2, pp=2, iterations=18, micro_batches=4, cpu_weight=8.0, cpu_period_us=10_000)
    observed: dict[str, Any] = {}
    with Testbed(cfg, run_dir=tmp_path / "run") as tb:
        tb.start()
        run_until(tb, 5)
        # harsher than the benchmark's 0.3 so the effect shows even when neighbours load the machine
        cpu = tb.inject("cpu:rank=3,quota=0.1")
        cg = tb.rank_cgroup(3)
        assert cg is not None
        observed["quota_on"], observed["pids"] = cg.quota(), cg.pids()
        observed["period"] = cg.period_us()  # uncapped: the fault's quota counts in the job's period
        run_until(tb, tb.completed() + 3)
        tb.remove(cpu)
        observed["quota_off"] = cg.quota()
        run_until(tb, tb.completed() + 2)
        link = tb.inject("link:node=1,rate=20mbit")
        node_end, bridge_end = tb.link_devices(1)
        observed["qdisc_on"] = [show_qdisc(*node_end), show_qdisc(*bridge_end)]
        run_until(tb, tb.completed() + 3)
        tb.remove(link)
        observed["qdisc_off"] = [show_qdisc(*node_end), show_qdisc(*bridge_end)]
        rank3_pid = tb.procs[3].pid
        rep = tb.wait()
    _nothing_left(rep["prefix"])
    assert observed["quota_on"] == 0.1 and observed["quota_off"] is None and rank3_pid in observed["pids"]
    assert observed["period"] == 10_000
    assert all("tbf" in q and "20Mbit" in q for q in observed["qdisc_on"]), observed["qdisc_on"]
    assert not any("tbf" in q for q in observed["qdisc_off"])
    cpu_ep, link_ep = rep["faults"]
    assert (cpu_ep["kind"], link_ep["kind"]) == ("cpu", "link")
    assert cpu_ep["start_unix_s"] < cpu_ep["end_unix_s"] < link_ep["start_unix_s"] < link_ep["end_unix_s"]
    # classify iterations from the report's wall-clock fields alone (what later issues score against)
    its = _slowest(rep)[2:]  # first two: start-up
    def overlaps(it: tuple[float, float, float], ep: dict[str, Any]) -> bool:
        return it[0] < ep["end_unix_s"] and ep["start_unix_s"] < it[1]
    healthy = [d for it in its if it[1] <= link_ep["start_unix_s"] and not overlaps(it, cpu_ep) for d in [it[2]]]
    with_cpu = [it[2] for it in its if overlaps(it, cpu_ep)]
    with_link = [it[2] for it in its if overlaps(it, link_ep)]
    assert len(healthy) >= 3 and len(with_cpu) >= 3 and len(with_link) >= 3
    base = statistics.median(healthy)
    # behaviour with wide margins (measured ratios are in docs/testbed.md): the link stalls the 4 MB
    # gradient all-reduce several-fold; a 0.1-CPU quota starves the faulty rank's compute
    assert statistics.median(with_link) > 2.0 * base, (with_link, healthy)
    assert statistics.median(with_cpu) > 1.2 * base, (with_cpu, healthy)


def test_trainer_faults_and_tp(failslow_cmd: list[str], tmp_path: Path) -> None:
    """GC pauses, sequence-length and stage imbalance act in the trainers; TP2 trains; poisson schedules."""
    small = ModelConfig(d_model=64, layers=2)  # these checks do not depend on the model's size
    # runs until stopped below (a checkpoint with stop), however fast or slow the machine is
    cfg = JobConfig(dp=2, pp=2, tp=1, iterations=1000, micro_batches=2, namespaces=False, model=small)
    specs = ["seqlen:dp=1,factor=1.5", "stage:pp=1,layers=+2,start_iter=1,stop_iter=5"]
    with Testbed(cfg, specs, run_dir=tmp_path / "a") as tb:
        tb.start()
        # the GC fault comes at run time from another process: `failslow testbed control ... inject`
        ctl = subprocess.Popen([*failslow_cmd, "testbed", "control", "--run-dir", str(tmp_path / "a"), "inject",
                                "gc:rank=2,every=4,pause=0.2"], stdout=subprocess.PIPE, text=True)
        while ctl.poll() is None:
            tb.poll()
            tb.serve_requests()
            time.sleep(0.05)
        assert ctl.returncode == 0 and json.loads(ctl.stdout.read()) == "gc:rank=2,every=4,pause=0.2"
        gc_fault = next(f for f in tb.faults if f.kind == "gc")
        run_until(tb, max(6, gc_fault.episodes[0]["start_iter"] + 5))
        tb.checkpoint(tmp_path / "ck", stop=True)
        rep = tb.wait()
        rep = tb.report(trace=tmp_path / "trace-a.csv")
        recs = tb.records
    assert rep["namespaces"] is False
    for rank in range(4):
        assert {r["seq_len"] for r in recs[rank]} == {96 if rank % 2 == 1 else 64}
    # the scheduled stage fault: every rank of stage 1 computes 3x ((1 + 2) / 1 layer) over one
    # contiguous range of iterations, and the report gives that range's wall-clock onset and end
    stage_ep = next(e for e in rep["faults"] if e["kind"] == "stage")
    first, last = stage_ep["start_iter"], stage_ep["end_iter"]
    n = len(recs[0])
    assert all(len(q) == n for q in recs.values())
    assert 1 <= first < last <= n
    for rank in range(4):
        want = [3.0 if rank // 2 == 1 and first <= r["it"] < last else 1.0 for r in recs[rank]]
        assert [r["stage_factor"] for r in recs[rank]] == want
    assert stage_ep["start_unix_s"] == min(r["end_unix"] - r["dt"] for q in recs.values() for r in q
                                           if r["it"] == first)
    lines = (tmp_path / "trace-a.csv").read_text().splitlines()
    gc_rows = [row.split(",") for row in lines[1:] if ",gc," in row]
    gc_ep = next(e for e in rep["faults"] if e["kind"] == "gc")
    want = [it for it in range(gc_ep["start_iter"], n) if (it + 1) % 4 == 0]
    assert want and sorted(int(r[3]) for r in gc_rows) == want and {r[2] for r in gc_rows} == {"2"}
    assert all(float(r[6]) >= 0.2 for r in gc_rows)

    cfg = JobConfig(dp=1, pp=2, tp=2, iterations=8, micro_batches=2, model=small)
    with Testbed(cfg, ["poisson:mean_gap=0.5,mean_dur=0.3,kinds=cpu,seed=3"], run_dir=tmp_path / "b") as tb:
        tb.start()
        rep = tb.wait()
    assert rep["layout"]["num_nodes"] == 2 and len(rep["iteration_time_s"]) == 4
    assert rep["losses"][-1] < rep["losses"][0] - 0.3
    # 2 nodes of 2 TP ranks: placement follows the topology model
    assert rep["placement"] == [0, 0, 1, 1]
    if ROOT:
        assert rep["faults"] and {f["kind"] for f in rep["faults"]} == {"cpu"}
        assert all(f["parent"].startswith("poisson:") for f in rep["faults"])


def test_rebalanced_microbatches_keep_the_gradient(tmp_path: Path) -> None:
    """Moving micro-batches between DP replicas (total kept) leaves the global-batch gradient unchanged.

    One job with lr = 0 and the same batch every iteration, so gradients of different iterations are
    comparable; the micro-batch split changes at run time through the control channel.
    """
    cfg = JobConfig(dp=2, pp=2, iterations=16, micro_batches=4, lr=0.0, weight_decay=0.0, repeat_data=True,
                    namespaces=False, model=ModelConfig(d_model=64, layers=2), dump_grads_iters=list(range(16)))
    with Testbed(cfg, run_dir=tmp_path / "run") as tb:
        tb.start()
        run_until(tb, 1)
        skew_at = tb.set_microbatches([6, 2])  # same global batch, 6 + 2 instead of 4 + 4
        run_until(tb, skew_at + 1)
        other_at = tb.set_microbatches([5, 2])  # one micro-batch fewer: a different global batch
        rep = tb.wait()
        recs = tb.records
    assert other_at < 16
    assert recs[0][0]["mb"] == 4 and recs[0][skew_at]["mb"] == 6 and recs[2][skew_at]["mb"] == 6
    assert recs[1][skew_at]["mb"] == 2 and recs[1][other_at]["mb"] == 2 and recs[0][other_at]["mb"] == 5
    assert len(rep["losses"]) == 16
    import torch  # here only: importing torch costs seconds at collection on a loaded machine

    grads = {it: [torch.load(tmp_path / "run" / "grads" / f"rank{r}-it{it}.pt") for r in range(4)]
             for it in (0, skew_at, other_at)}
    for even, skew in zip(grads[0], grads[skew_at], strict=True):
        assert even.abs().max() > 0
        torch.testing.assert_close(even, skew, rtol=1e-4, atol=1e-7)
    # a different global batch does change it (the comparison can fail)
    assert not torch.allclose(grads[0][0], grads[other_at][0], rtol=1e-4, atol=1e-7)


def test_checkpoint_restart_new_placement_over_file_protocol(tmp_path: Path) -> None:
    """An outside process's view: checkpoint and restart on other nodes through the run directory."""
    # long enough that the requests land mid-run even when the job runs fast
    cfg = JobConfig(dp=2, pp=1, iterations=40, micro_batches=2, model=ModelConfig(d_model=64, layers=2))
    results: dict[str, Any] = {}
    with Testbed(cfg, run_dir=tmp_path / "run") as tb:
        tb.start()
        run_until(tb, 2)
        assert isinstance(TestbedAdapter(tb), TrainingAdapter)

        def client() -> None:
            try:
                ad = FileControlAdapter(tmp_path / "run")
                results["placement0"] = ad.placement()
                results["mb_at"] = ad.set_microbatches([3, 1])
                results["resumed"] = ad.restart([1, 0])
                results["placement1"] = ad.placement()
            except Exception as exc:  # surfaced by the assertions below
                results["error"] = repr(exc)

        th = threading.Thread(target=client)
        th.start()
        rep = tb.wait(timeout_s=240)
        th.join(timeout=30)
        pids = {r: p.pid for r, p in tb.procs.items()}
        prefix = tb.prefix
    _nothing_left(prefix)
    assert "error" not in results, results
    assert results["placement0"] == [0, 1] and results["placement1"] == [1, 0]
    assert len(rep["segments"]) == 2 and rep["segments"][1]["resume_iter"] == results["resumed"]
    assert rep["placement"] == [1, 0] and pids
    for r in "01":
        assert rep["iterations"][r] == list(range(40))  # each iteration exactly once across the restart
    assert len(rep["losses"]) == 40 and rep["losses"][-1] < rep["losses"][0] - 0.5
    # micro-batch counts switched for every rank at the same iteration
    mbs = {r: [rec["mb"] for rec in tb.records[r]] for r in (0, 1)}
    at = results["mb_at"]
    assert mbs[0][:at] == [2] * at and set(mbs[0][at:]) == {3} and set(mbs[1][at:]) == {1}
    # a new job resumes from the restart's checkpoint (what `failslow testbed run --resume DIR` does)
    ckpt = rep["segments"][1]["checkpoint"]
    resumed = results["resumed"]
    cfg2 = JobConfig(dp=2, pp=1, iterations=resumed + 3, micro_batches=2, model=ModelConfig(d_model=64, layers=2),
                     resume_dir=ckpt, namespaces=False)
    with Testbed(cfg2, run_dir=tmp_path / "resumed") as tb2:
        tb2.start()
        rep2 = tb2.wait()
    assert rep2["iterations"]["0"] == list(range(resumed, resumed + 3))
    # it continues the trained model: its first loss is near the original job's loss there, far below the start
    assert abs(rep2["losses"][0] - rep["losses"][resumed]) < 0.5 < rep["losses"][0] - rep2["losses"][0]


def _allowed_cpus(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


def test_capped_job_fault_restores_the_base_cap_and_cleanup_removes_the_cgroups(tmp_path: Path) -> None:
    assert os.geteuid() == 0, "the CPU cap needs root (cgroup v1 cpu controller)"
    cfg = JobConfig(dp=2, pp=1, iterations=14, micro_batches=2, cpu_cap=0.45, cpu_period_us=10_000,
                    pin_cpus=True, device_speed=0.45)
    seen: dict[str, object] = {}
    with Testbed(cfg, run_dir=tmp_path / "run") as tb:
        tb.start()
        run_until(tb, 3)
        cgs = [tb.rank_cgroup(r) for r in range(2)]
        assert all(cg is not None for cg in cgs)
        seen["quotas"] = [cg.quota() for cg in cgs if cg is not None]
        seen["periods"] = [int((cg.path / "cpu.cfs_period_us").read_text()) for cg in cgs if cg is not None]
        seen["in_cgroup"] = [tb.procs[r].pid in cg.pids() for r, cg in enumerate(cgs) if cg is not None]
        seen["threads"] = [len(os.listdir(f"/proc/{tb.procs[r].pid}/task")) for r in range(2)]
        seen["cpus"] = [{_allowed_cpus(int(t)) for t in os.listdir(f"/proc/{tb.procs[r].pid}/task")}
                        for r in range(2)]
        fault = tb.inject("cpu:rank=1,quota=0.2")
        cg1 = cgs[1]
        assert cg1 is not None
        seen["on"] = (cg1.quota(), int((cg1.path / "cpu.cfs_period_us").read_text()))
        run_until(tb, tb.completed() + 2)
        tb.remove(fault)
        seen["off"] = cg1.quota()
        seen["other"] = cgs[0].quota() if cgs[0] is not None else None
        paths = [cg.path for cg in cgs if cg is not None]
        rep = tb.wait()
    assert seen["quotas"] == [0.45, 0.45] and seen["periods"] == [10_000, 10_000]
    assert seen["in_cgroup"] == [True, True]
    # every thread of a rank (gloo's included) on one CPU, rank by rank round-robin
    usable = sorted(os.sched_getaffinity(0))
    assert seen["cpus"] == [{str(usable[r % len(usable)])} for r in range(2)], seen["cpus"]
    assert all(n > 1 for n in seen["threads"])  # the check above covered more than the main thread
    assert seen["on"] == (0.2, 10_000)
    assert seen["off"] == 0.45 and seen["other"] == 0.45  # the base cap back, not unlimited
    assert [f["kind"] for f in rep["faults"]] == ["cpu"]
    assert all(len(v) == 14 for v in rep["iteration_time_s"].values())
    assert not any(p.exists() for p in paths)
    assert leftovers(rep["prefix"]) == {"namespaces": [], "cgroups": [], "processes": []}

"""Culprit analysis and detection on the REAL testbed: torch.distributed (gloo) DP2 x PP2, one rank per
network namespace, a cgroup CPU fault on one rank, a tc link fault on one node, then a pipeline-stage
imbalance (every DP rank of one stage computes twice as long), recorded by the torch hook into per-process
rings and read back with failslow.record.

Ground truth comes from the testbed's injection log (the report's fault episodes). The analysis must name
the starved rank for the CPU fault, the throttled node for the link fault and the slow stage (its ranks)
for the imbalance, never their victims.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from failslow.culprit import Analysis, analyse
from failslow.detect import detect_series
from failslow.record import Calls, calls_from_ring_dir
from failslow.topology import Layout

pytestmark = [pytest.mark.integration, pytest.mark.testbed]

CPU_RANK = 3
LINK_NODE = 1
SLOW_STAGE = 1


def _window(calls: Calls, lo: float, hi: float) -> Calls:
    m = (calls.start >= lo) & (calls.end <= hi)
    return Calls(**{k: getattr(calls, k)[m] for k in
                    ("rank", "comm", "seq", "op", "nranks", "comm_rank", "peer", "nbytes", "start", "end")})


def _analyse(calls: Calls, lay: Layout) -> Analysis:
    dp = {tuple(sorted(g)) for g in lay.groups("dp")}
    return analyse(calls, node_of=lay.node_of, peers_of=lay.dp_group,
                   group_role=lambda ranks: "dp" if ranks in dp else "pp", stage_of=lambda r: lay.coords(r).pp)


def test_testbed_cpu_link_and_stage_faults(tmp_path: Path, failslow_cmd: list[str]) -> None:
    rings = tmp_path / "rings"
    rings.mkdir()
    report = tmp_path / "report.json"
    env = dict(os.environ, FAILSLOW_KEEP_RINGS="1")
    cmd = [*failslow_cmd, "testbed", "run", "--dp", "2", "--pp", "2", "--iterations", "40", "--torch-hook",
           "--ring-dir", str(rings), "--job", f"h4-culprit-{os.getpid()}",
           "--inject", f"cpu:rank={CPU_RANK},quota=0.1,start_iter=6,stop_iter=12",
           "--inject", f"link:node={LINK_NODE},rate=20mbit,start_iter=20,stop_iter=28",
           "--inject", f"stage:pp={SLOW_STAGE},factor=2,start_iter=32,stop_iter=38",
           "--report", str(report)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = json.loads(report.read_text())
    assert rep["namespaces"] and rep["link_faults_available"], "link faults need the per-node namespaces"
    lay = Layout(**{k: v for k, v in rep["layout"].items() if k in ("tp", "pp", "dp", "cp", "ranks_per_node")})

    parts = calls_from_ring_dir(rings)
    assert sorted(int(c.rank[0]) for c in parts if len(c)) == list(range(lay.world_size))
    calls = Calls.concat(parts)

    faults = {f["kind"]: f for f in rep["faults"]}
    cpu = _analyse(_window(calls, faults["cpu"]["start_unix_s"], faults["cpu"]["end_unix_s"]), lay)
    assert [c.rank for c in cpu.compute] == [CPU_RANK], cpu.culprits
    assert cpu.link == [], cpu.culprits

    link = _analyse(_window(calls, faults["link"]["start_unix_s"], faults["link"]["end_unix_s"]), lay)
    assert [c.node for c in link.link] == [LINK_NODE], link.culprits
    assert link.compute == [], link.culprits

    # Every DP rank of the stage is slow alike: only the cross-stage comparison can name it.
    stage = _analyse(_window(calls, faults["stage"]["start_unix_s"], faults["stage"]["end_unix_s"]), lay)
    stage_ranks = sorted(r for r in range(lay.world_size) if lay.coords(r).pp == SLOW_STAGE)
    assert [(c.stage, sorted(c.ranks)) for c in stage.compute] == [(SLOW_STAGE, stage_ranks)], stage.culprits
    assert stage.compute[0].rank is None and stage.compute[0].confidence > 0.5
    assert stage.link == [], stage.culprits

    # Detection on the testbed's own iteration times: each episode is a confirmed slowdown near its start.
    ends = np.array(rep["iteration_end_unix_s"]["0"])
    x = np.array(rep["iteration_time_s"]["0"])
    res = detect_series(x, "bocd-v")
    for f in (faults["cpu"], faults["link"]):
        first_slow = int(np.searchsorted(ends, f["start_unix_s"]))
        ups = [c.index for c in res.change_points if c.ratio > 1.1]
        assert any(abs(i - first_slow) <= 2 for i in ups), (first_slow, res.change_points, x)
    assert res.events and abs(res.events[0][0] - int(np.searchsorted(ends, faults["cpu"]["start_unix_s"]))) <= 2


def _progress(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    f = run_dir / "progress" / f"rank{rank}.jsonl"
    lines = f.read_text().splitlines() if f.exists() else []
    return [d for d in map(json.loads, lines) if "it" in d]


def test_testbed_cpu_fault_after_a_rebalance(tmp_path: Path, failslow_cmd: list[str]) -> None:
    """A starved rank's replica is given 3 of 16 micro-batches (the testbed's control channel, as S2 does):
    read raw its rank computes about as long as its DP peer with 13; per micro-batch it is still the culprit.

    Every rank is a device of its own (``--device-speed``): without it the two ranks left with 13
    micro-batches keep both cores busy and the replica's healthy first stage really does compute 1.3x
    slower per micro-batch whenever it runs beside them."""
    rings, run_dir, report = tmp_path / "rings", tmp_path / "run", tmp_path / "report.json"
    rings.mkdir()
    env = dict(os.environ, FAILSLOW_KEEP_RINGS="1")
    cmd = [*failslow_cmd, "testbed", "run", "--dp", "2", "--pp", "2", "--micro-batches", "8",
           "--micro-batch-size", "1", "--device-speed", "0.4", "--iterations", "30", "--torch-hook", "--ring-dir", str(rings),
           "--run-dir", str(run_dir), "--job", f"culprit-split-{os.getpid()}", "--loopback",
           "--inject", f"cpu:rank={CPU_RANK},quota=0.1,start_iter=3", "--report", str(report)]
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while len(_progress(run_dir, 0)) < 8 and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        ctl = subprocess.run([*failslow_cmd, "testbed", "control", "--run-dir", str(run_dir), "microbatches", "13,3"],
                             capture_output=True, text=True, timeout=120)
        assert ctl.returncode == 0, ctl.stdout + ctl.stderr
        split_at = int(json.loads(ctl.stdout)["from_iteration"])
        out, _ = job.communicate(timeout=420)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, out[-2000:]
    rep = json.loads(report.read_text())
    lay = Layout(**{k: v for k, v in rep["layout"].items() if k in ("tp", "pp", "dp", "cp", "ranks_per_node")})
    assert lay.coords(CPU_RANK).dp == 1
    prog = {d["it"]: d for d in _progress(run_dir, 0)}
    assert prog[split_at + 2]["mb"] == 13 and split_at + 8 < max(prog)
    calls = Calls.concat(calls_from_ring_dir(rings))
    after = _analyse(_window(calls, prog[split_at + 1]["end_unix"], prog[max(prog) - 1]["end_unix"]), lay)
    assert [(c.kind, c.rank) for c in after.culprits] == [("compute", CPU_RANK)], after.culprits
    ev = after.culprits[0].evidence
    assert ev["microbatch_share"] == pytest.approx(3 / 8, rel=0.1) and ev["outside_calls_ratio"] > 2.0, ev
    raw = {s.rank: s.outside_s for s in after.ranks}
    peer = next(p for p in lay.dp_group(CPU_RANK) if p != CPU_RANK)
    # compared raw the starved rank's 3 micro-batches hide most of its slowness behind its peer's 13
    assert raw[CPU_RANK] / raw[peer] < 0.5 * ev["outside_calls_ratio"], (raw, ev)

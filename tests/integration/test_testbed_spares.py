"""S4 for real: a throttled node's ranks restart on a spare node, and the job runs at its healthy pace again.

A DP2×PP1 testbed job with one spare node (three network namespaces on one bridge) trains; a `tc tbf`
throttle on node 1's link slows every iteration (the gradient all-reduce crosses it). The remediator's
testbed adapter then carries out ``restart`` excluding node1: checkpoint, stop, respawn with node 1's rank
on the spare. The throttle stays on node 1, which now holds no rank.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from failslow.control import RunDirClient
from remediator.adapters.base import ActionRequest
from remediator.adapters.testbed import Adapter
from testbed.netns import list_namespaces, show_qdisc
from testbed.state import leftovers

pytestmark = [pytest.mark.integration, pytest.mark.root, pytest.mark.testbed]

ITERATIONS = 60
THROTTLE_AT = 8  # iterations 0..7 healthy, then node 1's link at 10 mbit for the rest of the job


def _wait(what: str, cond: Callable[[], Any], timeout_s: float = 90.0,
          proc: subprocess.Popen[str] | None = None) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"job ended while waiting for {what}: {proc.communicate()[1][-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _pids_in(netns: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=True).stdout
    return out.split()


def _start_job(failslow_cmd: list[str], tmp_path: Path, job: str,
               fault: str) -> tuple[subprocess.Popen[str], Path, Path]:
    """A DP2xPP1 testbed job with one spare node and `fault`; (process, run directory, report path)."""
    run_dir, report = tmp_path / "run", tmp_path / "report.json"
    cmd = [*failslow_cmd, "testbed", "run", "--dp", "2", "--pp", "1", "--spare-nodes", "1",
           "--iterations", str(ITERATIONS), "--layers", "2", "--d-model", "64", "--micro-batches", "2",
           "--inject", fault, "--run-dir", str(run_dir), "--report", str(report), "--job", job]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), run_dir, report


def test_restart_moves_the_bad_nodes_ranks_onto_the_spare(failslow_cmd: list[str], tmp_path: Path) -> None:
    t0 = time.monotonic()
    job, run_dir, report = _start_job(failslow_cmd, tmp_path, "spares",
                                      f"link:node=1,rate=10mbit,start_iter={THROTTLE_AT}")
    try:
        meta = _wait("the run directory", lambda: (run_dir / "testbed.json").exists()
                     and json.loads((run_dir / "testbed.json").read_text()), proc=job)
        prefix = meta["prefix"]
        adapter = Adapter("spares", {}, {"run_dir": str(run_dir), "timeout_s": 120.0})
        st = _wait("the throttled iterations", lambda: (s := adapter.status())["completed"] >= THROTTLE_AT + 6
                   and s, proc=job)
        # the spare: a namespace of its own, counted in num_nodes, holding no rank, named like the others
        assert st["num_nodes"] == 3 and st["spare_nodes"] == [2] and st["placement"] == [0, 1]
        assert st["layout"]["ranks_per_node"] == 1
        assert set(list_namespaces(prefix)) == {f"{prefix}n0", f"{prefix}n1", f"{prefix}n2", f"{prefix}br"}
        info = adapter.info()
        assert info.nodes == ["node0", "node1", "node2"] and info.spare_nodes == ["node2"]
        # a link fault can be put on the spare too (and taken off again)
        client = RunDirClient(run_dir, 30)
        client.request("inject", spec="link:node=2,rate=500mbit")
        assert "tbf" in show_qdisc(f"{prefix}n2", "eth0") and "tbf" in show_qdisc(f"{prefix}br", "v2")
        client.request("remove", spec="link:node=2,rate=500mbit")
        assert "tbf" not in show_qdisc(f"{prefix}n2", "eth0")

        out = adapter.execute(ActionRequest(id="s4-1", job="spares", strategy="restart",
                                            params={"exclude_nodes": ["node1"]}, reason="node1 link throttled"))
        assert out.ok, out.detail
        assert out.result["mode"] == "spares" and out.result["moved"] == {"node1": "node2"}
        assert out.result["spares_used"] == ["node2"] and out.result["placement"] == [0, 2]
        assert out.result["previous_placement"] == [0, 1]
        assert out.pause_s is not None and out.pause_s > 0 and out.iterations_lost == 0
        after = adapter.status()
        assert after["placement"] == [0, 2] and after["spare_nodes"] == [1]
        assert "tbf" in show_qdisc(f"{prefix}n1", "eth0")  # the throttle stays, on a node with no rank
        # the processes themselves: a rank runs inside the spare's namespace, none in node 1's any more
        assert _pids_in(f"{prefix}n2") and not _pids_in(f"{prefix}n1")
        _, err = job.communicate(timeout=120)
        assert job.returncode == 0, err[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    wall = time.monotonic() - t0
    rep = json.loads(report.read_text())
    resumed = out.result["resumed_iteration"]
    assert [s["resume_iter"] for s in rep["segments"]] == [0, resumed]
    assert rep["segments"][1]["placement"] == [0, 2] and rep["placement"] == [0, 2]
    assert rep["num_nodes"] == 3 and rep["spare_nodes"] == [1]
    for r in ("0", "1"):
        assert rep["iterations"][r] == list(range(ITERATIONS))  # none repeated, none skipped, all done
    # pace: healthy before the throttle, slow under it, healthy again on the spare (wide margins: a
    # shared 2-core machine; the throttle makes iterations several times slower)
    times = [max(rep["iteration_time_s"][r][i] for r in ("0", "1")) for i in range(ITERATIONS)]
    healthy = statistics.median(times[2:THROTTLE_AT])
    throttled = statistics.median(times[THROTTLE_AT + 2:resumed])
    moved = statistics.median(times[resumed + 2:])
    print(f"\nS4 onto a spare: healthy {healthy:.3f} s, throttled {throttled:.3f} s, on the spare {moved:.3f} s; "
          f"pause {out.pause_s:.2f} s, iterations lost {out.iterations_lost}, resumed at {resumed}; "
          f"test wall {wall:.1f} s")
    assert throttled > 2 * healthy
    assert moved < throttled / 4 and moved < 2 * healthy + 0.05
    assert leftovers(prefix) == {"namespaces": [], "cgroups": [], "processes": []}
    assert not list_namespaces(prefix)


def test_a_cpu_fault_stays_on_its_device_across_restarts(failslow_cmd: list[str], tmp_path: Path) -> None:
    """A CPU fault stands for a slow device: a swap puts the other rank on it, S4 leaves it unused."""
    job, run_dir, report = _start_job(failslow_cmd, tmp_path, "spares-cpu",
                                      f"cpu:rank=1,quota=0.03,start_iter={THROTTLE_AT}")
    try:
        _wait("the run directory", lambda: (run_dir / "testbed.json").exists(), proc=job)
        adapter = Adapter("spares-cpu", {}, {"run_dir": str(run_dir), "timeout_s": 120.0})
        _wait("the slow iterations", lambda: adapter.status()["completed"] >= THROTTLE_AT + 5, proc=job)
        swap = adapter.execute(ActionRequest(id="s3-1", job="spares-cpu", strategy="topology",
                                             params={"placement": [1, 0]}, reason="swap"))
        assert swap.ok, swap.detail
        swapped_at = int(swap.result["resumed_iteration"])
        _wait("iterations after the swap", lambda: adapter.status()["completed"] >= swapped_at + 6, proc=job)
        out = adapter.execute(ActionRequest(id="s4-1", job="spares-cpu", strategy="restart",
                                            params={"exclude_nodes": ["node1"]}, reason="slow device on node1"))
        assert out.ok, out.detail
        # after the swap rank 0 sat on node 1; S4 moves it to the spare
        assert out.result["moved"] == {"node1": "node2"} and out.result["placement"] == [2, 0]
        _, err = job.communicate(timeout=120)
        assert job.returncode == 0, err[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    rep = json.loads(report.read_text())
    resumed = int(out.result["resumed_iteration"])
    cpu = [e for e in rep["faults"] if e["kind"] == "cpu"]
    # one episode per segment: rank 1 on node 1, rank 0 once swapped onto node 1, nobody once node 1 is unused
    assert [e["target"].split(" ")[0] for e in cpu] == ["rank=1", "rank=0", "rank=1"], cpu
    assert "holds no rank" in cpu[-1]["target"]

    def med(r: str, lo: int, hi: int) -> float:
        return statistics.median(rep["iteration_time_s"][r][lo:hi])

    # slow on the device before and after the swap (every rank waits for it), healthy once nobody uses it
    slow = [med(r, THROTTLE_AT + 2, swapped_at) for r in ("0", "1")]
    after_swap = [med(r, swapped_at + 2, resumed) for r in ("0", "1")]
    healthy = max(med(r, 2, THROTTLE_AT) for r in ("0", "1"))
    moved = max(med(r, resumed + 2, ITERATIONS) for r in ("0", "1"))
    print(f"\ncpu fault on its device: healthy {healthy:.3f} s, before the swap {slow}, after {after_swap}, "
          f"on the spare {moved:.3f} s")
    assert max(slow) > 2 * healthy and max(after_swap) > 2 * healthy
    assert moved < max(after_swap) / 2

"""FALCON's validation stage on a real testbed job: GEMM benchmark and O(1)-round link tests, run by the ranks.

A DP2xPP2 job (one rank per node, four network namespaces) trains while one rank runs under a CPU quota and
one node's veth pair under a 20 mbit tbf. Validations are asked through the run directory (as the
``failslow testbed control`` command and the remediator ask them) and through the remediator's testbed
adapter; each must name exactly the injected rank or the injected node's links, clear the healthy ones,
report its pause, and leave training to finish every iteration.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from failslow.control import RunDirClient
from remediator.adapters.base import ActionRequest
from remediator.adapters.testbed import Adapter
from testbed.config import ModelConfig
from testbed.launcher import JobConfig, Testbed
from testbed.state import leftovers
from tests.integration.polling import run_until

pytestmark = [pytest.mark.integration, pytest.mark.root, pytest.mark.testbed]

ITERATIONS = 50


def test_validation_names_the_injected_rank_and_node_and_training_goes_on(tmp_path: Path,
                                                                         failslow_cmd: list[str]) -> None:
    # small model: its ~0.3 MB gradient all-reduce keeps iterations short even through the 20 mbit link
    cfg = JobConfig(dp=2, pp=2, iterations=ITERATIONS, micro_batches=2, cpu_weight=8.0,
                    model=ModelConfig(d_model=64, layers=2))
    run = tmp_path / "run"
    got: dict[str, Any] = {}
    t_start = time.monotonic()
    with Testbed(cfg, run_dir=run) as tb:
        if not tb.use_ns:
            pytest.fail("validation of links needs root (network namespaces)")
        tb.start()
        run_until(tb, 3)
        tb.inject("cpu:rank=3,quota=0.2")   # rank 3 = DP replica 1, stage 1, on node 3
        tb.inject("link:node=1,rate=20mbit")  # node 1 = rank 1 = DP replica 1, stage 0

        def client() -> None:
            try:
                c = RunDirClient(run, timeout_s=120)
                # rank 3 slow, rank 1 a healthy suspect; default peers: one per suspect, same stage
                got["compute"] = c.request("validate_compute", "v-compute", ranks=[3, 1])
                # default communicator: the DP rings of nodes, {0,1} and {2,3}, in the same rounds
                got["dp_rings"] = c.request("validate_links", "v-dp", suspects=[1])
                # a binary tree over the four nodes: links 0-1, 0-2, 1-3 in two rounds; two of its three links
                # touch node 1, so the reference must be the clean one (0-2): node 1 is the suspect
                got["tree"] = c.request("validate_links", "v-tree", nodes=[0, 1, 2, 3], suspects=[1],
                                        topology="tree")
                # a latency multiple of 1: a clean link above the reference median is slow by latency alone,
                # and such a link is pinged again for longer at a later boundary (the quicker counts)
                got["recheck"] = c.request("validate_links", "v-recheck", nodes=[0, 2, 1, 3], suspects=[1],
                                           latency_multiple=1.0)
                # from a shell: the control command, with an explicit peer
                p = subprocess.run([*failslow_cmd, "testbed", "control", "--run-dir", str(run), "validate-compute",
                                    "3", "--peers", "0"], capture_output=True, text=True, timeout=120, check=False)
                got["cli"] = (p.returncode, p.stdout, p.stderr)
                ad = Adapter("tb", {}, {"run_dir": str(run), "timeout_s": 120})
                assert "validate" in ad.capabilities()
                req = ActionRequest("act-1", "tb", "validate", {"ranks": [3], "nodes": ["node1"]})
                got["adapter"] = ad.execute(req)
                got["recovered"] = ad.recover(req)  # after a remediator restart: from the answers, not rerun
            except Exception as exc:  # surfaced by the assertions below
                got["error"] = repr(exc)

        th = threading.Thread(target=client)
        th.start()
        rep = tb.wait(timeout_s=240)
        th.join(timeout=30)
        prefix = tb.prefix
    wall = time.monotonic() - t_start
    assert leftovers(prefix) == {"namespaces": [], "cgroups": [], "processes": []}
    assert "error" not in got, got.get("error")

    comp = got["compute"]
    assert comp["confirmed"] == [3] and comp["cleared"] == [1] and comp["peers"] == [2, 0], \
        json.dumps(comp["verdict"])
    rate = {int(r): v["gflops"] for r, v in comp["ranks"].items()}
    assert rate[3] < 0.5 * min(rate[0], rate[1], rate[2]), rate
    assert comp["pause_s"] > 0 and comp["held_s"] >= sum(v["seconds"] for v in comp["ranks"].values())

    rc, stdout, stderr = got["cli"]
    assert rc == 0, stderr
    cli = json.loads(stdout)
    assert cli["confirmed"] == [3] and cli["peers"] == [0] and cli["verdict"]["ranks"][0]["ratio"] < 0.8

    dp = got["dp_rings"]
    assert dp["rounds"] == [[[0, 1], [2, 3]]]  # two 2-node rings, one link each, side by side
    assert dp["slow_links"] == [[0, 1]] and dp["nodes"] == [1], json.dumps(dp["verdict"])  # the suspect end
    bw = {(m["a"], m["b"]): m["bandwidth_Bps"] for m in dp["links"]}
    assert bw[(0, 1)] < 0.1 * bw[(2, 3)], bw

    tree = got["tree"]
    assert tree["rounds"] == [[[0, 1]], [[0, 2], [1, 3]]]
    assert tree["slow_links"] == [[0, 1], [1, 3]] and tree["nodes"] == [1] and tree["ambiguous"] == [], \
        json.dumps(tree["verdict"])

    lat = got["recheck"]
    again_links = {(r["a"], r["b"]): r for r in lat["rechecked"]}
    assert again_links and set(again_links) <= {(0, 2), (3, 0)}, lat["rechecked"]  # not the throttled node's
    for r in again_links.values():
        assert r["latency_s"][1] <= r["latency_s"][0] and r["at_iteration"] > lat["at_iteration"]
    assert lat["pause_s"] >= lat["rechecked"][0]["pause_s"]
    assert {1} <= set(lat["nodes"]), json.dumps(lat["verdict"])

    out = got["adapter"]
    assert out.ok and out.result["confirmed"] is True, out
    assert out.result["ranks"] == [3] and out.result["nodes"] == ["node1"]
    links = out.result["links"]
    assert links["rounds"] == [[[0, 1], [2, 3]], [[1, 2], [3, 0]]]
    assert links["slow_links"] == [[0, 1], [1, 2]], json.dumps(links["verdict"])
    assert out.pause_s is not None and out.pause_s > 0 and out.iterations_lost == 0
    again = got["recovered"]
    assert again is not None and again.result == out.result and again.pause_s == out.pause_s

    # training went on unchanged: every iteration once on every rank, the loss falling
    for r in "0123":
        assert rep["iterations"][r] == list(range(ITERATIONS))
    assert rep["losses"][-1] < rep["losses"][0] - 0.5
    ring_bw = {(m["a"], m["b"]): round(m["bandwidth_Bps"] / 1e6, 2) for m in links["links"]}
    print(json.dumps({"wall_s": round(wall, 1), "gflops": rate, "gemm_ms": {r: round(v["gemm_s"] * 1e3, 3) for r, v in comp["ranks"].items()}, "compute_pause_s": comp["pause_s"],
                      "compute_held_s": comp["held_s"], "dp_rings_pause_s": dp["pause_s"],
                      "ring_bandwidth_MBps": {f"{a}-{b}": v for (a, b), v in ring_bw.items()},
                      "ring_latency_us": {f"{m['a']}-{m['b']}": round(m["latency_s"] * 1e6, 1)
                                          for m in links["links"]},
                      "adapter_pause_s": out.pause_s}))

"""The testbed adapter's validate outcome: the base contract's ``confirmed``/``ranks``/``nodes`` from the job's
answers, and recovery from those answers after a remediator restart (the live path is in
tests/integration/test_validation_testbed.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remediator.adapters.base import ActionRequest, AdapterError
from remediator.adapters.testbed import Adapter

COMPUTE = {"confirmed": [3], "cleared": [1], "peers": [2, 0], "pause_s": 0.8, "at_iteration": 9,
           "verdict": {"kind": "compute"}, "ranks": {}}
LINKS = {"nodes": [1], "ambiguous": [], "slow_links": [[0, 1], [1, 2]], "pause_s": 0.5, "at_iteration": 14,
         "verdict": {"kind": "links"}, "links": [], "rounds": []}


def _answer(run: Path, rid: str, result: object, ok: bool = True) -> None:
    doc = {"id": rid, "ok": ok, **({"result": result} if ok else {"error": result})}
    (run / "responses" / f"{rid}.json").write_text(json.dumps(doc))


@pytest.fixture
def run(tmp_path: Path) -> Path:
    for sub in ("requests", "responses"):
        (tmp_path / sub).mkdir()
    return tmp_path


def test_recover_builds_the_contract_from_the_parts_answers(run: Path) -> None:
    ad = Adapter("tb", {}, {"run_dir": str(run), "timeout_s": 1})
    _answer(run, "a1-compute", COMPUTE)
    _answer(run, "a1-links", LINKS)
    out = ad.recover(ActionRequest("a1", "tb", "validate", {"ranks": [3, 1], "nodes": ["node1", "node3"]}))
    assert out is not None and out.ok and out.iterations_lost == 0
    assert out.result["confirmed"] is True and out.result["ranks"] == [3] and out.result["nodes"] == ["node1"]
    assert out.result["cleared_ranks"] == [1] and out.result["cleared_nodes"] == ["node3"]
    assert out.pause_s == pytest.approx(1.3)


def test_recover_cleared_refused_and_unknown(run: Path) -> None:
    ad = Adapter("tb", {}, {"run_dir": str(run), "timeout_s": 0.2})
    _answer(run, "a2-compute", {**COMPUTE, "confirmed": [], "cleared": [3, 1]})
    out = ad.recover(ActionRequest("a2", "tb", "validate", {"ranks": [3, 1]}))
    assert out is not None and out.ok and out.result["confirmed"] is False
    _answer(run, "a3-links", "InputError: nodes [5] hold no rank", ok=False)
    out = ad.recover(ActionRequest("a3", "tb", "validate", {"nodes": ["node5"]}))
    assert out is not None and not out.ok and "refused" in out.detail
    # one part never answered: unknown, not "cleared"
    _answer(run, "a4-compute", COMPUTE)
    assert ad.recover(ActionRequest("a4", "tb", "validate", {"ranks": [3], "nodes": ["node1"]})) is None


def test_validate_needs_suspects(run: Path) -> None:
    ad = Adapter("tb", {}, {"run_dir": str(run), "timeout_s": 0.2})
    assert "validate" in ad.capabilities()
    for params in ({}, {"ranks": ["x"]}):
        with pytest.raises(AdapterError):
            ad.execute(ActionRequest("a5", "tb", "validate", params))


def test_slow_links_no_named_node_explains_are_paths() -> None:
    from remediator.adapters.testbed import paths_of_slow_links

    ev = [{"a": 0, "b": 1, "slow": True, "bandwidth_ratio": 0.002},
          {"a": 1, "b": 2, "slow": False, "bandwidth_ratio": 0.97},
          {"a": 2, "b": 3, "slow": True, "bandwidth_ratio": 0.1},
          {"a": 3, "b": 0, "slow": True, "bandwidth_ratio": 0.1}]
    # node 3 is convicted (both its links slow): its links are its NIC, not paths; 0-1 is a path
    assert paths_of_slow_links({"nodes": [3], "verdict": {"links": ev}}) == [["node0", "node1", 0.002]]
    assert paths_of_slow_links({"nodes": [], "verdict": {"links": ev[:2]}}) == [["node0", "node1", 0.002]]
    assert paths_of_slow_links({"nodes": [], "verdict": {}}) == []


def test_link_ring_makes_every_dp_link_an_edge() -> None:
    from failslow.plan.validate import ring_edges
    from failslow.topology import Layout
    from remediator.adapters.testbed import dp_ring

    def edges(ring: list[int]) -> set[frozenset[int]]:
        return {frozenset(e) for e in ring_edges(ring)}

    lay = Layout(dp=2, pp=2, ranks_per_node=1)
    for placement in ([0, 1, 2, 3], [0, 2, 1, 3], [3, 1, 0, 2]):
        ring = dp_ring(lay, placement)
        assert sorted(ring) == [0, 1, 2, 3]
        dp_links = {frozenset((placement[g[0]], placement[g[1]])) for g in lay.groups("dp")}
        assert dp_links <= edges(ring), (placement, ring)
    # two ranks per node: each node once, DP4 ring over 4 nodes
    lay = Layout(dp=4, pp=2, ranks_per_node=2)
    ring = dp_ring(lay, [0, 1, 2, 3, 0, 1, 2, 3])
    assert ring == [0, 1, 2, 3]

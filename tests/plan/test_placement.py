"""The S3 topology planner: its iteration model, its candidates, its choice and its CLI."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from failslow.errors import InputError
from failslow.plan.placement import PlacementModel, PlacementParams, plan_topology
from failslow.plan.policy import TopologyOption
from failslow.topology import Layout

FAILSLOW = str(Path(sys.executable).with_name("failslow"))

# round numbers for hand computation: 1 ms per hop, 0.1 s per ring, no edge weight
HAND = PlacementParams(microbatches=4, compute_s=0.1, edge_stage_weight=1.0, p2p_bytes=1e6, grad_bytes=1e8,
                       tp_bytes=0.0, link_bw=1e9, intra_bw=1e10, overhead_s=0.05)


def test_model_matches_the_formula_on_a_hand_computed_case() -> None:
    lay = Layout(dp=2, pp=2, ranks_per_node=1)
    m = PlacementModel(lay, params=HAND)
    t = m.time()
    # tau = 0.1 compute + 0.001 hop per stage; replica: 4 * 0.101 + 0.101; ring: 2 * 1/2 * 1e8 / 1e9
    assert t.pipeline_s == pytest.approx(5 * 0.101)
    assert t.allreduce_s == pytest.approx(0.1)
    assert t.total_s == pytest.approx(0.05 + 0.505 + 0.1)
    # rank 3 (replica 1, stage 1) twice as slow: its replica's bottleneck is 0.201
    slow = PlacementModel(lay, slow_ranks={3: 2.0}, params=HAND).time()
    assert slow.pipeline_s == pytest.approx(4 * 0.201 + 0.101)
    # node 1's NIC at 10%: its ring runs at 1e8 B/s, its hop too
    link = PlacementModel(lay, slow_links={1: 0.1}, params=HAND).time()
    assert link.allreduce_s == pytest.approx(1.0)
    assert link.pipeline_s == pytest.approx(5 * (0.1 + 0.01))


def test_model_is_monotone_in_slowness() -> None:
    lay = Layout(dp=2, pp=4, tp=2, ranks_per_node=2)
    rng = np.random.default_rng(3)
    for _ in range(20):
        rank = int(rng.integers(lay.world_size))
        node = int(rng.integers(lay.num_nodes))
        f1, f2 = sorted(rng.uniform(1.0, 4.0, 2))
        s1, s2 = sorted(rng.uniform(0.05, 1.0, 2))
        base = PlacementModel(lay).time().total_s
        t1 = PlacementModel(lay, slow_ranks={rank: f1}, slow_links={node: s2}).time().total_s
        t2 = PlacementModel(lay, slow_ranks={rank: f2}, slow_links={node: s2}).time().total_s
        t3 = PlacementModel(lay, slow_ranks={rank: f2}, slow_links={node: s1}).time().total_s
        assert base <= t1 <= t2 <= t3


def test_calibration_reproduces_the_measured_iteration_time() -> None:
    lay = Layout(dp=2, pp=2, ranks_per_node=1)
    for measured in (0.3, 2.0, 30.0):  # 0.3 s is less than the links alone take: every time is scaled
        m = PlacementModel(lay, slow_links={(0, 1): 0.1}).calibrate(measured)
        assert m.time().total_s == pytest.approx(measured, rel=1e-6)
    plan = plan_topology(lay, slow_links={(0, 1): 0.1}, iteration_s=2.0)
    assert plan.current_s == pytest.approx(2.0, rel=1e-6)


def _dp_peers(lay: Layout, placement: tuple[int, ...], a: int, b: int) -> bool:
    return any({placement[x] for x in g} == {a, b} for g in lay.groups("dp"))


def test_congested_dp_link_moves_to_a_pipeline_hop_or_out_of_use() -> None:
    # DP2 x PP2, a node per rank; the link from node 1 to its DP peer node 0 keeps 10% of its bandwidth
    lay = Layout(dp=2, pp=2, ranks_per_node=1)
    plan = plan_topology(lay, slow_links={(0, 1): 0.1})
    assert plan.chosen is not None
    assert not _dp_peers(lay, plan.chosen.placement, 0, 1)
    assert plan.chosen.predicted_s <= 0.7 * plan.current_s
    assert "carries nothing" in plan.chosen.why or "PP hop" in plan.chosen.why
    assert sorted(plan.chosen.placement) == [0, 1, 2, 3]
    # every candidate is sorted and converts to what the ski-rental planner takes
    times = [c.predicted_s for c in plan.candidates]
    assert times == sorted(times)
    opts = plan.options()
    assert isinstance(opts[0], TopologyOption) and opts[0].placement == plan.chosen.placement


def test_congested_nic_moves_to_the_stage_with_light_gradients() -> None:
    # a NIC carries all its node's traffic: only a lighter all-reduce helps (stage 1 has a tenth of the grads)
    lay = Layout(dp=2, pp=2, ranks_per_node=1)
    plan = plan_topology(lay, slow_links={1: 0.1}, params=PlacementParams(grad_bytes=(2e9, 2e8)))
    assert plan.chosen is not None
    rank = plan.chosen.placement.index(1)
    assert lay.coords(rank).pp == 1
    # with even gradients every node carries the same: nothing to gain, the planner refuses
    even = plan_topology(lay, slow_links={1: 0.1})
    assert even.chosen is None and "beats the current" in even.reason


def test_two_slow_ranks_are_consolidated_into_one_interior_stage() -> None:
    lay = Layout(dp=1, pp=4, tp=2, ranks_per_node=1)  # stage s holds ranks 2s, 2s+1
    plan = plan_topology(lay, slow_ranks={0: 2.5, 5: 2.5})  # stages 0 and 2
    assert plan.chosen is not None
    slow_nodes = {0, 5}  # the GPUs stay where they are; the ranks on them change
    stages = {lay.coords(r).pp for r, n in enumerate(plan.chosen.placement) if n in slow_nodes}
    assert len(stages) == 1 and stages.pop() in (1, 2)
    assert plan.chosen.predicted_s < (1 - 0.03) * plan.current_s
    assert any(c.source == "consolidate" for c in plan.candidates)


def test_refuses_when_nothing_is_slow() -> None:
    plan = plan_topology(Layout(dp=2, pp=2, ranks_per_node=1))
    assert plan.chosen is None and plan.options() == ()
    assert "nothing is slow" in plan.reason
    assert plan.to_json()["chosen"] is None


def test_node_ranks_stay_together() -> None:
    lay = Layout(dp=2, pp=2, tp=2, ranks_per_node=2)  # a TP pair per node
    plan = plan_topology(lay, slow_links={(0, 1): 0.1}, slow_ranks={2: 2.0})
    assert plan.candidates
    for c in plan.candidates:
        p = c.placement
        for node in range(4):  # node u's ranks 2u, 2u+1 still share a node
            assert p[2 * node] == p[2 * node + 1]
        assert sorted(set(p)) == [0, 1, 2, 3]
    with pytest.raises(InputError, match="together"):
        PlacementModel(lay).time([0, 1, 1, 0, 2, 2, 3, 3])


@pytest.mark.parametrize("seed", range(6))
def test_exhaustive_search_is_optimal_against_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lay = [Layout(dp=2, pp=2, ranks_per_node=1), Layout(dp=2, pp=3, ranks_per_node=1),
           Layout(dp=1, pp=5, ranks_per_node=1)][seed % 3]
    n = lay.num_nodes
    slow_ranks = {int(r): float(rng.uniform(1.2, 3.0)) for r in rng.choice(lay.world_size, 2, replace=False)}
    a, b = (int(x) for x in rng.choice(n, 2, replace=False))
    slow_links = {(a, b): float(rng.uniform(0.05, 0.5)), int(rng.integers(n)): float(rng.uniform(0.2, 0.9))}
    plan = plan_topology(lay, slow_ranks=slow_ranks, slow_links=slow_links, min_gain=0.0)
    model = PlacementModel(lay, slow_ranks=slow_ranks, slow_links=slow_links)
    brute = min(model.time([perm[u] for u in model.placement]).total_s for perm in itertools.permutations(range(n)))
    best = min([plan.current_s, *(c.predicted_s for c in plan.candidates)])
    assert best == pytest.approx(brute, rel=1e-9)
    if plan.chosen is not None:
        assert plan.chosen.predicted_s == pytest.approx(brute, rel=1e-9)
        assert model.time(plan.chosen.placement).total_s == pytest.approx(plan.chosen.predicted_s)


def test_local_search_above_the_exhaustive_limit() -> None:
    lay = Layout(dp=4, pp=3, ranks_per_node=1)  # 12 nodes
    plan = plan_topology(lay, slow_links={(0, 1): 0.1})
    assert plan.method == "local-search"
    assert plan.chosen is not None and not _dp_peers(lay, plan.chosen.placement, 0, 1)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"placement": [0, 0, 1]}, "3 entries"),
    ({"placement": [0, 0, 0, 1]}, "unequal"),
    ({"slow_ranks": {4: 2.0}}, "outside"),
    ({"slow_ranks": {0: -1.0}}, "positive"),
    ({"slow_links": {1: 1.5}}, r"\(0, 1\]"),
    ({"slow_links": {(1, 1): 0.5}}, "pair"),
    ({"min_gain": 1.0}, "min_gain"),
    ({"iteration_s": 0.0}, "positive"),
    ({"params": PlacementParams(microbatches=(4, 4, 4))}, "3 micro-batch counts"),
])
def test_bad_input_is_an_input_error(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InputError, match=match):
        plan_topology(Layout(dp=2, pp=2, ranks_per_node=1), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        PlacementParams(link_bw=0.0)
    with pytest.raises(InputError, match="cp"):
        plan_topology(Layout(dp=2, cp=2, ranks_per_node=1))


def test_cli_prints_the_plan_and_exits_2_on_bad_input(tmp_path: Path) -> None:
    out = subprocess.run([FAILSLOW, "plan", "topology", "--layout", "dp=2,pp=2,tp=1", "--placement", "0,1,2,3",
                          "--slow-link", "0-1=0.1", "--slow-rank", "3=1.0", "--micro-batches", "8",
                          "--iteration-s", "2.0"], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["current_s"] == pytest.approx(2.0, rel=1e-6)
    assert doc["chosen"]["predicted_s"] <= 0.7 * doc["current_s"]
    assert all({"placement", "predicted_s", "why"} <= set(c) for c in doc["candidates"])
    healthy = subprocess.run([FAILSLOW, "plan", "topology", "--layout", "dp=2,pp=2", "--ranks-per-node", "1",
                              "--slow-link", "0-1=0.001", "--healthy-s", "0.4", "--grad-bytes", "4e6",
                              "--link-bw", "2e9"], capture_output=True, text=True, check=False)
    assert healthy.returncode == 0, healthy.stderr
    doc = json.loads(healthy.stdout)
    assert doc["current_s"] == pytest.approx(2.4, rel=0.02) and doc["chosen"]["predicted_s"] == pytest.approx(0.4)
    layout_file = tmp_path / "layout.json"
    layout_file.write_text(json.dumps({"layout": {"dp": 2, "pp": 2, "tp": 1, "ranks_per_node": 1}}))
    ok = subprocess.run([FAILSLOW, "plan", "topology", "--layout", str(layout_file)], capture_output=True,
                        text=True, check=False)
    assert ok.returncode == 0 and json.loads(ok.stdout)["chosen"] is None
    for bad in (["--slow-link", "9=0.1"], ["--slow-rank", "x=2"], ["--placement", "0,1"]):
        res = subprocess.run([FAILSLOW, "plan", "topology", "--layout", "dp=2,pp=2", *bad], capture_output=True,
                             text=True, check=False)
        assert res.returncode == 2, (bad, res.stdout)
        assert res.stderr.startswith("failslow") and "Traceback" not in res.stderr


def test_suspects_become_slow_ranks_and_links() -> None:
    from failslow.plan.pace import RankCompute, fit
    from failslow.plan.placement import DEFAULT_LINK_SHARE, DEFAULT_SLOW_FACTOR, suspect_slowness
    from failslow.plan.policy import Suspect

    lay = Layout(dp=2, pp=2, ranks_per_node=1)
    # replica 1 stage 1 (rank 3) takes 0.5 s per micro-batch where replica 0 takes 0.2 s
    ranks = [RankCompute(0, 0, 0, 0.8), RankCompute(1, 1, 0, 0.8), RankCompute(2, 0, 1, 0.8),
             RankCompute(3, 1, 1, 2.0)]
    model = fit(ranks, [4, 4], 3.0)
    suspects = [Suspect("compute", 3), Suspect("link", None, "n1"), Suspect("link", None, "elsewhere"),
                Suspect("compute", "2"), Suspect("compute", 99)]  # type: ignore[arg-type]
    slow_ranks, slow_links = suspect_slowness(lay, suspects, ["n0", "n1", "n2", "n3"], model)
    assert slow_ranks[3] == pytest.approx(2.5) and slow_ranks[2] == 1.0 and 99 not in slow_ranks
    assert slow_links == {1: DEFAULT_LINK_SHARE}
    assert suspect_slowness(lay, [Suspect("compute", 3)], [], None)[0] == {3: DEFAULT_SLOW_FACTOR}


def test_calibration_on_the_healthy_pace_predicts_the_slow_placement_and_the_move() -> None:
    lay = Layout(dp=2, pp=2, ranks_per_node=1)
    prm = PlacementParams(microbatches=4, grad_bytes=4e6, p2p_bytes=4e5, link_bw=2e9)
    plan = plan_topology(lay, [0, 1, 2, 3], slow_links={(0, 1): 0.001}, params=prm, healthy_s=0.4)
    # the healthy placement predicts 0.4 s; the congested path adds its all-reduce: 4 MB at 2 MB/s
    assert plan.current_s == pytest.approx(0.4 + 4e6 / 2e6, rel=0.02)
    assert plan.chosen is not None and plan.chosen.predicted_s == pytest.approx(0.4, rel=0.02)
    # the pace now, when also given, does not override the healthy calibration
    again = plan_topology(lay, [0, 1, 2, 3], slow_links={(0, 1): 0.001}, params=prm, healthy_s=0.4,
                          iteration_s=9.0)
    assert again.current_s == pytest.approx(plan.current_s)

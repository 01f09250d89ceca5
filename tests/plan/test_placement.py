"""The S3 topology planner: its iteration model, its candidates, its choice and its CLI."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

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


# --- scoring under each placement's best micro-batch split (rebalance=True) --------------------------------


def _brute_force_with_splits(lay: Layout, slow_ranks: dict[int, float], params: PlacementParams,
                             total: int) -> tuple[float, tuple[int, ...], tuple[int, int]]:
    """Every node permutation x every split (m0, total - m0) of a DP2 job, scored under that fixed split."""
    best = (np.inf, (), (0, 0))
    for m0 in range(1, total):
        split = (m0, total - m0)
        model = PlacementModel(lay, slow_ranks=slow_ranks, params=replace(params, microbatches=split))
        for perm in itertools.permutations(range(lay.num_nodes)):
            placement = tuple(perm[u] for u in model.placement)
            t = model.time(placement).total_s
            if t < best[0]:
                best = (t, placement, split)
    return best


def test_rebalance_consolidates_stragglers_spread_over_replicas_into_one() -> None:
    # DP2 x PP2, a node per rank; slow GPUs under rank 1 (stage 0, replica 1) and rank 2 (stage 1, replica 0):
    # both replicas are slow, S2 alone cannot help, and no move helps under the even split
    lay = Layout(dp=2, pp=2, ranks_per_node=1)
    prm = PlacementParams(microbatches=4)
    slow = {1: 3.0, 2: 3.0}
    plain = plan_topology(lay, slow_ranks=slow, params=prm)
    assert plain.chosen is None and "beats the current" in plain.reason
    assert all(c.counts is None for c in plain.candidates) and "rebalance" not in plain.to_json()

    plan = plan_topology(lay, slow_ranks=slow, params=prm, rebalance=True)
    assert plan.rebalance and plan.as_is_s == pytest.approx(plain.current_s)
    assert plan.current.counts == (4, 4) and plan.current_s == pytest.approx(plain.current_s)  # S2 alone: nothing
    assert plan.chosen is not None and plan.chosen.counts is not None
    # both slow GPUs now serve one replica, which S2 then unloads
    replicas = {lay.coords(r).dp for r, n in enumerate(plan.chosen.placement) if n in (1, 2)}
    assert len(replicas) == 1
    slow_replica = replicas.pop()
    assert sum(plan.chosen.counts) == 8 and plan.chosen.counts[slow_replica] < plan.chosen.counts[1 - slow_replica]
    assert plan.chosen.predicted_s <= 0.7 * plan.current_s
    assert "S2 alone" in plan.reason and str(list(plan.chosen.counts)) in plan.reason
    assert any(c.source == "consolidate" and "into replica" in c.why for c in plan.candidates)
    # brute force: all 24 permutations x all 7 splits of M = 8, each scored by the plain model
    brute_s, _, _ = _brute_force_with_splits(lay, slow, prm, 8)
    assert plan.chosen.predicted_s == pytest.approx(brute_s, rel=1e-12)
    # the chosen placement under its split, scored by the plain model, is what the plan predicts
    fixed = PlacementModel(lay, slow_ranks=slow, params=replace(prm, microbatches=plan.chosen.counts))
    assert fixed.time(plan.chosen.placement).total_s == pytest.approx(plan.chosen.predicted_s, rel=1e-12)
    # the split travels to the ski-rental planner, and into the JSON
    opt = plan.options()[0]
    assert opt.placement == plan.chosen.placement and opt.counts == plan.chosen.counts
    doc = plan.to_json()
    assert doc["chosen"]["counts"] == list(plan.chosen.counts) and doc["current"]["counts"] == [4, 4]
    assert doc["rebalance"] is True and doc["as_is_s"] == pytest.approx(plain.current_s)


def test_rebalance_listed_candidates_agree_with_the_exact_solver() -> None:
    from failslow.plan.microbatch import rebalance

    lay = Layout(dp=3, pp=2, ranks_per_node=1)
    prm = PlacementParams(microbatches=(3, 4, 5))
    slow = {0: 2.0, 3: 1.7, 5: 2.6}
    plan = plan_topology(lay, slow_ranks=slow, slow_links={(1, 4): 0.3}, params=prm, rebalance=True,
                         min_gain=0.0)
    model = PlacementModel(lay, slow_ranks=slow, slow_links={(1, 4): 0.3}, params=prm, rebalance=True)
    assert plan.candidates
    for c in plan.candidates:
        sigma = model.sigma_of(c.placement)
        t, o = model.pace(sigma)
        exact = rebalance(t, 12, offsets=o)
        assert c.counts == exact.counts
        vec = float(model.times(sigma[None, :])[0])
        plain = PlacementModel(lay, slow_ranks=slow, slow_links={(1, 4): 0.3},
                               params=replace(prm, microbatches=exact.counts))
        assert vec == pytest.approx(plain.time(c.placement).total_s, rel=1e-12)
        assert model.time(c.placement).counts == exact.counts


@pytest.mark.parametrize("seed", range(3))
def test_vectorised_makespan_search_matches_the_exact_solver(seed: int) -> None:
    from failslow.plan.microbatch import rebalance
    from failslow.plan.placement import min_makespan

    rng = np.random.default_rng(100 + seed)
    for dp in (1, 2, 3, 5, 8):
        rows, pp = 40, int(rng.integers(1, 5))
        # per-stage times as the placement model builds them, some stragglers, some replicas tied
        tau = rng.uniform(0.01, 1.0, (rows, pp, dp)) * np.where(rng.random((rows, pp, dp)) < 0.2, 4.0, 1.0)
        tau[:10] = np.round(tau[:10], 1) + 0.1
        t = tau.max(axis=1)
        o = tau.sum(axis=1) - t
        total = int(rng.integers(dp, 6 * dp + 2))
        cap = None
        if seed == 2:  # per-replica upper bounds, leaving room for the total
            bounds = rng.integers(1, total + 1, dp)
            while int(np.minimum(bounds, total).sum()) < total:
                bounds[int(rng.integers(dp))] += 1
            cap = bounds
        room = total - dp + 1
        vec = min_makespan(t, o, total, None if cap is None else np.minimum(cap, room).astype(np.float64))
        for i in range(rows):
            exact = rebalance(t[i], total, 1, None if cap is None else [int(x) for x in cap], offsets=o[i])
            assert vec[i] == exact.makespan, (dp, total, i)


def test_rebalance_refuses_when_s2_alone_on_the_current_placement_is_as_good() -> None:
    # one slow GPU: S2 unloads its replica; a move adds nothing to that
    lay = Layout(dp=2, pp=2, ranks_per_node=1)
    prm = PlacementParams(microbatches=4)
    plan = plan_topology(lay, slow_ranks={3: 3.0}, params=prm, rebalance=True)
    assert plan.chosen is None and plan.options() == ()
    assert "beats the current" in plan.reason and "S2 alone" in plan.reason
    assert plan.current.counts is not None and plan.current.counts[1] < plan.current.counts[0]
    assert plan.as_is_s is not None and plan.current_s < 0.8 * plan.as_is_s
    # scored under the even split instead, the slow replica looks the same wherever it goes: refused too
    assert plan_topology(lay, slow_ranks={3: 3.0}, params=prm).chosen is None


def test_rebalance_respects_upper_bounds_and_calibrates_on_the_current_split() -> None:
    lay = Layout(dp=2, pp=2, ranks_per_node=1)
    prm = PlacementParams(microbatches=4)
    slow = {1: 3.0, 2: 3.0}
    plan = plan_topology(lay, slow_ranks=slow, params=prm, rebalance=True, microbatch_upper=5)
    assert plan.chosen is not None and plan.chosen.counts is not None and max(plan.chosen.counts) <= 5
    free = plan_topology(lay, slow_ranks=slow, params=prm, rebalance=True)
    assert free.chosen is not None and plan.chosen.predicted_s >= free.chosen.predicted_s
    # the measured time is the job's under its current split: the calibration fits that, not the best split
    cal = plan_topology(lay, slow_ranks=slow, params=prm, rebalance=True, iteration_s=3.0)
    assert cal.as_is_s == pytest.approx(3.0, rel=1e-6) and cal.current_s <= 3.0 * (1 + 1e-9)
    for bad, match in ((0, "bound >= 1"), ((3, 3), "no room"), ((5, 5, 5), "one per DP replica"),
                       ("x", "integers")):
        with pytest.raises(InputError, match=match):
            plan_topology(lay, slow_ranks=slow, params=prm, rebalance=True, microbatch_upper=bad)  # type: ignore[arg-type]


def test_rebalance_keeps_the_plain_plan_unchanged_when_off() -> None:
    lay = Layout(dp=2, pp=3, ranks_per_node=1)
    kw: dict[str, Any] = {"slow_ranks": {1: 2.0, 4: 1.5}, "slow_links": {(0, 3): 0.2}, "min_gain": 0.0}
    a = plan_topology(lay, **kw)
    b = plan_topology(lay, rebalance=False, **kw)
    assert a.to_json() == b.to_json()
    assert "counts" not in json.dumps(a.to_json()) and a.as_is_s is None
    assert all(o.counts is None for o in a.options())


def test_cli_rebalance_flag() -> None:
    base = [FAILSLOW, "plan", "topology", "--layout", "dp=2,pp=2", "--ranks-per-node", "1", "--slow-rank", "1=3",
            "--slow-rank", "2=3", "--micro-batches", "4"]
    plain = subprocess.run(base, capture_output=True, text=True, check=False)
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout)["chosen"] is None
    out = subprocess.run([*base, "--rebalance", "--micro-batch-upper", "6"], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["rebalance"] is True and doc["current"]["counts"] == [4, 4]
    assert doc["chosen"]["counts"] == [6, 2] or doc["chosen"]["counts"] == [2, 6]
    assert all("counts" in c for c in doc["candidates"]) and "S2 alone" in doc["reason"]
    bad = subprocess.run([*base, "--micro-batch-upper", "6"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "--rebalance" in bad.stderr


def test_two_point_calibration_prices_a_consolidation_at_the_healthy_speed() -> None:
    """With the healthy pace and the pace now, the healthy pace fixes the compute and the slow factors are
    fitted to the pace now: the move's prediction is the true hardware's, whatever size the suspects' factors
    were measured at (only their ratio counts)."""
    from failslow.plan.placement import fit_slowness

    lay = Layout(dp=2, pp=2, ranks_per_node=1)
    truth = PlacementParams(microbatches=4, compute_s=0.05, overhead_s=0.02)
    true_slow = {1: 3.0, 2: 5.0}  # (f - 1) in ratio 1 : 2
    healthy_s = PlacementModel(lay, params=truth).time().total_s
    now_s = PlacementModel(lay, slow_ranks=true_slow, params=truth).time().total_s
    seen = {1: 1.5, 2: 2.0}  # same ratio, a quarter of the size
    fitted = fit_slowness(lay, None, seen, None, truth, now_s)
    assert fitted is not None and fitted[1] == pytest.approx(3.0, rel=1e-9) and fitted[2] == pytest.approx(5.0, rel=1e-9)
    # no fit: the pace now is not slower than the healthy model, or the suspects are not slow at all
    assert fit_slowness(lay, None, seen, None, truth, healthy_s) is None
    assert fit_slowness(lay, None, {1: 1.0}, None, truth, now_s) is None

    # start from the default traffic model with a wrong scale: the healthy pace recovers it
    start = PlacementParams(microbatches=4, compute_s=0.2, overhead_s=0.08)
    plan = plan_topology(lay, slow_ranks=seen, params=start, iteration_s=now_s, healthy_s=healthy_s, rebalance=True)
    exact = plan_topology(lay, slow_ranks=true_slow, params=truth, rebalance=True)
    assert plan.as_is_s == pytest.approx(now_s, rel=1e-9) and plan.current_s == pytest.approx(exact.current_s, rel=1e-6)
    assert plan.chosen is not None and exact.chosen is not None
    assert plan.chosen.predicted_s == pytest.approx(exact.chosen.predicted_s, rel=1e-6)
    assert plan.chosen.counts == exact.chosen.counts
    # calibrated on the pace now alone, the small factors leave the healthy work too slow: the move is mispriced
    pace_only = plan_topology(lay, slow_ranks=seen, params=start, iteration_s=now_s, rebalance=True)
    assert pace_only.chosen is not None
    assert abs(pace_only.chosen.predicted_s - exact.chosen.predicted_s) > 0.05 * exact.chosen.predicted_s
    # a pace no slower than healthy under these suspects: calibrated on the pace now alone, as without healthy_s
    fallback = plan_topology(lay, slow_ranks=seen, params=start, iteration_s=0.9 * healthy_s, healthy_s=healthy_s)
    alone = plan_topology(lay, slow_ranks=seen, params=start, iteration_s=0.9 * healthy_s)
    assert fallback.current_s == pytest.approx(alone.current_s) and fallback.reason == alone.reason


def test_the_healthy_pace_is_fitted_under_the_split_it_was_measured_with() -> None:
    lay = Layout(dp=2, pp=2, ranks_per_node=1)
    truth = PlacementParams(microbatches=4, compute_s=0.05, overhead_s=0.02)
    healthy_s = PlacementModel(lay, params=truth).time().total_s  # measured under [4, 4]
    now = replace(truth, microbatches=(6, 2))  # a split was applied since
    now_s = PlacementModel(lay, slow_ranks={2: 3.0}, params=now).time().total_s
    start = replace(now, compute_s=0.1, overhead_s=0.04)
    plan = plan_topology(lay, slow_ranks={2: 2.0}, params=start, iteration_s=now_s, healthy_s=healthy_s,
                         healthy_counts=(4, 4))
    exact = plan_topology(lay, slow_ranks={2: 3.0}, params=now)
    assert plan.current_s == pytest.approx(exact.current_s, rel=1e-6)
    assert [c.predicted_s for c in plan.candidates] == pytest.approx([c.predicted_s for c in exact.candidates], rel=1e-6)
    wrong = plan_topology(lay, slow_ranks={2: 2.0}, params=start, iteration_s=now_s, healthy_s=healthy_s)
    assert wrong.candidates[0].predicted_s != pytest.approx(exact.candidates[0].predicted_s, rel=1e-3)

"""The remediator hands the S3 planner's placements to the ski-rental planner (JobView.topology)."""

from __future__ import annotations

from failslow.plan.policy import Suspect, TopologyOption
from remediator.adapters.base import JobInfo
from remediator.service import topology_options


def test_link_suspect_on_a_shaped_job_yields_options_and_bad_shapes_yield_none() -> None:
    info = JobInfo(layout={"dp": 2, "pp": 2, "tp": 1, "ranks_per_node": 2}, placement=[0, 1, 0, 1],
                   nodes=["a", "b"], microbatches=[4, 4])
    # two nodes, each a DP replica's pipeline: both nodes' units are alike, so a swap gains nothing
    assert topology_options("j", info, (Suspect("link", None, "b"),), None, 2.0) == ()
    info = JobInfo(layout={"dp": 1, "pp": 4, "tp": 2, "ranks_per_node": 1}, placement=list(range(8)),
                   nodes=[f"n{i}" for i in range(8)], microbatches=[8])
    opts = topology_options("j", info, (Suspect("compute", 0), Suspect("compute", 5)), None, 3.0)
    assert opts and opts[0].predicted_s < 3.0 and sorted(opts[0].placement) == list(range(8))
    assert topology_options("j", info, (), None, 3.0) == ()
    bad = JobInfo(layout={"dp": 2, "pp": 2}, placement=[0, 1, 2], nodes=["a"], microbatches=[4, 4])
    assert topology_options("j", bad, (Suspect("compute", 0),), None, 3.0) == ()  # InputError: logged, no options


def test_validated_paths_replace_the_nic_guess_and_move_the_path() -> None:
    # DP2xPP2, one rank per node; ranks 0 and 1 are stage 0's DP peers, their path carries a gradient ring
    info = JobInfo(layout={"dp": 2, "pp": 2, "tp": 1, "ranks_per_node": 1}, placement=[0, 1, 2, 3],
                   nodes=["node0", "node1", "node2", "node3"], microbatches=[4, 4])
    link = (Suspect("link", None, "node1"),)
    # the detector's NIC suspect: node 1's NIC carries its replica's all-reduce wherever it goes
    assert topology_options("j", info, link, None, 2.0) == ()
    # validation cleared node 1's NIC and found the path 0-1 at 5%: moving it out of the DP rings pays
    opts = topology_options("j", info, link, None, 2.0, {"nodes": [], "paths": [["node0", "node1", 0.05]]})
    assert opts and opts[0].predicted_s < 0.8 * 2.0
    chosen = opts[0].placement
    stage0 = {chosen[0], chosen[1]}  # the nodes now holding stage 0's DP peers
    stage1 = {chosen[2], chosen[3]}
    assert {0, 1} not in (stage0, stage1), chosen  # nodes 0 and 1 no longer share a DP ring
    # a validation that convicted the NIC itself keeps the NIC suspect (and still refuses)
    assert topology_options("j", info, link, None, 2.0, {"nodes": ["node1"], "paths": []}) == ()


def test_node_indices_from_the_exporter_become_the_adapters_node_names() -> None:
    from remediator.service import named_suspects

    nodes = ("node0", "node1", "node2")
    sus = (Suspect("link", None, "1"), Suspect("link", None, "node2"), Suspect("compute", 3, "7"),
           Suspect("compute", 0, ""))
    assert named_suspects(sus, nodes) == (Suspect("link", None, "node1"), Suspect("link", None, "node2"),
                                  Suspect("compute", 3, "7"), Suspect("compute", 0, ""))
    # a node literally named by a number keeps its name
    assert named_suspects((Suspect("link", None, "1"),), ("0", "1")) == (Suspect("link", None, "1"),)


def test_the_jobs_traffic_and_the_measured_link_bandwidth_drive_the_prediction() -> None:
    from remediator.service import placement_params

    # the testbed's model: ~3.7 MB of gradient per stage, links of ~2 GB/s, path 0-1 at 0.06%
    info = JobInfo(layout={"dp": 2, "pp": 2, "tp": 1, "ranks_per_node": 1}, placement=[0, 1, 2, 3],
                   nodes=["node0", "node1", "node2", "node3"], microbatches=[4, 4],
                   traffic={"grad_bytes": [3.7e6, 3.6e6], "p2p_bytes": 393216})
    found = {"nodes": [], "paths": [["node0", "node1", 0.0006]], "link_bw_Bps": 2.0e9}
    p = placement_params(info, found)
    assert p.grad_bytes == (3.7e6, 3.6e6) and p.p2p_bytes == 393216.0 and p.link_bw == 2.0e9
    assert p.microbatches == (4, 4)
    # 4.2 s with the path in stage 0's gradient ring (the all-reduce alone takes ~3 s at 1.2 MB/s)
    opts = topology_options("j", info, (Suspect("link", None, "node0"),), None, 4.2, found)
    assert opts
    # away from the ring the iteration is the compute left after the calibration: well under a second, and
    # not the ~0 the default 7B traffic model gives (its all-reduce alone would exceed the measured time)
    assert 0.5 < opts[0].predicted_s < 1.5, opts[0]
    default = topology_options("j", JobInfo(**{**info.__dict__, "traffic": {}}), (Suspect("link", None, "node0"),), None,
                        4.2, {**found, "link_bw_Bps": None})
    assert default and default[0].predicted_s < 0.1
    # calibrated on the healthy pace instead (0.378 s before the onset): the move is predicted to restore it
    opts = topology_options("j", info, (Suspect("link", None, "node0"),), None, 4.2, found, 0.378)
    assert opts and abs(opts[0].predicted_s - 0.378) < 0.01, opts[0]



def test_slow_gpus_in_both_replicas_are_gathered_with_the_split_the_move_needs() -> None:
    from failslow.plan.policy import Costs, EventView, JobView, candidate

    # DP2xPP2, one rank per node: rank 1 (replica 1, stage 0) and rank 2 (replica 0, stage 1) on slow GPUs
    info = JobInfo(layout={"dp": 2, "pp": 2, "tp": 1, "ranks_per_node": 1}, placement=[0, 1, 2, 3],
                   nodes=["node0", "node1", "node2", "node3"], microbatches=[4, 4])
    sus = (Suspect("compute", 1), Suspect("compute", 2))
    # every replica is slow and stays slow under any placement with the even split: no move pays
    assert topology_options("j", info, sus, None, 2.0, None, 1.0) == ()
    opts = topology_options("j", info, sus, None, 2.0, None, 1.0, rebalance=True)
    assert opts and opts[0].counts is not None and sum(opts[0].counts) == 8
    best = opts[0]
    nodes_of_slow = {1, 2}  # the slow GPUs stay with their nodes: both must now serve one replica
    replica_of = {r: r % 2 for r in range(4)}  # Megatron order, DP2xPP2: rank = stage * 2 + replica
    holders = {replica_of[r] for r in range(4) if best.placement[r] in nodes_of_slow}
    assert len(holders) == 1, best
    slow_replica = holders.pop()
    assert best.counts[slow_replica] < best.counts[1 - slow_replica], best
    # the topology action carries the split and the one it replaces
    view = JobView(now=100.0, pace_s=2.0, healthy_s=1.0, microbatches=(4, 4), topology=opts)
    c = candidate("topology", EventView(job="j", onset_ts=0.0, firing=True, suspects=sus), view, Costs())
    assert c.params["counts"] == list(best.counts) and c.params["from"] == [4, 4]


def test_ranks_a_compute_validation_cleared_are_no_longer_suspects() -> None:
    from remediator.service import standing_suspects

    sus = (Suspect("compute", 1), Suspect("compute", 2), Suspect("compute", 3), Suspect("link", None, "node0"))
    ev = {"validated_targets": {"ranks": [1, 2, 3], "nodes": []},
          "validated_links": {"nodes": [], "paths": [], "ranks": [1, 2]}}
    assert standing_suspects(sus, ev, True) == (Suspect("compute", 1), Suspect("compute", 2), Suspect("link", None, "node0"))
    assert standing_suspects(sus, ev, None) == sus  # no standing verdict: as named
    # a verdict stored before confirmed ranks were kept: nothing is dropped
    assert standing_suspects(sus, {**ev, "validated_links": {"nodes": [], "paths": []}}, True) == sus


def test_a_later_move_keeps_traffic_off_a_path_an_earlier_validation_found_slow() -> None:
    """The compound case: an earlier event's validation found path 0-1 slow and S3 moved it out of use
    (placement [0, 3, 2, 1]). Two slow GPUs later: the best consolidation on its own puts a pipeline hop back
    onto path 0-1 (on the testbed that took the job from 0.70 s to 1.69 s); with the remembered path it is
    scored as measured, and no placement that sends traffic over it is offered."""
    info = JobInfo(layout={"dp": 2, "pp": 2, "tp": 1, "ranks_per_node": 1}, placement=[0, 3, 2, 1],
                   nodes=["node0", "node1", "node2", "node3"], microbatches=[4, 4])
    sus = (Suspect("compute", 1), Suspect("compute", 2))
    known = [["node0", "node1", 0.002]]

    def pairs(p: tuple[int, ...]) -> set[frozenset[int]]:
        """Node pairs that carry traffic: DP peers (rank = stage * 2 + replica) and pipeline hops."""
        return {frozenset((p[0], p[1])), frozenset((p[2], p[3])), frozenset((p[0], p[2])), frozenset((p[1], p[3]))}

    blind = topology_options("j", info, sus, None, 2.0, None, 1.0, rebalance=True)
    assert blind and frozenset((0, 1)) in pairs(blind[0].placement)  # what a planner that forgot would do
    for opt in topology_options("j", info, sus, None, 2.0, None, 1.0, rebalance=True, known_paths=known):
        assert frozenset((0, 1)) not in pairs(opt.placement), opt


def test_the_jobs_measured_stage_times_shape_the_placement_model() -> None:
    from remediator.service import placement_params

    # DP2xPP3, one rank per node (rank = stage * 2 + replica); stage 0 computes twice as long per micro-batch
    # as the others (embedding and data on the testbed). GPUs on nodes 1 (stage 0) and 2 (stage 1) are slow.
    info = JobInfo(layout={"dp": 2, "pp": 3, "tp": 1, "ranks_per_node": 1}, placement=list(range(6)),
                   nodes=[f"node{i}" for i in range(6)], microbatches=[4, 4],
                   traffic={"grad_bytes": [3.0e6, 2.0e6, 3.0e6], "p2p_bytes": 196608})
    found = {"nodes": [], "paths": [], "link_bw_Bps": 2.0e9}
    stages = [0.08, 0.04, 0.045]
    p = placement_params(info, found, stages, 0.01)
    assert p.compute_s == (0.08, 0.04, 0.045) and p.edge_stage_weight == 1.0 and p.overhead_s == 0.01
    # a shape of another depth, or a reading that is not a time, leaves the defaults
    for bad in ([0.08, 0.04], [0.08, 0.0, 0.045], [0.08, float("nan"), 0.045]):
        q = placement_params(info, found, bad, 0.01)
        assert q.compute_s == 0.1 and q.edge_stage_weight == 1.1 and q.overhead_s == 0.05, bad
    sus = (Suspect("compute", 1), Suspect("compute", 2))

    def slow_stages(opt: TopologyOption) -> list[int]:
        sigma = opt.placement
        return sorted(r // 2 for r in range(6) if sigma[r] in (1, 2))  # stages of the ranks on the slow nodes

    shaped = topology_options("j", info, sus, None, 0.75, found, 0.36, rebalance=True, stage_s=stages,
                              overhead_s=0.0)
    assert shaped and slow_stages(shaped[0]) == [1, 2], shaped[0]  # the slow GPUs take the light stages
    # priced with stage 0's weight: the healthy replica's pipeline of its share of the 8 micro-batches, scaled
    # as the healthy job (4 each: 3 x 0.08 + 0.165 = 0.405 s against 0.36 s) is the least it can take
    m = max(shaped[0].counts or (4, 4))
    assert shaped[0].predicted_s >= 0.36 / 0.405 * ((m - 1) * 0.08 + 0.165) - 1e-9, shaped[0]
    # the default shape (edge stages 1.1x the middle one) leaves a slow GPU on stage 0
    default = topology_options("j", info, sus, None, 0.75, found, 0.36, rebalance=True)
    assert default and 0 in slow_stages(default[0]), default[0]


def test_ranks_slow_by_their_own_compute_join_the_detectors_suspects_once() -> None:
    from remediator.service import with_slow_ranks

    named = (Suspect("compute", 1, "node1"), Suspect("link", None, "node0"))
    pace = [{"kind": "compute", "rank": 1, "node": "node1"}, {"kind": "compute", "rank": 5, "node": "node5"}]
    assert with_slow_ranks(named, pace) == (*named, Suspect("compute", 5, "node5"))
    assert with_slow_ranks(named, []) == named

"""Culprit analysis from per-window averages (what a metrics pipeline has): the same verdicts."""

from __future__ import annotations

import pytest

from failslow.culprit import analyse_aggregates
from failslow.culprit.suspects import at_mean_work, peer_ratios
from failslow.record import SEND
from failslow.topology import Layout
from tests.culprit.synthetic import aggregate, pp_stage, simulate


@pytest.mark.parametrize(("fault", "expect"), [({"slow_rank": 4}, ("compute", 4)), ({"slow_node": 2}, ("link", 2)),
                                               ({"slow_stage": 1}, ("stage", 1)), ({}, None)])
def test_aggregated_form_gives_the_same_verdicts(fault: dict[str, int], expect: tuple[str, int] | None) -> None:
    lay = Layout(dp=3, pp=2, ranks_per_node=1)
    outside, group, kind = aggregate(simulate(lay, **fault), lay)
    a = analyse_aggregates(outside, group, group_kind=kind, node_of=lay.node_of, peers_of=lay.dp_group,
                           stage_of=pp_stage(lay))
    if expect is None:
        assert a.culprits == []
    elif expect[0] == "stage":
        assert [(c.stage, c.rank, sorted(c.ranks)) for c in a.culprits] == \
            [(expect[1], None, [r for r in range(lay.world_size) if lay.coords(r).pp == expect[1]])]
    else:
        top = a.culprits[0]
        assert (top.kind, top.rank if top.kind == "compute" else top.node) == expect
        assert len([c for c in a.culprits if c.kind == expect[0]]) == 1
        assert all(c.stage is None for c in a.culprits)


def test_averaged_form_does_not_blame_a_link_for_a_compute_stragglers_delay() -> None:
    # Rank 3 is slow outside calls; the other pipeline's P2P group (ranks 0, 2) looks slow only because
    # the whole job waits for rank 3. Averages cannot split wait from transfer, so no link is named.
    outside = {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.3}
    groups = {"dp0": {0: 0.05, 1: 0.05}, "dp1": {2: 0.05, 3: 0.05},
              "pp0": {0: 0.3, 2: 0.3}, "pp1": {1: 0.1, 3: 0.1}}
    kinds = {"dp0": "dp:2", "dp1": "dp:2", "pp0": "pp:2", "pp1": "pp:2"}
    stage = {0: 0, 1: 0, 2: 1, 3: 1}
    a = analyse_aggregates(outside, groups, group_kind=kinds, node_of={r: 0 for r in outside},
                           peers_of=lambda r: [p for p in outside if stage[p] == stage[r]])
    assert [(c.kind, c.rank) for c in a.culprits] == [("compute", 3)]
    # the same slow group without a compute straggler is a link suspect
    b = analyse_aggregates({r: 0.1 for r in outside}, groups, group_kind=kinds, node_of={r: r // 2 for r in outside},
                           peers_of=lambda r: [p for p in outside if stage[p] == stage[r]])
    assert [c.kind for c in b.culprits] and all(c.kind == "link" for c in b.culprits)


SPLIT = [13, 3]  # replica 1 (the slowed one) keeps 3 of 16 micro-batches after a rebalance
STEP = 0.02  # optimizer step per iteration


def _split_job(slow_rank: int | None, iters: int = 12) -> tuple[Layout, dict[int, float], dict[int, dict[int, float]],
                                                             dict[int, str], dict[int, float], dict[int, float]]:
    """A DP2xPP3 job after a rebalance: what the exporter publishes, with each rank's pipeline sends per
    iteration and its compute outside the pipeline (the step; a first stage's also one micro-batch)."""
    lay = Layout(dp=2, pp=3, ranks_per_node=1)
    calls = simulate(lay, slow_rank=slow_rank, microbatches=SPLIT, step=STEP, iters=iters)
    outside, group, kind = aggregate(calls, lay)
    sends = {r: float(((calls.rank == r) & (calls.op == SEND)).sum()) / iters for r in range(lay.world_size)}
    fixed = {r: iters * (STEP + (0.02 if lay.coords(r).pp == 0 else 0.0)) * (2.0 if r == slow_rank else 1.0)
             for r in range(lay.world_size)}
    return lay, outside, group, kind, sends, fixed


def _at(dp: int, pp: int) -> int:
    lay = Layout(dp=2, pp=3, ranks_per_node=1)
    return next(r for r in range(lay.world_size) if (lay.coords(r).dp, lay.coords(r).pp) == (dp, pp))


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_an_uneven_split_is_compared_per_micro_batch(stage: int) -> None:
    slow, peer = (_at(dp, stage) for dp in (1, 0))
    lay, outside, group, kind, sends, fixed = _split_job(slow)
    assert sends[slow] < sends[peer]  # the sends tell the split
    kw = {"group_kind": kind, "node_of": lay.node_of, "peers_of": lay.dp_group, "stage_of": pp_stage(lay)}
    a = analyse_aggregates(outside, group, pipeline_sends=sends, fixed_s=fixed, **kw)
    assert [(c.kind, c.rank) for c in a.culprits] == [("compute", slow)], a.culprits
    assert a.culprits[0].evidence["microbatch_share"] == pytest.approx(3 / 8, rel=0.01)
    ratio = {s.rank: s.ratio for s in a.ranks}
    assert ratio[slow] == pytest.approx(2.0, rel=0.1)  # the fault's own factor, the split taken out
    # compared raw, the healthy replica's rank (13 micro-batches) is the one that stands out
    raw = analyse_aggregates(outside, group, **kw)
    assert any(c.rank is not None and lay.coords(c.rank).dp == 0 for c in raw.compute), raw.culprits
    assert slow not in [c.rank for c in raw.compute]


def test_a_healthy_job_with_an_uneven_split_has_no_culprit() -> None:
    lay, outside, group, kind, sends, fixed = _split_job(None)
    a = analyse_aggregates(outside, group, group_kind=kind, node_of=lay.node_of, peers_of=lay.dp_group,
                           stage_of=pp_stage(lay), pipeline_sends=sends, fixed_s=fixed)
    assert a.culprits == []
    assert max(abs(s.ratio - 1.0) for s in a.ranks) < 0.05
    # without the fixed compute a small share's step would be rescaled as if it were micro-batches: the
    # lower of that reading and the measured one is taken, and the uneven split alone names nobody
    b = analyse_aggregates(outside, group, group_kind=kind, node_of=lay.node_of, peers_of=lay.dp_group,
                           stage_of=pp_stage(lay), pipeline_sends=sends)
    assert b.culprits == []


def test_without_the_fixed_compute_a_slowed_heavy_share_is_still_named() -> None:
    # the split favours replica 0 but its rank is what slowed (a fault that came after the rebalance)
    lay = Layout(dp=2, pp=3, ranks_per_node=1)
    slow = _at(0, 1)
    calls = simulate(lay, slow_rank=slow, microbatches=SPLIT, step=STEP, iters=12)
    outside, group, kind = aggregate(calls, lay)
    sends = {r: float(((calls.rank == r) & (calls.op == SEND)).sum()) / 12 for r in range(lay.world_size)}
    a = analyse_aggregates(outside, group, group_kind=kind, node_of=lay.node_of, peers_of=lay.dp_group,
                           stage_of=pp_stage(lay), pipeline_sends=sends)
    assert [(c.kind, c.rank) for c in a.culprits] == [("compute", slow)], a.culprits


def test_at_mean_work() -> None:
    outside = {0: 1.3, 1: 0.3, 2: 5.0}
    peers = {0: (0, 1), 1: (0, 1), 2: (2,)}.__getitem__
    # first stage of 13 and 3 micro-batches; 0.1 s of step plus one micro-batch's 0.1 s outside the pipeline
    out, share, loose = at_mean_work({0: 0.1 + 13 * 0.1, 1: 0.1 + 3 * 0.1}, {0: 13.0, 1: 3.0}, {0: 0.2, 1: 0.2},
                                     peers, first=[0, 1])
    assert out == pytest.approx({0: 0.9, 1: 0.9}) and share == pytest.approx({0: 13 / 8, 1: 3 / 8})
    assert loose == set()
    # a later stage: the step alone is fixed; unknown sends or a rank without peers stay as measured
    out, share, loose = at_mean_work(outside, {0: 26.0, 1: 6.0}, {0: 0.1, 1: 0.1}, peers)
    assert out == pytest.approx({0: 0.1 + 1.2 * 8 / 13, 1: 0.1 + 0.2 * 8 / 3, 2: 5.0})
    assert at_mean_work(outside, {0: 26.0}, None, peers) == (outside, {}, set())
    assert at_mean_work(outside, None, None, peers) == (outside, {}, set())
    # the fixed compute not told: everything is rescaled and the uneven ranks are loose
    out, share, loose = at_mean_work(outside, {0: 26.0, 1: 6.0}, None, peers)
    assert out == pytest.approx({0: 1.3 * 8 / 13, 1: 0.3 * 8 / 3, 2: 5.0}) and loose == {0, 1}
    # then a rank's ratio is the lower of the rescaled and the measured one
    ratios = peer_ratios(outside, out, loose, peers)
    assert ratios[0] == pytest.approx(min(0.8 / 0.8, 1.3 / 0.3)) and ratios[1] == pytest.approx(0.3 / 1.3)
    assert ratios[2] != ratios[2]  # no peers: NaN

"""Culprit analysis on synthetic call timings: a slow rank, a slow node link, a slow stage, healthy jobs, bad input."""

from __future__ import annotations

import pytest

from failslow.culprit import analyse
from failslow.errors import InputError
from failslow.record import Calls
from failslow.topology import Layout
from tests.culprit.synthetic import dp_peers, group_role, pp_stage, simulate


@pytest.mark.parametrize("slow_rank", [0, 3, 5])
def test_names_the_slow_rank_not_its_victims(slow_rank: int) -> None:
    lay = Layout(dp=3, pp=2, ranks_per_node=1)
    a = analyse(simulate(lay, slow_rank=slow_rank), node_of=lay.node_of, peers_of=dp_peers(lay),
                group_role=group_role(lay))
    assert [c.rank for c in a.compute] == [slow_rank]
    assert a.link == []
    top = a.culprits[0]
    assert top.kind == "compute" and top.confidence > 0.5
    assert top.evidence["outside_calls_ratio"] == pytest.approx(2.0, rel=0.1)


@pytest.mark.parametrize("slow_node", [1, 4])
def test_names_the_slow_node_link_not_its_victims(slow_node: int) -> None:
    lay = Layout(dp=3, pp=2, ranks_per_node=1)
    a = analyse(simulate(lay, slow_node=slow_node), node_of=lay.node_of, peers_of=dp_peers(lay),
                group_role=group_role(lay))
    assert a.compute == [], a.compute
    assert [c.node for c in a.link] == [slow_node]
    assert set(a.link[0].ranks) >= {slow_node}
    assert all(slow_node in {lay.node_of(r) for r in g.ranks} for g in a.groups if g.slow)


def test_healthy_job_has_no_culprit() -> None:
    lay = Layout(dp=4, pp=2, ranks_per_node=2)
    a = analyse(simulate(lay), node_of=lay.node_of, peers_of=dp_peers(lay), group_role=group_role(lay))
    assert a.culprits == []
    assert {g.kind.split(":")[0] for g in a.groups} == {"coll", "fwd", "bwd"}


@pytest.mark.parametrize("slow_stage", [0, 1, 2])
def test_names_the_slow_stage_not_its_victims(slow_stage: int) -> None:
    lay = Layout(dp=3, pp=3, ranks_per_node=1)
    a = analyse(simulate(lay, slow_stage=slow_stage), node_of=lay.node_of, peers_of=dp_peers(lay),
                group_role=group_role(lay), stage_of=pp_stage(lay))
    stage_ranks = sorted(r for r in range(lay.world_size) if lay.coords(r).pp == slow_stage)
    # DP peers share the slowness: no single rank is named, the stage is.
    assert [(c.stage, sorted(c.ranks), c.rank) for c in a.compute] == [(slow_stage, stage_ranks, None)]
    assert a.link == []
    ev = a.compute[0].evidence
    assert ev["stage_compute_ratio"] == pytest.approx(2.0, rel=0.1)
    assert a.compute[0].confidence > 0.5


def test_stage_work_normalises_a_planned_imbalance() -> None:
    lay = Layout(dp=2, pp=3, ranks_per_node=1)
    work = {0: 1.0, 1: 2.0, 2: 1.0}  # stage 1 holds twice the layers by design
    calls = simulate(lay, stage_work=work)
    kw = {"node_of": lay.node_of, "peers_of": dp_peers(lay), "group_role": group_role(lay), "stage_of": pp_stage(lay)}
    assert [c.stage for c in analyse(calls, **kw).compute] == [1]  # blind to the plan: stage 1 looks slow
    assert analyse(calls, stage_work=work, **kw).culprits == []
    slow = simulate(lay, stage_work=work, slow_stage=2)
    assert [c.stage for c in analyse(slow, stage_work=work, **kw).compute] == [2]


def test_rank_suspects_reconciled_with_a_slow_stage() -> None:
    lay = Layout(dp=3, pp=2, ranks_per_node=1)
    kw = {"node_of": lay.node_of, "peers_of": dp_peers(lay), "group_role": group_role(lay), "stage_of": pp_stage(lay)}
    stage0 = [r for r in range(lay.world_size) if lay.coords(r).pp == 0]
    stage1 = [r for r in range(lay.world_size) if lay.coords(r).pp == 1]
    # A rank of the slow stage that is a little slower still: explained by its stage.
    a = analyse(simulate(lay, slow_stage=0, stage_factor=2.0, slow_rank=stage0[1], slow_factor=1.3), **kw)
    assert [(c.stage, c.rank) for c in a.compute] == [(0, None)]
    # A rank elsewhere slower than its peers by less than the stage's excess: hidden behind the bottleneck.
    a = analyse(simulate(lay, slow_stage=0, stage_factor=2.0, slow_rank=stage1[1], slow_factor=1.3), **kw)
    assert [(c.stage, c.rank) for c in a.compute] == [(0, None)]
    # Two real faults at once: a starved rank elsewhere with a larger excess is named too.
    a = analyse(simulate(lay, slow_stage=0, stage_factor=1.5, slow_rank=stage1[1], slow_factor=3.0), **kw)
    assert sorted((c.stage if c.stage is not None else -1, c.rank if c.rank is not None else -1)
                  for c in a.compute) == [(-1, stage1[1]), (0, -1)]


@pytest.mark.parametrize("fault", [{"slow_rank": 3}, {"slow_node": 2}, {}])
def test_stage_comparison_keeps_other_verdicts(fault: dict[str, int]) -> None:
    lay = Layout(dp=3, pp=2, ranks_per_node=1)
    calls = simulate(lay, **fault)
    kw = {"node_of": lay.node_of, "peers_of": dp_peers(lay), "group_role": group_role(lay)}
    with_stage = analyse(calls, stage_of=pp_stage(lay), **kw)
    assert [(c.kind, c.rank, c.node, c.stage) for c in with_stage.culprits] == \
        [(c.kind, c.rank, c.node, None) for c in analyse(calls, **kw).culprits]


def test_bad_input() -> None:
    with pytest.raises(InputError):
        Calls.from_columns(rank=[0], start=[2.0], end=[1.0])
    with pytest.raises(InputError):
        analyse(Calls.from_columns(rank=[]))
    with pytest.raises(InputError):
        analyse(simulate(Layout(dp=2)), link_ratio=1.0)
    with pytest.raises(InputError):
        analyse(simulate(Layout(dp=2)), stage_ratio=1.0)
    lay = Layout(dp=2, pp=2)
    with pytest.raises(InputError):
        analyse(simulate(lay), stage_of=pp_stage(lay), stage_work={0: 0.0, 1: 1.0})


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_an_uneven_split_is_compared_per_micro_batch(stage: int) -> None:
    # After a rebalance replica 1, whose rank at `stage` is slow, keeps 3 of 16 micro-batches: compared raw
    # its rank computes less than its peer (13 micro-batches); per micro-batch it is the slow one. Its sends
    # tell the split, the stretches holding the DP all-reduce the step.
    lay = Layout(dp=2, pp=3, ranks_per_node=1)
    slow = next(r for r in range(lay.world_size) if (lay.coords(r).dp, lay.coords(r).pp) == (1, stage))
    a = analyse(simulate(lay, slow_rank=slow, microbatches=[13, 3], step=0.02), node_of=lay.node_of,
                peers_of=dp_peers(lay), group_role=group_role(lay), stage_of=pp_stage(lay))
    assert [(c.kind, c.rank) for c in a.culprits] == [("compute", slow)], a.culprits
    ev = a.culprits[0].evidence
    assert ev["outside_calls_ratio"] == pytest.approx(2.0, rel=0.1) and ev["microbatch_share"] == pytest.approx(3 / 8)
    healthy = analyse(simulate(lay, microbatches=[13, 3], step=0.02), node_of=lay.node_of, peers_of=dp_peers(lay),
                      group_role=group_role(lay), stage_of=pp_stage(lay))
    assert healthy.culprits == []
    assert max(abs(s.ratio - 1.0) for s in healthy.ranks) < 0.05

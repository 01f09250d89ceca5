"""Culprit analysis from per-window averages (what a metrics pipeline has): the same verdicts."""

from __future__ import annotations

import pytest

from failslow.culprit import analyse_aggregates
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

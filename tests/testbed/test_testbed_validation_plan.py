"""The launcher side of validation without a job: default peers, rings of nodes and merged rounds."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from failslow.errors import InputError
from failslow.plan.validate import ring_schedule
from failslow.topology import Layout
from testbed.validation import default_peers, merge_rounds, node_rings


def _job(dp: int, pp: int, tp: int = 1, placement: list[int] | None = None) -> Any:
    lay = Layout(tp=tp, pp=pp, dp=dp, ranks_per_node=tp)
    return SimpleNamespace(layout=lay, world_size=lay.world_size,
                           placement=placement or [lay.node_of(r) for r in range(lay.world_size)])


def test_default_peers_same_stage_other_replica_each_once() -> None:
    tb = _job(dp=2, pp=2)  # rank = dp + 2 * pp
    assert default_peers(tb, [3]) == [2]
    assert default_peers(tb, [3, 1]) == [2, 0]
    tb4 = _job(dp=4, pp=2)
    assert default_peers(tb4, [5, 6]) == [4, 7]  # stage 1 holds 4..7; each peer used once
    with pytest.raises(InputError):
        default_peers(_job(dp=2, pp=1), [0, 1])


def test_dp_rings_of_nodes_and_rounds() -> None:
    tb = _job(dp=2, pp=2, tp=2)  # TP pairs share a node: the DP rings cross nodes 0-1 and 2-3
    rings = node_rings(tb, tb.layout.groups("dp"))
    assert rings == [[0, 1], [2, 3]]
    assert merge_rounds([ring_schedule(r) for r in rings]) == [[(0, 1), (2, 3)]]
    # overlapping communicators run one after the other
    rounds = merge_rounds([ring_schedule([0, 1, 2, 3]), ring_schedule([1, 3])])
    assert rounds == [[(0, 1), (2, 3)], [(1, 2), (3, 0)], [(1, 3)]]

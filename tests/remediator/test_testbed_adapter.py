"""The testbed adapter's S4 placements: a bad node's ranks onto a spare of their own, else spread out.

Pure functions and the request-to-placement step; the real restart onto a spare runs in
tests/integration/test_testbed_spares.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from failslow.errors import InputError
from remediator.adapters.base import AdapterError
from remediator.adapters.testbed import Adapter, move_off, onto_spares
from testbed.launcher import JobConfig


def test_one_bad_node_moves_whole_onto_the_first_spare() -> None:
    # DP2×PP2×TP2 on 4 nodes of 2 ranks, spares 4 and 5: node 1's TP pair moves together onto node 4
    placement = [0, 0, 1, 1, 2, 2, 3, 3]
    out, moved = onto_spares(placement, 6, 2, {1}, [4, 5])
    assert out == [0, 0, 4, 4, 2, 2, 3, 3] and moved == {1: 4}


def test_one_spare_per_bad_node_in_index_order() -> None:
    out, moved = onto_spares([0, 1, 2, 3], 6, 1, {3, 1}, [5, 4])
    assert moved == {1: 4, 3: 5} and out == [0, 4, 2, 5]


def test_spares_running_out_leaves_the_rest_for_the_caller() -> None:
    out, moved = onto_spares([0, 1, 2, 3], 5, 1, {1, 2}, [4])
    assert moved == {1: 4} and out == [0, 4, 2, 3]  # node 2 keeps its rank: no spare left for it


def test_no_spares_changes_nothing() -> None:
    assert onto_spares([0, 1], 2, 1, {1}, []) == ([0, 1], {})


def test_unusable_spares_are_skipped() -> None:
    # node 0 holds a rank, 1 is bad itself, 9 is outside the cluster: only 3 is a spare
    out, moved = onto_spares([0, 1, 2], 4, 1, {1}, [0, 1, 9, 3])
    assert moved == {1: 3} and out == [0, 3, 2]


def test_a_bad_node_without_ranks_takes_no_spare() -> None:
    out, moved = onto_spares([0, 1], 4, 1, {2, 1}, [2, 3])
    assert moved == {1: 3} and out == [0, 3]


def test_a_node_holding_more_ranks_than_a_node_can_is_refused() -> None:
    with pytest.raises(AdapterError, match="more than a node can"):
        onto_spares([0, 1, 1], 3, 1, {1}, [2])


def test_every_result_is_a_placement_the_testbed_accepts() -> None:
    # DP2×PP2×TP2, 4 nodes of 2 ranks + 3 spares: any set of bad nodes, any number of free spares
    base = JobConfig(dp=2, pp=2, tp=2, spare_nodes=3)
    placement = [base.layout().node_of(r) for r in range(8)]
    for bad in ({0}, {1, 3}, {0, 1, 2}, {3}):
        out, moved = onto_spares(placement, 7, 2, bad, [4, 5, 6])
        assert set(moved) == bad and not set(out) & bad
        JobConfig(dp=2, pp=2, tp=2, spare_nodes=3, placement=out).validate()
        for b, s in moved.items():  # kept together
            assert [r for r, n in enumerate(out) if n == s] == [r for r, n in enumerate(placement) if n == b]


def status(placement: list[int], num_nodes: int, rpn: int = 1) -> dict[str, Any]:
    return {"placement": placement, "num_nodes": num_nodes, "layout": {"ranks_per_node": rpn},
            "spare_nodes": [n for n in range(num_nodes) if n not in placement]}


def test_exclude_prefers_spares_and_says_so() -> None:
    placement, extra = Adapter._exclude(status([0, 1, 2, 3], 5), {"exclude_nodes": ["node1"]})
    assert placement == [0, 4, 2, 3]
    assert extra == {"mode": "spares", "moved": {"node1": "node4"}, "spares_used": ["node4"],
                     "excluded": ["node1"]}


def test_exclude_ranks_name_their_nodes() -> None:
    placement, extra = Adapter._exclude(status([0, 0, 1, 1], 3, rpn=2), {"exclude_ranks": [3]})
    assert placement == [0, 0, 2, 2] and extra["moved"] == {"node1": "node2"}


def test_exclude_falls_back_to_move_off_without_spares() -> None:
    st = status([0, 0, 1, 2], 3, rpn=2)
    placement, extra = Adapter._exclude(st, {"exclude_nodes": ["node2"]})
    assert placement == move_off([0, 0, 1, 2], 3, {2}) == [0, 0, 1, 1]
    assert extra["mode"] == "move_off" and extra["moved"] == {} and extra["spares_used"] == []


def test_exclude_uses_the_spares_there_are_then_spreads_the_rest() -> None:
    st = status([0, 1, 2, 3, 3], 5, rpn=2)  # node 3 holds two ranks; node 4 is the one spare
    placement, extra = Adapter._exclude(st, {"exclude_nodes": ["node1", "node2"]})
    assert extra["mode"] == "spares+move_off" and extra["moved"] == {"node1": "node4"}
    assert placement == [0, 4, 0, 3, 3]  # node 2's rank onto the healthy node with the fewest ranks


def test_exclude_nothing_restarts_in_place_and_unknown_nodes_are_refused() -> None:
    placement, extra = Adapter._exclude(status([0, 1], 3), {})
    assert placement == [0, 1] and extra["mode"] == "in_place"
    with pytest.raises(AdapterError, match="not nodes of this job"):
        Adapter._exclude(status([0, 1], 3), {"exclude_nodes": ["node7"]})
    with pytest.raises(AdapterError, match="not a rank"):
        Adapter._exclude(status([0, 1], 3), {"exclude_ranks": [5]})


@pytest.mark.parametrize(("placement", "error"), [
    ([0, 3], "must be in 0..2"),   # node 3 is outside 2 nodes + 1 spare
    ([2, 2], "more than 1 ranks"),  # two ranks on one single-rank node
])
def test_testbed_placement_checks(placement: list[int], error: str) -> None:
    JobConfig(dp=2, pp=1, spare_nodes=1, placement=[0, 2]).validate()  # a spare may hold ranks
    with pytest.raises(InputError, match=error):
        JobConfig(dp=2, pp=1, spare_nodes=1, placement=placement).validate()
    with pytest.raises(InputError, match="spare nodes"):
        JobConfig(spare_nodes=-1).validate()

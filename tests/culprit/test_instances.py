"""Matching call instances across a communicator's members, and the wait/transfer split."""

from __future__ import annotations

from failslow.culprit import match_instances
from failslow.record import Calls


def test_a_window_cut_inside_an_instance_is_realigned() -> None:
    # Rank 1 reaches each all-reduce late; the window starts after rank 0 entered instance 0 but before
    # rank 1 did, so rank 0's first call in the window is instance 1 while rank 1's is instance 0.
    starts0 = [1.0, 2.0, 3.0]
    starts1 = [0.5, 1.5, 2.5, 3.5]
    ends0 = [1.6, 2.6, 3.6]
    ends1 = [0.6, 1.6, 2.6, 3.6]
    calls = Calls.from_columns(rank=[0] * 3 + [1] * 4, comm=[7] * 7, op=[1] * 7, nranks=[2] * 7,
                               comm_rank=[0] * 3 + [1] * 4, start=starts0 + starts1, end=ends0 + ends1)
    inst = match_instances(calls)
    assert [i.end for i in inst] == [(1.6, 1.6), (2.6, 2.6), (3.6, 3.6)]
    assert all(i.start[1] > i.start[0] for i in inst)  # rank 1 is the last to arrive, every time


def test_wait_and_transfer_split() -> None:
    calls = Calls.from_columns(rank=[0, 1, 2], comm=[7, 7, 7], op=[1, 1, 1], nranks=[3, 3, 3],
                               comm_rank=[0, 1, 2], start=[0.0, 1.0, 4.0], end=[5.0, 5.0, 5.0])
    (inst,) = match_instances(calls)
    assert inst.waits() == (4.0, 3.0, 0.0)
    assert inst.transfer() == 1.0


def test_incomplete_groups_are_not_matched() -> None:
    calls = Calls.from_columns(rank=[0, 1], comm=[7, 7], op=[1, 1], nranks=[3, 3], comm_rank=[0, 1],
                               start=[0.0, 1.0], end=[2.0, 2.0])
    assert match_instances(calls) == []

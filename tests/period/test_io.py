"""Call files for `failslow period` (`failslow.period.io`): the CSV and shim-dump parsers with literals."""

from __future__ import annotations

import numpy as np
import pytest

from failslow.errors import InputError
from failslow.period.io import parse_calls, parse_csv, parse_jsonl, point_to_point


def test_parsers_with_literals() -> None:
    c = parse_csv("t_start_s,op,comm\n0.5,Send,a\n0.2,Recv,b\n0.9,Send,a\n")
    assert c.t_start.tolist() == [0.2, 0.5, 0.9]  # sorted by time
    assert c.op.tolist() == [0, 1, 1] and c.comm.tolist() == [1, 0, 0]
    assert np.isnan(c.duration).all()
    c = parse_csv("1.0,AllReduce,1024\n2.0,AllReduce,1024\n")  # positional, no header
    assert c.nbytes.tolist() == [0, 0]
    two = ('{"pid": 5, "rank": 0, "op": "Send", "t_enqueue_ns": 2000000000, "seq": 2}\n'
           '{"pid": 5, "rank": 0, "op": "CommInit", "t_enqueue_ns": 1, "seq": 1}\n'
           '{"pid": 6, "rank": 1, "op": "Recv", "t_enqueue_ns": 1000000000, "t_start_ns": 5, "t_end_ns": 9}\n')
    with pytest.raises(InputError, match="2 processes"):
        parse_jsonl(two)
    c = parse_calls(two, rank=1)
    assert c.t_start.tolist() == [1.0] and c.duration[0] == pytest.approx(4e-9)
    assert parse_calls(two, pid=5).t_start.tolist() == [2.0]  # the control event is skipped
    with pytest.raises(InputError):
        parse_calls("t_start_s,op\n1,Send\n", pid=3)
    with pytest.raises(InputError, match="unknown column"):
        parse_csv("t_start_s,op,foo\n1,Send,2\n")


@pytest.mark.parametrize("name, p2p", [
    ("SEND", True), ("RECV", True), ("ncclSend", True), ("ncclRecv", True), ("SendRecv", True),
    ("c10d::send_", True), ("c10d::recv_any_source_", True), ("nccl:send", True), ("gloo:recv", True),
    ("batch_isend_irecv", True), ("ALLREDUCE", False), ("AllReduce_Sum_f32_RING_LL", False),
    ("c10d::allreduce_", False), ("nccl:all_reduce", False), ("gloo:barrier", False), ("allgather", False),
    ("ReduceScatter", False), ("Broadcast", False)])
def test_point_to_point_is_read_from_the_operation_name(name: str, p2p: bool) -> None:
    assert point_to_point(name) is p2p


def test_parsed_calls_say_which_are_collectives() -> None:
    calls = parse_csv("t_start_s,op\n0.0,Send\n0.1,AllReduce\n0.2,Recv\n")
    assert calls.sync is not None and calls.sync.tolist() == [False, True, False]

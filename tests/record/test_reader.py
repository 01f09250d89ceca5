"""The reader: a C-written ring read here, overflow, pending records, the control word, shim-dump."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
from c_ring import C_WRITER, compile_c

from failslow.record import Control, Flag, Op, RingReader, RingWriter


def test_c_writer_python_reader(tmp_path: Path) -> None:
    exe = compile_c(tmp_path, "cwriter", C_WRITER)
    path = tmp_path / "failslow-1.ring"
    subprocess.run([str(exe), str(path), "64", "100"], check=True, capture_output=True)
    with RingReader(path) as r:
        h = r.header
        assert (h.rank, h.world_size, h.job, h.hostname, h.producer_name) == (5, 8, "cjob", "chost", "shim")
        assert h.layout() == {"tp": 2, "pp": 2, "dp": 2, "cp": 1}
        assert (h.write_index, h.overwritten, h.dropped) == (100, 36, 0)
        recs = r.read_new()
    assert len(recs) == 64
    i = np.arange(36, 100)
    np.testing.assert_array_equal(recs["seq"], i + 1)
    np.testing.assert_array_equal(recs["count"], i)
    np.testing.assert_array_equal(recs["bytes"], i * 4)
    np.testing.assert_array_equal(recs["t_enqueue_ns"], 1000 + i)
    np.testing.assert_array_equal(recs["t_start_ns"], 2000 + i)
    np.testing.assert_array_equal(recs["t_end_ns"], 3000 + i)
    np.testing.assert_array_equal(recs["t_return_ns"], 4000 + i)
    np.testing.assert_array_equal(recs["peer"], i % 3 - 1)
    np.testing.assert_array_equal(recs["op"], 1 + i % 8)
    assert set(recs["comm"].tolist()) == {0xABCDEF0123456789}
    assert {int(recs[k][0]) for k in ("nranks", "comm_rank", "dtype", "group_depth", "tid", "stream",
                                      "aux", "device")} == {4, 1, 7, 42, 99, 3}


def test_process_dies_mid_write_reader_stays_consistent(tmp_path: Path) -> None:
    exe = compile_c(tmp_path, "cwriter", C_WRITER)
    path = tmp_path / "failslow-2.ring"
    subprocess.run([str(exe), str(path), "64", "10", "die"], check=True, capture_output=True)
    with RingReader(path) as r:
        assert r.header.write_index == 10
        recs = r.read_new()  # the producer is dead: the BUSY slot will never commit
        np.testing.assert_array_equal(recs["seq"], np.arange(1, 10))
        assert 12345 not in recs["count"].tolist()
        assert r.lost == 1
        assert len(r.read_new()) == 0


def test_overflow_overwrites_oldest_and_reader_counts_lost(tmp_path: Path) -> None:
    w = RingWriter.create(directory=tmp_path, capacity=16)
    r = RingReader(w.path)
    for i in range(10):
        w.append(Op.ALLREDUCE, 1, 2, 0, -1, i, 4 * i, 7, i)
    first = r.read_new()
    assert first["count"].tolist() == list(range(10))
    for i in range(10, 50):
        w.append(Op.ALLREDUCE, 1, 2, 0, -1, i, 4 * i, 7, i)
    second = r.read_new()
    # only the last 16 survive; 24 were overwritten before the reader came back
    assert second["count"].tolist() == list(range(34, 50))
    assert r.lost == 24
    h = r.header
    assert (h.write_index, h.overwritten, h.dropped) == (50, 34, 0)
    assert len(r.read_new()) == 0
    r.close()
    w.close(unlink=True)
    assert not w.path.exists()


def test_pending_record_holds_back_later_ones_until_committed(tmp_path: Path) -> None:
    w = RingWriter.create(directory=tmp_path, capacity=16)
    r = RingReader(w.path, pending_timeout_s=60.0)
    a = w.append(Op.SEND, 5, 2, 0, 1, 1, 4, 7, 10)
    b = w.begin(Op.RECV, 5, 2, 0, 1, 1, 4, 7, 20, flags=int(Flag.ASYNC))
    c = w.append(Op.SEND, 5, 2, 0, 1, 1, 4, 7, 30)
    assert (a, b, c) == (1, 2, 3)
    assert r.read_new()["seq"].tolist() == [1]
    assert len(r.read_new()) == 0  # still pending
    w.finish(b, t_start_ns=21, t_end_ns=29, add_flags=int(Flag.HOST_TIMES))
    got = r.read_new()
    assert got["seq"].tolist() == [2, 3]
    assert got["t_end_ns"].tolist() == [29, 0]
    assert int(got["flags"][0]) == int(Flag.ASYNC | Flag.HOST_TIMES)
    assert r.lost == 0


def test_pending_record_times_out_as_lost(tmp_path: Path) -> None:
    w = RingWriter.create(directory=tmp_path, capacity=16)
    r = RingReader(w.path, pending_timeout_s=0.05)
    w.begin(Op.RECV, 5, 2, 0, 1, 1, 4, 7, 20)
    w.append(Op.SEND, 5, 2, 0, 1, 1, 4, 7, 30)
    assert len(r.read_new()) == 0
    time.sleep(0.1)
    assert r.read_new()["seq"].tolist() == [2]
    assert r.lost == 1


def test_control_word_round_trip(tmp_path: Path) -> None:
    w = RingWriter.create(directory=tmp_path, capacity=16)
    r = RingReader(w.path)
    assert w.control() == 0
    r.set_control(Control.PROFILE | Control.SUSPEND)
    assert w.control() == 3
    r.set_suspend_timeout_ms(250)
    assert r.header.suspend_timeout_ms == 250
    r.set_control(0)
    assert w.control() == 0


def test_shim_dump_cli(tmp_path: Path, failslow_cmd: list[str]) -> None:
    w = RingWriter.create(directory=tmp_path, job="jobA", rank=2, world_size=4, capacity=16)
    w.append(Op.ALLREDUCE, 0x1234, 4, 2, -1, 256, 1024, 7, 100, 110, 190, int(Flag.HOST_TIMES))
    w.append(Op.SEND, 0x99, 2, 0, 1, 8, 32, 7, 200)
    out = subprocess.run([*failslow_cmd, "shim-dump", "--dir", str(tmp_path)], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    recs = [json.loads(x) for x in out]
    assert len(recs) == 2
    need = {"pid", "rank", "job", "op", "comm", "nranks", "comm_rank", "peer", "count", "bytes", "t_enqueue_ns",
            "t_start_ns", "t_end_ns", "seq"}
    assert need <= set(recs[0])
    assert (recs[0]["op"], recs[0]["job"], recs[0]["rank"], recs[0]["bytes"], recs[0]["t_end_ns"]) == (
        "AllReduce", "jobA", 2, 1024, 190)
    assert (recs[1]["op"], recs[1]["peer"], recs[1]["seq"], recs[1]["comm"]) == ("Send", 1, 2, f"{0x99:016x}")
    hdrs = subprocess.run([*failslow_cmd, "shim-dump", "--dir", str(tmp_path), "--headers"], capture_output=True,
                          text=True, check=True).stdout.splitlines()
    assert json.loads(hdrs[0])["write_index"] == 2
    assert json.loads(hdrs[0])["clock_name"] == "monotonic"  # the Python writer stamps clock_gettime times
    w2 = RingWriter.create(directory=tmp_path, capacity=16, pid=os.getpid() + 1_000_000, tag="torch")
    w2.append(Op.RECV, 0x99, 2, 1, 0, 8, 32, 7, 300)
    only = subprocess.run([*failslow_cmd, "shim-dump", "--dir", str(tmp_path), "--pid", str(os.getpid() + 1_000_000)],
                          capture_output=True, text=True, check=True).stdout.splitlines()
    assert [json.loads(x)["op"] for x in only] == ["Recv"]  # --pid selects tagged rings too
    bad = subprocess.run([*failslow_cmd, "shim-dump", "--dir", str(tmp_path / "nope")], capture_output=True,
                         text=True)
    assert bad.returncode == 2
    assert "does not exist" in bad.stderr
    (tmp_path / "failslow-1.ring").write_bytes(b"\0" * 8192)
    partial = subprocess.run([*failslow_cmd, "shim-dump", "--dir", str(tmp_path)], capture_output=True, text=True)
    assert partial.returncode == 1
    assert "failslow-1.ring" in partial.stderr
    assert len(partial.stdout.splitlines()) == 3

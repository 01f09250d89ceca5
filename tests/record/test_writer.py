"""The Python writer: the same record bytes as the C writer, and a busy slot after a full wrap."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

from c_ring import C_WRITER, compile_c

from failslow.record import HEADER_FIELDS, HEADER_SIZE, Flag, Op, RingReader, RingWriter


def test_python_writer_bytes_match_c_writer(tmp_path: Path) -> None:
    """The Python writer produces the same record bytes as the C writer for the same values."""
    exe = compile_c(tmp_path, "cwriter", C_WRITER)
    cpath = tmp_path / "c.ring"
    subprocess.run([str(exe), str(cpath), "16", "5"], check=True, capture_output=True)
    w = RingWriter.create(directory=tmp_path, job="cjob", rank=5, world_size=8, capacity=16, pid=777,
                          layout={"tp": 2, "pp": 2, "dp": 2, "cp": 1})
    for i in range(5):
        w.append(1 + i % 8, 0xABCDEF0123456789, 4, 1, i % 3 - 1, i, i * 4, 7, 1000 + i, 2000 + i, 3000 + i,
                 int(Flag.HOST_TIMES), t_return_ns=4000 + i, group_depth=1, tid=42, stream=99, aux=7, device=3)
    w.close()
    cb = cpath.read_bytes()
    pb = (tmp_path / "failslow-777.ring").read_bytes()
    assert len(cb) == len(pb)
    hs = HEADER_SIZE
    assert cb[hs:] == pb[hs:]
    for name in ("magic", "version", "capacity", "rank", "world_size", "tp", "pp", "dp", "cp", "job",
                 "write_index", "dropped", "overwritten", "control"):
        fmt, off = next((f, o) for n, f, o in HEADER_FIELDS if n == name)
        size = struct.calcsize("<" + fmt)
        assert cb[off:off + size] == pb[off:off + size], name


def test_busy_slot_after_full_wrap_is_dropped_not_blocked(tmp_path: Path) -> None:
    w = RingWriter.create(directory=tmp_path, capacity=16)
    s = w.begin(Op.RECV, 5, 2, 0, 1, 1, 4, 7, 20)
    for i in range(16):  # the 16th wraps onto the still-busy slot of `s`
        w.append(Op.SEND, 5, 2, 0, 1, i, 4, 7, 30)
    h = RingReader(w.path).header
    assert (h.write_index, h.dropped) == (17, 1)
    w.finish(s, t_end_ns=1)
    r = RingReader(w.path, pending_timeout_s=60.0)
    got = r.read_new()
    assert got["seq"].tolist() == list(range(2, 17))
    assert r.lost == 0  # seq 17 never got a slot: it looks pending until the timeout
    r.pending_timeout_s = 0.0
    assert len(r.read_new()) == 0
    assert r.lost == 1

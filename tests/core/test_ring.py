"""The ring contract: Python mirror vs the C header, commit protocol, overflow, pending records, shim-dump."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from failslow import ring
from failslow.errors import InputError
from failslow.ring import (
    HEADER_FIELDS,
    RECORD_DTYPE,
    Control,
    Flag,
    Op,
    RingReader,
    RingWriter,
    find_rings,
    process_alive,
)

REPO = Path(__file__).resolve().parents[2]
INCLUDE = REPO / "shim" / "include"


def _compile(tmp_path: Path, name: str, src: str) -> Path:
    c = tmp_path / f"{name}.c"
    c.write_text(src)
    exe = tmp_path / name
    subprocess.run(["gcc", "-std=c11", "-O2", "-Wall", "-Werror", "-I", str(INCLUDE), "-o", str(exe), str(c)],
                   check=True, capture_output=True, text=True)
    return exe


def test_python_layout_matches_c_header(tmp_path: Path) -> None:
    rec_fields = list(RECORD_DTYPE.names or ())
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "failslow_ring.h"', "int main(void) {",
             'printf("record_size %zu\\n", sizeof(struct failslow_record));',
             'printf("header_size %zu\\n", sizeof(struct failslow_ring_header));']
    for f in rec_fields:
        lines.append(f'printf("rec.{f} %zu %zu\\n", offsetof(struct failslow_record, {f}), '
                     f"sizeof(((struct failslow_record*)0)->{f}));")
    for name, _fmt, _off in HEADER_FIELDS:
        lines.append(f'printf("hdr.{name} %zu %zu\\n", offsetof(struct failslow_ring_header, {name}), '
                     f"sizeof(((struct failslow_ring_header*)0)->{name}));")
    for cname, pyval in [("FAILSLOW_RING_HEADER_SIZE", ring.HEADER_SIZE), ("FAILSLOW_RECORD_SIZE", ring.RECORD_SIZE),
                         ("FAILSLOW_RING_DEFAULT_CAPACITY", ring.DEFAULT_CAPACITY),
                         ("FAILSLOW_RING_VERSION", ring.VERSION), ("FAILSLOW_CTL_PROFILE", int(Control.PROFILE)),
                         ("FAILSLOW_CTL_SUSPEND", int(Control.SUSPEND)),
                         ("FAILSLOW_OP_ALLTOALL", int(Op.ALLTOALL)), ("FAILSLOW_OP_COMM_SPLIT", int(Op.COMM_SPLIT)),
                         ("FAILSLOW_F_IN_GROUP", int(Flag.IN_GROUP)),
                         ("FAILSLOW_F_SUSPEND_TIMEOUT", int(Flag.SUSPEND_TIMEOUT))]:
        lines.append(f'printf("const.{cname} %llu {pyval}\\n", (unsigned long long)({cname}));')
    lines.append('printf("magic %s\\n", FAILSLOW_RING_MAGIC);')
    lines.append("return 0; }")
    exe = _compile(tmp_path, "layout", "\n".join(lines))
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()
    got = {ln.split()[0]: ln.split()[1:] for ln in out}
    assert int(got["record_size"][0]) == RECORD_DTYPE.itemsize == ring.RECORD_SIZE
    assert int(got["header_size"][0]) == ring.HEADER_SIZE
    assert rec_fields, "dtype has fields"
    for f in rec_fields:
        off, size = (int(x) for x in got[f"rec.{f}"])
        dt, pyoff = RECORD_DTYPE.fields[f][:2]  # type: ignore[index]
        assert (off, size) == (pyoff, dt.itemsize), f
    for name, fmt, pyoff in HEADER_FIELDS:
        off, size = (int(x) for x in got[f"hdr.{name}"])
        assert (off, size) == (pyoff, ring.struct.calcsize("<" + fmt)), name
    for k, v in got.items():
        if k.startswith("const."):
            assert v[0] == v[1], k
    assert got["magic"] == [ring.MAGIC.rstrip(b"\0").decode()]


C_WRITER = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "failslow_ring.h"
/* argv: path capacity n_records [die_mid_write] */
int main(int argc, char **argv) {
    unsigned cap = (unsigned)atoi(argv[2]); long n = atol(argv[3]); int die = argc > 4;
    size_t size = FAILSLOW_RING_HEADER_SIZE + (size_t)cap * FAILSLOW_RECORD_SIZE;
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) return 3;
    struct failslow_ring_header *h = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED) return 4;
    memcpy(h->magic, FAILSLOW_RING_MAGIC, 8);
    h->version = FAILSLOW_RING_VERSION; h->header_size = FAILSLOW_RING_HEADER_SIZE;
    h->record_size = FAILSLOW_RECORD_SIZE; h->capacity = cap; h->pid = getpid(); h->rank = 5;
    h->world_size = 8; h->tp = 2; h->pp = 2; h->dp = 2; h->cp = 1; h->node_id = 1;
    h->producer = FAILSLOW_PRODUCER_SHIM; strcpy(h->job, "cjob"); strcpy(h->hostname, "chost");
    for (long i = 0; i < n; i++) {
        uint64_t s; struct failslow_record *r = failslow_ring_claim(h, &s);
        if (!r) continue;
        r->comm = 0xabcdef0123456789ull; r->count = (uint64_t)i; r->bytes = (uint64_t)i * 4;
        r->t_enqueue_ns = 1000 + i; r->t_start_ns = 2000 + i; r->t_end_ns = 3000 + i; r->t_return_ns = 4000 + i;
        r->nranks = 4; r->comm_rank = 1; r->peer = (int32_t)(i % 3) - 1; r->op = (uint16_t)(1 + i % 8);
        r->dtype = 7; r->group_depth = 1; r->flags = FAILSLOW_F_HOST_TIMES; r->tid = 42; r->stream = 99;
        r->aux = 7; r->device = 3;
        if (die && i == n - 1) { r->count = 12345; _exit(0); }  /* exits with the slot BUSY */
        failslow_ring_commit(r, s);
    }
    printf("%llu\n", (unsigned long long)h->write_index);
    return 0;
}
"""


def test_c_writer_python_reader(tmp_path: Path) -> None:
    exe = _compile(tmp_path, "cwriter", C_WRITER)
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
    exe = _compile(tmp_path, "cwriter", C_WRITER)
    path = tmp_path / "failslow-2.ring"
    subprocess.run([str(exe), str(path), "64", "10", "die"], check=True, capture_output=True)
    with RingReader(path) as r:
        assert r.header.write_index == 10
        recs = r.read_new()  # the producer is dead: the BUSY slot will never commit
        np.testing.assert_array_equal(recs["seq"], np.arange(1, 10))
        assert 12345 not in recs["count"].tolist()
        assert r.lost == 1
        assert len(r.read_new()) == 0


def test_python_writer_bytes_match_c_writer(tmp_path: Path) -> None:
    """The Python writer produces the same record bytes as the C writer for the same values."""
    exe = _compile(tmp_path, "cwriter", C_WRITER)
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
    hs = ring.HEADER_SIZE
    assert cb[hs:] == pb[hs:]
    for name in ("magic", "version", "capacity", "rank", "world_size", "tp", "pp", "dp", "cp", "job",
                 "write_index", "dropped", "overwritten", "control"):
        fmt, off = next((f, o) for n, f, o in HEADER_FIELDS if n == name)
        size = ring.struct.calcsize("<" + fmt)
        assert cb[off:off + size] == pb[off:off + size], name


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


def test_header_identity_from_env(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "991", "TORCHELASTIC_RUN_ID": "x", "SLURM_PROCID": "6", "SLURM_NTASKS": "16",
           "LOCAL_RANK": "2", "SLURM_NODEID": "3", "FAILSLOW_TP": "2", "FAILSLOW_PP": "4", "FAILSLOW_DP": "2"}
    w = RingWriter.create(directory=tmp_path, capacity=16, env=env)
    h = ring.read_header(w.path)
    assert (h.job, h.rank, h.world_size, h.local_rank, h.node_id) == ("991", 6, 16, 2, 3)
    assert h.layout() == {"tp": 2, "pp": 4, "dp": 2, "cp": 0}
    assert h.pid == os.getpid()
    assert abs(h.wall_ns(time.monotonic_ns()) - time.time_ns()) < 10**9
    env2 = {"FAILSLOW_JOB": "mine", "SLURM_JOB_ID": "991", "RANK": "1", "WORLD_SIZE": "2"}
    assert ring.env_identity(env2)["job"] == "mine"
    assert ring.env_identity({"TORCHELASTIC_RUN_ID": "te"})["job"] == "te"
    with pytest.raises(InputError, match="RANK"):
        ring.env_identity({"RANK": "zero"})


def test_bad_inputs_raise_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="power of two"):
        RingWriter.create(directory=tmp_path, capacity=100)
    with pytest.raises(InputError, match="cannot create"):
        RingWriter.create(directory=tmp_path / "missing", capacity=16)
    bad = tmp_path / "failslow-9.ring"
    bad.write_bytes(b"x" * 5000)
    with pytest.raises(InputError, match="not a failslow ring"):
        RingReader(bad)
    with pytest.raises(InputError, match="too short"):
        ring.parse_header(b"abc")


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


def test_find_rings_and_process_alive(tmp_path: Path) -> None:
    w = RingWriter.create(directory=tmp_path, capacity=16)
    w2 = RingWriter.create(directory=tmp_path, capacity=16, tag="torch")
    (tmp_path / "unrelated.txt").write_text("x")
    assert find_rings(tmp_path) == sorted([w.path, w2.path])
    assert w2.path.name == f"failslow-{os.getpid()}-torch.ring"
    assert process_alive(os.getpid())
    p = subprocess.Popen(["true"])
    p.wait()
    assert not process_alive(p.pid)
    z = subprocess.Popen(["true"])
    time.sleep(0.2)  # exited but not reaped: a zombie is not alive
    assert not process_alive(z.pid)
    z.wait()


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

"""The C shim and the Python side together: Python reads a live shim ring, shim-dump prints it, and a
Python controller suspends and releases the hooked process through the control word."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from failslow.record import OP_NAMES, Control, Flag, Op, RingReader

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "shim" / "build"


@pytest.fixture(scope="module")
def built() -> Path:
    subprocess.run(["make", "-s", "-C", str(REPO / "shim"), "all", "build/test_shim"], check=True,
                   capture_output=True, timeout=300)
    return BUILD


@pytest.fixture
def serving(built: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    env = {**os.environ, "LD_PRELOAD": str(built / "libfailslow_shim.so"), "FAILSLOW_SHM_DIR": str(tmp_path),
           "FAILSLOW_JOB": "pyjob", "RANK": "3", "WORLD_SIZE": "4", "FAILSLOW_DP": "4"}
    p = subprocess.Popen([str(built / "test_shim"), "serve"], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    path = Path(p.stdout.readline().strip())
    try:
        yield p, path
    finally:
        if p.stdin:
            p.stdin.close()
        p.wait(timeout=30)
    assert p.returncode == 0
    assert not path.exists()  # removed at a clean exit


def test_python_reads_live_shim_ring(serving: tuple[subprocess.Popen[str], Path]) -> None:
    _p, path = serving
    r = RingReader(path)
    h = r.header
    assert (h.producer_name, h.job, h.rank, h.world_size, h.dp) == ("shim", "pyjob", 3, 4, 4)
    recs = r.read_new()
    assert [OP_NAMES[int(o)] for o in recs["op"]] == ["CommInit", *["AllGather"] * 10, "Send", "Recv"]
    ag = recs[1:11]
    assert ag["count"].tolist() == list(range(100, 110))
    assert (ag["bytes"] == ag["count"] * 2).all()  # bfloat16
    assert set(ag["comm"].tolist()) == {int(recs["comm"][0])}
    assert set(ag["nranks"].tolist()) == {4} and set(ag["comm_rank"].tolist()) == {1}
    assert (ag["t_enqueue_ns"] <= ag["t_return_ns"]).all()
    assert (recs["flags"][11:] & Flag.IN_GROUP).all() and recs["peer"][11:].tolist() == [2, 0]
    assert r.lost == 0


def test_shim_dump_prints_shim_records(serving: tuple[subprocess.Popen[str], Path], failslow_cmd: list[str]) -> None:
    _p, path = serving
    out = subprocess.run([*failslow_cmd, "shim-dump", "--dir", str(path.parent)], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    recs = [json.loads(x) for x in out]
    assert len(recs) == 13
    assert recs[1]["op"] == "AllGather" and recs[1]["dtype"] == "bfloat16" and recs[1]["rank"] == 3
    assert recs[1]["producer"] == "shim" and recs[1]["stream"] == 0x99
    assert recs[12]["op"] == "Recv" and recs[12]["peer"] == 0


def test_python_controller_suspends_and_releases(serving: tuple[subprocess.Popen[str], Path]) -> None:
    p, path = serving
    assert p.stdin is not None and p.stdout is not None
    r = RingReader(path)
    r.read_new()
    r.set_control(Control.SUSPEND)
    p.stdin.write("4242\n")
    p.stdin.flush()
    deadline = time.monotonic() + 20
    while r.header.suspended != 1:  # the hooked call is being held
        assert time.monotonic() < deadline, "the shim never reported a held call"
        time.sleep(0.005)
    assert len(r.read_new()) == 0  # held before the call, so nothing recorded yet
    r.set_control(0)
    assert p.stdout.readline().strip() == "done"
    recs = r.read_new()
    assert len(recs) == 1
    assert int(recs["op"][0]) == Op.ALLREDUCE and int(recs["count"][0]) == 4242
    assert int(recs["flags"][0]) & Flag.SUSPENDED and not int(recs["flags"][0]) & Flag.SUSPEND_TIMEOUT
    assert r.header.suspended == 0


# The record clock forced each way (the TSC path exists on x86-64 and aarch64 only).
CLOCKS = ["monotonic", *(["tsc"] if platform.machine() in ("x86_64", "aarch64") else [])]


@pytest.mark.parametrize("clock", CLOCKS)
def test_shim_times_agree_with_python_monotonic(built: Path, tmp_path: Path, clock: str) -> None:
    """Readers compare record times across processes: a call's entry/return times, taken by the shim in
    another process (from the TSC mapped onto CLOCK_MONOTONIC, or clock_gettime), must fall inside this
    process's time.monotonic_ns() bracket around the request and the reply."""
    env = {**os.environ, "LD_PRELOAD": str(built / "libfailslow_shim.so"), "FAILSLOW_SHM_DIR": str(tmp_path),
           "FAILSLOW_CLOCK": clock}
    p = subprocess.Popen([str(built / "test_shim"), "serve"], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdin is not None and p.stdout is not None
    try:
        r = RingReader(Path(p.stdout.readline().strip()))
        assert r.header.clock_name == clock
        r.read_new()
        tol = 5_000  # ns: the TSC mapping's bound in docs/shim.md is < 1 us; measured ~50 ns
        for i in range(20):
            t0 = time.monotonic_ns()
            p.stdin.write(f"{i}\n")
            p.stdin.flush()
            assert p.stdout.readline().strip() == "done"
            t1 = time.monotonic_ns()
            rec = r.read_new()
            assert len(rec) == 1 and int(rec["count"][0]) == i
            te, tr = int(rec["t_enqueue_ns"][0]), int(rec["t_return_ns"][0])
            assert t0 - tol <= te <= tr <= t1 + tol, (t0, te, tr, t1)
            time.sleep(0.002)  # longer than a piece of the TSC mapping: the next call re-anchors
    finally:
        p.stdin.close()
        p.wait(timeout=30)
    assert p.returncode == 0

"""The torch.distributed hook on a real 3-process gloo job on loopback: every call recorded, exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from failslow.record import OP_NAMES, Flag, RingReader, find_rings, read_header
from failslow_cli.stack.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.testbed]

JOB = Path(__file__).with_name("torchhook_job.py")
WS = 3  # three processes: groups of 3, 2 (pair) and 1 (odd ranks), p2p in a ring; one torch import each
ODD = [r for r in range(WS) if r % 2 == 1]


@pytest.fixture(scope="module")
def gloo_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("out")
    rings = tmp_path_factory.mktemp("rings")
    port = free_port()
    procs = []
    for r in range(WS):
        env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(WS), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "FAILSLOW_TORCH_HOOK": "1", "FAILSLOW_SHM_DIR": str(rings),
               "FAILSLOW_JOB": "hooktest", "FAILSLOW_KEEP_RINGS": "1", "FAILSLOW_DP": str(WS), "OUT": str(out),
               "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(JOB)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        try:
            o, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append(o)
    for r, (p, o) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, f"rank {r} failed:\n{o}"
    return out, rings


def _load(out: Path, rings: Path, rank: int) -> tuple[dict[str, Any], np.ndarray, Any]:
    meta = json.loads((out / f"rank{rank}.json").read_text())
    assert meta["installed"] is True
    path = Path(meta["ring"])
    assert path.parent == rings
    assert path.name == f"failslow-{meta['pid']}.ring"
    r = RingReader(path)
    recs = r.read_new()
    assert r.lost == 0
    hdr = r.header
    r.close()
    return meta, recs, hdr


def test_headers_identify_the_ranks(gloo_job: tuple[Path, Path]) -> None:
    _out, rings = gloo_job
    paths = find_rings(rings)
    assert len(paths) == WS
    hdrs = sorted((read_header(p) for p in paths), key=lambda h: h.rank)
    assert [h.rank for h in hdrs] == list(range(WS))
    for h in hdrs:
        assert (h.world_size, h.job, h.producer_name, h.dp) == (WS, "hooktest", "torch", WS)
        assert (h.dropped, h.overwritten) == (0, 0)


def test_every_call_recorded_with_correct_fields(gloo_job: tuple[Path, Path]) -> None:
    out, rings = gloo_job
    comm_of: dict[tuple[int, str], int] = {}
    for rank in range(WS):
        meta, recs, _hdr = _load(out, rings, rank)
        log = meta["log"]
        np.testing.assert_array_equal(recs["seq"], np.arange(1, len(recs) + 1))
        # the logged script, then all_gather_object = two all_gathers (sizes, payload), then the last barrier
        assert len(recs) == len(log) + 3
        tail = [OP_NAMES[int(o)] for o in recs["op"][len(log):]]
        assert tail == ["AllGather", "AllGather", "Barrier"]
        sizes = {"world": WS, "pair": 2, "odd": len(ODD)}
        for i, (rec, exp) in enumerate(zip(recs[: len(log)], log, strict=True)):
            where = f"rank {rank} call {i} {exp['op']}"
            assert OP_NAMES[int(rec["op"])] == exp["op"], where
            assert int(rec["count"]) == exp["count"], where
            assert int(rec["bytes"]) == exp["bytes"], where
            assert int(rec["peer"]) == exp["peer"], where
            assert int(rec["nranks"]) == sizes[exp["group"]], where
            flags = int(rec["flags"])
            assert flags & Flag.HOST_TIMES, where
            assert not flags & Flag.ERROR, where
            assert bool(flags & Flag.IN_GROUP) == bool(exp.get("in_group")), where
            # host times lie inside the caller's own bracket around the call
            assert exp["t0"] <= rec["t_enqueue_ns"] <= rec["t_start_ns"], where
            assert rec["t_start_ns"] <= rec["t_return_ns"] <= exp["t1"], where
            assert rec["t_end_ns"] >= rec["t_start_ns"], where
            if not flags & Flag.ASYNC:
                assert rec["t_end_ns"] <= exp["t1"], where
            key = (int(rec["nranks"]), exp["group"])
            comm_of.setdefault(key, int(rec["comm"]))
            assert comm_of[key] == int(rec["comm"]), f"{where}: comm id differs between ranks"
        if rank in (0, 1):
            pair = [r for r, e in zip(recs, log, strict=False) if e["group"] == "pair"]
            assert int(pair[0]["comm_rank"]) == rank
        if rank in ODD:
            odd = [r for r, e in zip(recs, log, strict=False) if e["group"] == "odd"]
            assert int(odd[0]["comm_rank"]) == ODD.index(rank)
        world = [r for r, e in zip(recs, log, strict=False) if e["group"] == "world"]
        assert {int(r["comm_rank"]) for r in world} == {rank}
    assert len(set(comm_of.values())) == 3  # world, pair, odd: three distinct stable ids


def test_end_times_capture_waiting(gloo_job: tuple[Path, Path]) -> None:
    """A straggler's 0.3 s delay shows up in its peers' records: end means completion, not issue."""
    out, rings = gloo_job
    for rank in range(WS - 1):
        _meta, recs, _ = _load(out, rings, rank)
        second_allreduce = recs[1]
        # >= 0.25 s, not 0.3: a peer may enter the collective a little after the straggler began its delay
        assert second_allreduce["t_end_ns"] - second_allreduce["t_start_ns"] >= 250_000_000
    meta, recs, _ = _load(out, rings, 0)
    i = next(i for i, e in enumerate(meta["log"]) if e["op"] == "Recv" and e["group"] == "world"
             and not e.get("in_group"))
    rec = recs[i]
    # irecv(...).wait(): the send left rank 1 only 0.3 s after its recv; the end is observed at wait()
    assert int(rec["flags"]) & Flag.ASYNC
    assert int(rec["flags"]) & Flag.END_AT_WAIT
    assert rec["t_end_ns"] - rec["t_enqueue_ns"] >= 250_000_000
    assert rec["t_return_ns"] < rec["t_end_ns"]  # irecv returned at once; completion came later
    async_ar = recs[2]
    assert int(async_ar["flags"]) & Flag.ASYNC and not int(async_ar["flags"]) & Flag.END_AT_WAIT


def test_install_from_env_is_opt_in_and_install_is_idempotent(gloo_job: tuple[Path, Path]) -> None:
    """Checked inside each rank process (one torch import per process keeps this test cheap)."""
    out, _rings = gloo_job
    for rank in range(WS):
        checks = json.loads((out / f"rank{rank}.json").read_text())["checks"]
        assert checks["torch_imported_early"] is False  # importing the hook module does not import torch
        assert checks["off_without_env"] is True
        assert "power of two" in checks["bad_capacity"]
        assert checks["still_off"] is True
        assert checks["wrapped_both_modules"] is True  # and a second install() changed nothing
        assert checks["restored"] is True  # uninstall() puts the original functions back
        assert checks["wrap_needs_install"] is True  # wrap() before install() is an error, not a silent no-op
        assert checks["wrap_is_hooked"] is True

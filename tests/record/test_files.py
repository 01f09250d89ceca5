"""Ring files: identity from the environment, discovery, whether a producer is alive."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from failslow.errors import InputError
from failslow.record import RingWriter, env_identity, find_rings, process_alive, read_header


def test_header_identity_from_env(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "991", "TORCHELASTIC_RUN_ID": "x", "SLURM_PROCID": "6", "SLURM_NTASKS": "16",
           "LOCAL_RANK": "2", "SLURM_NODEID": "3", "FAILSLOW_TP": "2", "FAILSLOW_PP": "4", "FAILSLOW_DP": "2"}
    w = RingWriter.create(directory=tmp_path, capacity=16, env=env)
    h = read_header(w.path)
    assert (h.job, h.rank, h.world_size, h.local_rank, h.node_id) == ("991", 6, 16, 2, 3)
    assert h.layout() == {"tp": 2, "pp": 4, "dp": 2, "cp": 0}
    assert h.pid == os.getpid()
    assert abs(h.wall_ns(time.monotonic_ns()) - time.time_ns()) < 10**9
    env2 = {"FAILSLOW_JOB": "mine", "SLURM_JOB_ID": "991", "RANK": "1", "WORLD_SIZE": "2"}
    assert env_identity(env2)["job"] == "mine"
    assert env_identity({"TORCHELASTIC_RUN_ID": "te"})["job"] == "te"
    with pytest.raises(InputError, match="RANK"):
        env_identity({"RANK": "zero"})


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

"""Nothing is left behind: SIGTERM cleans up on the way out; after SIGKILL, `failslow testbed cleanup` does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from testbed.state import StateFile, leftovers, pid_alive

pytestmark = [pytest.mark.integration, pytest.mark.testbed]

ROOT = os.geteuid() == 0


def _start(cmd: list[str], run_dir: Path, tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    args = [*cmd, "testbed", "run", "--dp", "2", "--pp", "1", "--iterations", "1000", "--layers", "2",
            "--d-model", "64",
            "--report", str(tmp_path / "r.json"), "--run-dir", str(run_dir)]
    if ROOT:
        args += ["--inject", "cpu:rank=1,quota=0.5", "--inject", "link:node=0,rate=200mbit"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    progress = run_dir / "progress" / "rank0.jsonl"
    while time.monotonic() < deadline:
        if progress.exists() and sum(1 for line in progress.read_text().splitlines() if '"it"' in line) >= 2:
            break
        if proc.poll() is not None:
            raise AssertionError(f"job ended early: {proc.communicate()[1]}")
        time.sleep(0.1)
    else:
        proc.kill()
        raise AssertionError("job did not start")
    prefix = json.loads((run_dir / "testbed.json").read_text())["prefix"]
    return proc, prefix


def _wait_gone(pids: list[int], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_nothing_left_behind(failslow_cmd: list[str], tmp_path: Path, how: str) -> None:
    run_dir = tmp_path / "run"
    proc, prefix = _start(failslow_cmd, run_dir, tmp_path)
    running = leftovers(prefix)
    assert len(running["processes"]) >= 3  # the zygote and both ranks
    if ROOT:
        assert len(running["namespaces"]) == 3 and running["cgroups"] == [f"{prefix}job"]
    pids = [int(p) for p in running["processes"]]
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        assert proc.returncode != 0
    else:
        proc.kill()
        proc.wait(timeout=10)
        _wait_gone(pids)  # ranks die with the launcher (parent-death signal through the zygote)
        assert not any(pid_alive(p) for p in pids)
        if ROOT:
            assert leftovers(prefix)["namespaces"], "namespaces survive a SIGKILL until cleanup"
        p = subprocess.run([*failslow_cmd, "testbed", "cleanup"], capture_output=True, text=True, timeout=60,
                           check=False)
        assert p.returncode == 0, p.stderr
        assert set(json.loads(p.stdout)) == {"processes", "namespaces", "cgroups", "state_files", "run_dirs"}
        # (another testbed starting meanwhile may have swept them first: the end state is what counts)
    _wait_gone(pids)
    assert leftovers(prefix) == {"namespaces": [], "cgroups": [], "processes": []}
    assert not StateFile.for_owner(proc.pid).path.exists()

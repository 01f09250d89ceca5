"""The testbed's dedicated-device emulation that the what-if validation runs on.

`--device-speed` paces each rank's compute ops to CPU time / speed; `--cpu-cap` caps every rank's
cgroup; a CPU fault lowers one rank's quota and must put the base cap back when it ends (not lift
every limit). The job test (a real capped job whose CPU fault puts the base cap back) is in
tests/integration/test_testbed_run.py beside the other real jobs.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from failslow.errors import InputError
from testbed.launcher import JobConfig, Testbed
from testbed.worker import Rank


def _burn_cpu(seconds: float) -> None:
    end = time.thread_time() + seconds
    a = torch.randn(64, 64)
    while time.thread_time() < end:
        a = torch.tanh(a @ a)


@pytest.mark.parametrize("speed", [0.5, 0.25])
def test_pace_stretches_a_compute_op_to_its_cpu_time_over_the_speed(speed: float) -> None:
    rank = SimpleNamespace(cfg={"device_speed": speed})
    t0, c0 = time.monotonic(), time.thread_time()
    _burn_cpu(0.02)
    cpu = time.thread_time() - c0
    Rank._pace(rank, t0, c0)  # type: ignore[arg-type]
    # a lower bound the sleep guarantees (not a timing measurement): the op lasts >= CPU time / speed
    assert time.monotonic() - t0 >= cpu / speed


def test_pace_is_off_by_default() -> None:
    rank = SimpleNamespace(cfg={})
    t0, c0 = time.monotonic(), time.thread_time()
    _burn_cpu(0.01)
    before = time.monotonic()
    Rank._pace(rank, t0 - 100.0, c0 - 100.0)  # type: ignore[arg-type]  # would sleep for minutes if on
    assert time.monotonic() - before < 5.0


@pytest.mark.parametrize(("config", "faults", "message"), [
    (JobConfig(cpu_cap=0.4), ["cpu:rank=1,quota=0.4"], "not below the ranks' base cap of 0.4"),
    (JobConfig(device_speed=0.3), ["cpu:rank=0,quota=0.35"], "not below the ranks' base cap of 0.3"),
    (JobConfig(cpu_cap=0.5, device_speed=0.4), ["cpu:rank=2,quota=0.45"], "base cap of 0.4"),
    (JobConfig(cpu_cap=0.4), ["poisson:mean_gap=5,mean_dur=1,kinds=cpu,quota=0.5"], "poisson cpu quota 0.5"),
    (JobConfig(cpu_cap=0.0), [], "cpu cap must be in"),
    (JobConfig(cpu_cap=0.4, cpu_weight=0), [], "needs the job's cgroups"),
    (JobConfig(device_speed=1.5), [], "device speed must be in"),
    (JobConfig(cpu_period_us=500), [], "cpu period must be in"),
])
def test_bad_caps_and_fault_quotas_are_refused(config: JobConfig, faults: list[str], message: str) -> None:
    with pytest.raises(InputError, match=message):
        Testbed(config, faults)


def test_cli_refuses_a_fault_quota_above_the_device_speed(failslow_cmd: list[str], tmp_path: Path) -> None:
    p = subprocess.run([*failslow_cmd, "testbed", "run", "--iterations", "4", "--device-speed", "0.3",
                        "--inject", "cpu:rank=1,quota=0.5", "--report", str(tmp_path / "r.json")],
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 2, p.stderr
    assert "quota 0.5 CPUs is not below the ranks' base cap of 0.3" in p.stderr
    assert not (tmp_path / "r.json").exists()

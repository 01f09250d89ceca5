"""The testbed's dedicated-device emulation that the what-if validation runs on.

`--device-speed` paces each rank's compute ops to CPU time / speed; `--cpu-cap` caps every rank's
cgroup; a CPU fault lowers one rank's quota and must put the base cap back when it ends (not lift
every limit). The job test starts real rank processes, cgroups and namespaces (needs root).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from failslow.errors import InputError
from testbed.launcher import JobConfig, Testbed
from testbed.state import leftovers
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


def _allowed_cpus(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


def _wait_until(tb: Testbed, done: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while tb.completed() < done:
        if time.monotonic() > deadline:
            raise TimeoutError(f"job did not reach iteration {done}")
        tb.poll()
        time.sleep(0.05)


def test_capped_job_fault_restores_the_base_cap_and_cleanup_removes_the_cgroups(tmp_path: Path) -> None:
    assert os.geteuid() == 0, "the CPU cap needs root (cgroup v1 cpu controller)"
    cfg = JobConfig(dp=2, pp=1, iterations=14, micro_batches=2, cpu_cap=0.45, cpu_period_us=10_000,
                    pin_cpus=True, device_speed=0.45)
    seen: dict[str, object] = {}
    with Testbed(cfg, run_dir=tmp_path / "run") as tb:
        tb.start()
        _wait_until(tb, 3)
        cgs = [tb.rank_cgroup(r) for r in range(2)]
        assert all(cg is not None for cg in cgs)
        seen["quotas"] = [cg.quota() for cg in cgs if cg is not None]
        seen["periods"] = [int((cg.path / "cpu.cfs_period_us").read_text()) for cg in cgs if cg is not None]
        seen["in_cgroup"] = [tb.procs[r].pid in cg.pids() for r, cg in enumerate(cgs) if cg is not None]
        seen["threads"] = [len(os.listdir(f"/proc/{tb.procs[r].pid}/task")) for r in range(2)]
        seen["cpus"] = [{_allowed_cpus(int(t)) for t in os.listdir(f"/proc/{tb.procs[r].pid}/task")}
                        for r in range(2)]
        fault = tb.inject("cpu:rank=1,quota=0.2")
        cg1 = cgs[1]
        assert cg1 is not None
        seen["on"] = (cg1.quota(), int((cg1.path / "cpu.cfs_period_us").read_text()))
        _wait_until(tb, tb.completed() + 2)
        tb.remove(fault)
        seen["off"] = cg1.quota()
        seen["other"] = cgs[0].quota() if cgs[0] is not None else None
        paths = [cg.path for cg in cgs if cg is not None]
        rep = tb.wait()
    assert seen["quotas"] == [0.45, 0.45] and seen["periods"] == [10_000, 10_000]
    assert seen["in_cgroup"] == [True, True]
    # every thread of a rank (gloo's included) on one CPU, rank by rank round-robin
    usable = sorted(os.sched_getaffinity(0))
    assert seen["cpus"] == [{str(usable[r % len(usable)])} for r in range(2)], seen["cpus"]
    assert all(n > 1 for n in seen["threads"])  # the check above covered more than the main thread
    assert seen["on"] == (0.2, 10_000)
    assert seen["off"] == 0.45 and seen["other"] == 0.45  # the base cap back, not unlimited
    assert [f["kind"] for f in rep["faults"]] == ["cpu"]
    assert all(len(v) == 14 for v in rep["iteration_time_s"].values())
    assert not any(p.exists() for p in paths)
    assert leftovers(rep["prefix"]) == {"namespaces": [], "cgroups": [], "processes": []}

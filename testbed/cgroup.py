"""cgroup v1 CPU quota for one or more processes: the "slow compute" fault and a CPU cap.

A :class:`CpuCgroup` is a directory under ``/sys/fs/cgroup/cpu`` named with the testbed prefix.
Processes are moved in with ``cgroup.procs`` (all their threads follow, and threads they start
later inherit it). ``set_quota(0.3)`` writes ``cpu.cfs_quota_us = 0.3 × cpu.cfs_period_us``: the
processes together get at most 30 % of one CPU per period. ``clear_quota()`` writes -1 (no limit).
:meth:`destroy` moves the processes back to the cgroup they came from and removes the directory.

Usage (as root)::

    cg = CpuCgroup.create("rank3")
    cg.add(pid)
    cg.set_quota(0.3)
    ...
    cg.destroy()
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from testbed.state import CGROUP_CPU_ROOT, StateFile, new_prefix, remove_cgroup

DEFAULT_PERIOD_US = 100_000


class CgroupError(RuntimeError):
    """The cgroup v1 cpu controller is missing or refused a write."""


def cpu_controller_available(root: Path = CGROUP_CPU_ROOT) -> bool:
    """Whether a writable cgroup v1 cpu hierarchy with CFS quota exists."""
    return (root / "cpu.cfs_quota_us").exists() and (root / "cgroup.procs").exists()


def current_cgroup(pid: int, root: Path = CGROUP_CPU_ROOT) -> Path:
    """The cpu cgroup directory `pid` is in now (from /proc/<pid>/cgroup)."""
    try:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, rel = line.split(":", 2)
            if "cpu" in controllers.split(","):
                return root / rel.lstrip("/")
    except OSError as exc:
        raise CgroupError(f"cannot read cgroup of pid {pid}: {exc}") from exc
    return root


@dataclass
class CpuCgroup:
    """One cpu cgroup; create with :meth:`create`."""

    path: Path
    state: StateFile | None = field(default=None, repr=False)
    _origin: dict[int, Path] = field(default_factory=dict, repr=False)

    @classmethod
    def create(cls, name: str, *, prefix: str | None = None, root: Path = CGROUP_CPU_ROOT,
               state: StateFile | None = None) -> CpuCgroup:
        """Create ``<root>/<prefix><name>`` (prefix default ``fsltb<pid>-<k>-``).

        Raises:
            CgroupError: no cgroup v1 cpu controller, or not permitted.
        """
        if not cpu_controller_available(root):
            raise CgroupError(f"no cgroup v1 cpu controller with CFS quota at {root}")
        path = root / f"{prefix or new_prefix()}{name}"
        state = state or StateFile.for_owner()
        state.add("cgroups", str(path))
        try:
            path.mkdir(exist_ok=True)
        except OSError as exc:
            state.remove("cgroups", str(path))
            raise CgroupError(f"cannot create {path}: {exc}") from exc
        return cls(path=path, state=state)

    def _write(self, fname: str, value: str | int) -> None:
        try:
            (self.path / fname).write_text(str(value))
        except OSError as exc:
            raise CgroupError(f"write {value} to {self.path / fname}: {exc}") from exc

    def add(self, pid: int) -> None:
        """Move process `pid` (all its threads) into this cgroup, remembering where it was."""
        if pid not in self._origin:
            self._origin[pid] = current_cgroup(pid)
        self._write("cgroup.procs", pid)

    def release(self, pid: int) -> None:
        """Move `pid` back to the cgroup it came from (no error if it has exited)."""
        origin = self._origin.pop(pid, CGROUP_CPU_ROOT)
        with contextlib.suppress(OSError):
            (origin / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        """Processes in this cgroup now."""
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def set_quota(self, cpus: float, period_us: int = DEFAULT_PERIOD_US) -> None:
        """Cap the cgroup at `cpus` CPUs (0.3 = 30 % of one CPU) per CFS period."""
        if not cpus > 0:
            raise CgroupError(f"quota must be > 0 CPUs, got {cpus}")
        quota = max(1000, round(cpus * period_us))
        self.set_period(period_us)
        self._write("cpu.cfs_quota_us", quota)

    def set_period(self, period_us: int) -> None:
        """Set the CFS period a quota set later is counted in (the quota, or no limit, stays)."""
        self._write("cpu.cfs_period_us", period_us)

    def set_shares(self, shares: int) -> None:
        """CFS weight against sibling cgroups and root-level tasks (1024 = one ordinary process)."""
        self._write("cpu.shares", max(2, int(shares)))

    def child(self, name: str) -> CpuCgroup:
        """Create a sub-cgroup (removed with this one)."""
        path = self.path / name
        try:
            path.mkdir(exist_ok=True)
        except OSError as exc:
            raise CgroupError(f"cannot create {path}: {exc}") from exc
        return CpuCgroup(path=path)

    def clear_quota(self) -> None:
        """Remove the cap (quota -1)."""
        self._write("cpu.cfs_quota_us", -1)

    def period_us(self) -> int:
        """The CFS period the cgroup runs with now (its quota is counted per period)."""
        try:
            return int((self.path / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError) as exc:
            raise CgroupError(f"cannot read the CFS period of {self.path}: {exc}") from exc

    def quota(self) -> float | None:
        """The cap in CPUs, or None when unlimited."""
        q = int((self.path / "cpu.cfs_quota_us").read_text())
        p = int((self.path / "cpu.cfs_period_us").read_text())
        return None if q < 0 else q / p

    def destroy(self) -> None:
        """Move every process back where it came from and remove the cgroup (idempotent)."""
        for pid in self.pids():
            self.release(pid)
        remove_cgroup(self.path)
        if self.state is not None:
            self.state.remove("cgroups", str(self.path))

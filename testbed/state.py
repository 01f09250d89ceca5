"""Crash-safe record of what a testbed created, and cleanup of stale testbed resources.

Every namespace, cgroup and process a testbed creates is first written to a small JSON state file
(one per owning process) under ``/run/failslow-testbed`` (``/tmp/failslow-testbed`` when /run is
not writable). If the owner dies without cleaning up (SIGKILL, power loss of the shell),
:func:`cleanup` finds the file, sees the owner is gone and removes everything listed, then sweeps
anything else carrying the ``fsltb<pid>-`` prefix of a dead owner. Resources of live owners are left
alone unless ``everything=True``: the machine is shared and other testbeds may be running.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "fsltb"
ENV_PREFIX = "FAILSLOW_TESTBED_PREFIX"
RUN_DIR_PREFIX = "failslow-testbed-"  # temporary run directories (tempfile.mkdtemp prefix)
CGROUP_CPU_ROOT = Path("/sys/fs/cgroup/cpu")
_counter = itertools.count()


def state_dir() -> Path:
    """Directory holding the state files (created on demand)."""
    for cand in (Path("/run/failslow-testbed"), Path(f"/tmp/failslow-testbed-{os.geteuid()}")):
        try:
            cand.mkdir(parents=True, exist_ok=True)
            if os.access(cand, os.W_OK):
                return cand
        except OSError:
            continue
    raise OSError("no writable state directory for the testbed")


def new_prefix() -> str:
    """A fresh resource-name prefix unique on this machine: ``fsltb<pid>-<k>-``."""
    return f"{PREFIX}{os.getpid()}-{next(_counter)}-"


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (zombies count as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@dataclass
class StateFile:
    """The JSON record of one owner's resources: ``{"owner_pid", "namespaces", "cgroups", "pids"}``."""

    path: Path
    owner_pid: int = field(default_factory=os.getpid)

    @classmethod
    def for_owner(cls, pid: int | None = None) -> StateFile:
        """The state file of process `pid` (default: this process)."""
        pid = os.getpid() if pid is None else pid
        return cls(path=state_dir() / f"{PREFIX}{pid}.json", owner_pid=pid)

    def _update(self, fn: Any) -> dict[str, Any]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            text = f.read()
            data: dict[str, Any] = json.loads(text) if text.strip() else {}
            data.setdefault("owner_pid", self.owner_pid)
            for key in ("namespaces", "cgroups", "pids"):
                data.setdefault(key, [])
            fn(data)
            f.seek(0)
            f.truncate()
            json.dump(data, f)
            f.flush()
        return data

    def add(self, kind: str, item: str | int) -> None:
        """Record that a resource of `kind` (namespaces|cgroups|pids) is about to exist."""
        self._update(lambda d: d[kind].append(item) if item not in d[kind] else None)

    def remove(self, kind: str, item: str | int) -> None:
        """Forget a resource that has been removed; drops the file when nothing is left."""
        data = self._update(lambda d: d[kind].remove(item) if item in d[kind] else None)
        if not any(data[k] for k in ("namespaces", "cgroups", "pids")):
            with contextlib.suppress(OSError):
                self.path.unlink()

    def read(self) -> dict[str, Any]:
        """Current contents (empty lists when the file does not exist)."""
        try:
            data: dict[str, Any] = json.loads(self.path.read_text() or "{}")
        except (OSError, json.JSONDecodeError):
            data = {}
        for key in ("namespaces", "cgroups", "pids"):
            data.setdefault(key, [])
        return data


def _owner_of(name: str) -> int | None:
    m = re.match(re.escape(PREFIX) + r"(\d+)-", name)
    return int(m.group(1)) if m else None


def _process_prefix(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    key = ENV_PREFIX.encode() + b"="
    for item in env:
        if item.startswith(key):
            return item[len(key):].decode(errors="replace")
    return None


def testbed_processes() -> dict[int, str]:
    """pid -> prefix of every live process started by a testbed (found by its environment)."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            prefix = _process_prefix(int(entry.name))
            if prefix is not None and pid_alive(int(entry.name)):
                found[int(entry.name)] = prefix
    return found


def kill_process(pid: int, prefix: str | None = None, grace_s: float = 3.0) -> bool:
    """SIGTERM then SIGKILL one testbed process; checks the prefix first so a reused pid is spared."""
    if prefix is not None and _process_prefix(pid) != prefix:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.05)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return True


def remove_cgroup(path: Path, root: Path = CGROUP_CPU_ROOT) -> bool:
    """Move any tasks to the root cpu cgroup and delete the cgroup directory (children first)."""
    if not path.is_dir():
        return False
    for child in path.iterdir():
        if child.is_dir():
            remove_cgroup(child, root)
    with contextlib.suppress(OSError):
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(pid)
    for _ in range(20):
        try:
            path.rmdir()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def _list_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def cleanup(*, everything: bool = False) -> dict[str, list[str]]:
    """Remove testbed processes, namespaces (with their qdiscs) and cgroups.

    Args:
        everything: also remove resources of owners that are still alive (use with care on a
            shared machine; the default only removes what dead owners left behind).

    Returns:
        What was removed, by kind.
    """
    removed: dict[str, list[str]] = {"processes": [], "namespaces": [], "cgroups": [], "state_files": [],
                                     "run_dirs": []}

    def stale(owner: int | None) -> bool:
        return everything or (owner is not None and not pid_alive(owner))

    for pid, prefix in testbed_processes().items():
        if stale(_owner_of(prefix)) and kill_process(pid, prefix):
            removed["processes"].append(str(pid))
    for name in _list_namespaces():
        if name.startswith(PREFIX) and stale(_owner_of(name)):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
            removed["namespaces"].append(name)
    if CGROUP_CPU_ROOT.is_dir():
        for cg in CGROUP_CPU_ROOT.iterdir():
            if cg.is_dir() and cg.name.startswith(PREFIX) and stale(_owner_of(cg.name)) and remove_cgroup(cg):
                removed["cgroups"].append(cg.name)
    with contextlib.suppress(OSError):
        for sf in state_dir().glob(f"{PREFIX}*.json"):
            owner = _owner_of(sf.stem + "-")
            if stale(owner):
                data = StateFile(path=sf).read()
                for name in data["namespaces"]:
                    if subprocess.run(["ip", "netns", "delete", name], capture_output=True,
                                      check=False).returncode == 0:
                        removed["namespaces"].append(name)
                for cg in data["cgroups"]:
                    if remove_cgroup(Path(cg)):
                        removed["cgroups"].append(Path(cg).name)
                with contextlib.suppress(OSError):
                    sf.unlink()
                removed["state_files"].append(sf.name)
    for d in Path(tempfile.gettempdir()).glob(RUN_DIR_PREFIX + "*"):
        if d.is_dir() and _stale_run_dir(d, everything):
            shutil.rmtree(d, ignore_errors=True)
            removed["run_dirs"].append(str(d))
    return removed


def _stale_run_dir(d: Path, everything: bool) -> bool:
    # temporary run directories of jobs whose launcher is gone (a SIGKILL skips their removal)
    try:
        owner = int(json.loads((d / "testbed.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        try:  # not started far enough to say who owns it: only when clearly abandoned
            return time.time() - d.stat().st_mtime > 3600
        except OSError:
            return False
    return everything or not pid_alive(owner)


def leftovers(prefix: str = PREFIX) -> dict[str, list[str]]:
    """Every namespace, cgroup and process whose name/environment starts with `prefix` (for tests)."""
    return {
        "namespaces": sorted(n for n in _list_namespaces() if n.startswith(prefix)),
        "cgroups": sorted(c.name for c in CGROUP_CPU_ROOT.iterdir() if c.is_dir() and c.name.startswith(prefix))
        if CGROUP_CPU_ROOT.is_dir() else [],
        "processes": sorted(str(p) for p, pre in testbed_processes().items() if pre.startswith(prefix)),
    }

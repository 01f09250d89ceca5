"""Where rings live and who writes them: the process identity from the environment, ring file paths and
discovery, the header of a ring file, and whether its producer still runs.

Rings are ``$FAILSLOW_SHM_DIR/failslow-<pid>.ring`` (default ``/dev/shm``); a process with two producers
names the second one ``failslow-<pid>-<tag>.ring``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from failslow.errors import InputError
from failslow.record.layout import (
    DEFAULT_DIR,
    HEADER_SIZE,
    RING_PREFIX,
    RING_SUFFIX,
    RingHeader,
    parse_header,
)


def read_header(path: str | os.PathLike[str]) -> RingHeader:
    """Read and decode the header of the ring file at ``path``."""
    try:
        with open(path, "rb") as f:
            buf = f.read(HEADER_SIZE)
    except OSError as exc:
        raise InputError(f"cannot read ring {path}: {exc.strerror or exc}") from exc
    return parse_header(buf)


# --- identity from the environment ------------------------------------------------------------------


def _env_int(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for n in names:
        v = env.get(n, "").strip()
        if v:
            try:
                return int(v)
            except ValueError as exc:
                raise InputError(f"environment variable {n}={v!r} is not an integer") from exc
    return default


def env_identity(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Who this process is, from the launcher's environment (the same rules as the C shim).

    Job id: ``FAILSLOW_JOB``, else ``SLURM_JOB_ID``, else ``TORCHELASTIC_RUN_ID`` (else empty). Rank and
    world size: ``RANK``/``WORLD_SIZE``, else ``SLURM_PROCID``/``SLURM_NTASKS``. Local rank: ``LOCAL_RANK``
    or ``SLURM_LOCALID``. Node: ``FAILSLOW_NODE_ID``, ``SLURM_NODEID`` or ``GROUP_RANK``. Layout:
    ``FAILSLOW_TP/PP/DP/CP`` (0 = unknown).
    """
    e = os.environ if env is None else env
    job = ""
    for n in ("FAILSLOW_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        if e.get(n, "").strip():
            job = e[n].strip()
            break
    return {
        "job": job,
        "rank": _env_int(e, ("RANK", "SLURM_PROCID"), -1),
        "world_size": _env_int(e, ("WORLD_SIZE", "SLURM_NTASKS"), 0),
        "local_rank": _env_int(e, ("LOCAL_RANK", "SLURM_LOCALID"), -1),
        "node_id": _env_int(e, ("FAILSLOW_NODE_ID", "SLURM_NODEID", "GROUP_RANK"), -1),
        "tp": _env_int(e, ("FAILSLOW_TP",), 0),
        "pp": _env_int(e, ("FAILSLOW_PP",), 0),
        "dp": _env_int(e, ("FAILSLOW_DP",), 0),
        "cp": _env_int(e, ("FAILSLOW_CP",), 0),
    }


def ring_dir(directory: str | os.PathLike[str] | None = None) -> Path:
    """The ring directory: ``directory``, else ``$FAILSLOW_SHM_DIR``, else ``/dev/shm``."""
    if directory is not None:
        return Path(directory)
    return Path(os.environ.get("FAILSLOW_SHM_DIR") or DEFAULT_DIR)


def ring_path(pid: int, directory: str | os.PathLike[str] | None = None, tag: str = "") -> Path:
    """Path of the ring of process ``pid``: ``failslow-<pid>.ring`` (``failslow-<pid>-<tag>.ring`` with a tag).

    A tag is only used when one process has two producers (the C shim and the torch hook), which must
    not share a ring: the shim owns the untagged name.
    """
    name = f"{pid}-{tag}" if tag else f"{pid}"
    return ring_dir(directory) / f"{RING_PREFIX}{name}{RING_SUFFIX}"


def find_rings(directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """All ring files in the ring directory, sorted by name (files being created are not listed)."""
    d = ring_dir(directory)
    if not d.is_dir():
        return []
    return sorted(p for p in d.glob(f"{RING_PREFIX}*{RING_SUFFIX}") if p.is_file())


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a dead producer whose parent has not reaped it)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # state is the field after the parenthesised command name (which may contain spaces)
        return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] not in (b"Z", b"X")
    except (OSError, ValueError):
        return True

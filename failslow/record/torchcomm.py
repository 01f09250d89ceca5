"""Process-group bookkeeping of the torch.distributed hook: the hook's state (`_Hook`: originals, this
process's ring writer, what it knows about each group) and the stable communicator id of a group.

Used by `failslow.record.torchhook` (install) and `failslow.record.torchwrap` (the call wrappers).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from failslow.record.files import read_header, ring_path
from failslow.record.layout import Producer
from failslow.record.writer import RingWriter


@dataclass(frozen=True)
class CommInfo:
    """What the hook knows about one process group."""

    comm: int  # stable id, identical on every member rank
    nranks: int
    comm_rank: int
    global_to_group: Mapping[int, int]


def comm_id(group_name: str, ranks: list[int] | tuple[int, ...]) -> int:
    """Stable 64-bit communicator id of a process group, the same on every member.

    torch names groups in creation order (every rank calls ``new_group`` in the same order, so the
    ``group_name`` agrees) or by a hash of their ranks; adding the sorted global ranks keeps two
    groups apart even if a backend reuses names.
    """
    key = f"torch|{group_name}|{','.join(str(r) for r in sorted(ranks))}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


class _Hook:
    """State of the installed hook: originals, the ring writer, per-group facts."""

    def __init__(self, job: str | None, rank: int | None, layout: Any, directory: str | None,
                 capacity: int) -> None:
        self.job = job
        self.rank = rank
        self.layout = layout
        self.directory = directory
        self.capacity = capacity
        self.originals: dict[tuple[Any, str], Any] = {}
        self.writer: RingWriter | None = None
        self.writer_pid = 0
        self.writer_ok = False  # writer is this process's and usable; reset in forked children
        self.lock = threading.Lock()
        self.comms: dict[Any, CommInfo] = {}
        self.tls = threading.local()
        from torch.distributed import distributed_c10d

        self.c10d = distributed_c10d

    # -- ring ---------------------------------------------------------------------------------------
    def get_writer(self) -> RingWriter | None:
        """This process's ring writer, created at the first call; None if the ring cannot be made."""
        pid = os.getpid()
        if self.writer_pid == pid:
            return self.writer
        with self.lock:
            if self.writer_pid == pid:
                return self.writer
            import torch.distributed as dist

            rank, ws = self.rank, None
            if dist.is_available() and dist.is_initialized():
                rank = dist.get_rank() if rank is None else rank
                ws = dist.get_world_size()
            pid = os.getpid()
            # the C shim owns failslow-<pid>.ring; never share a ring with it
            tag = "torch" if _shim_ring_exists(pid, self.directory) else ""
            try:
                self.writer = RingWriter.create(directory=self.directory, job=self.job, rank=rank,
                                                world_size=ws, layout=self.layout, capacity=self.capacity,
                                                producer=Producer.TORCH, tag=tag)
            except Exception:  # tracking must never break training: give up recording in this process
                self.writer = None
            self.writer_pid = pid
            self.writer_ok = self.writer is not None
            return self.writer

    def after_fork_in_child(self) -> None:
        # the parent's ring belongs to the parent: the child makes its own at its first call
        self.writer = None
        self.writer_ok = False
        self.writer_pid = 0

    # -- groups -------------------------------------------------------------------------------------
    def comm_info(self, group: Any) -> CommInfo | None:
        if group is None:
            pg = self.c10d._world._default_pg
            if pg is None:
                return None
        else:
            pg = group
        info = self.comms.get(pg)
        if info is not None:
            return info
        import torch.distributed as dist

        c10d = self.c10d

        if pg == c10d.GroupMember.NON_GROUP_MEMBER:
            return None
        ranks = list(dist.get_process_group_ranks(pg))
        name = str(getattr(pg, "group_name", "") or c10d._world.pg_names.get(pg, ""))
        info = CommInfo(comm=comm_id(name, ranks), nranks=int(pg.size()), comm_rank=int(pg.rank()),
                        global_to_group={g: i for i, g in enumerate(ranks)})
        self.comms[pg] = info
        return info


def _shim_ring_exists(pid: int, directory: str | None) -> bool:
    # the shim creates its ring at the first NCCL call, which may come after ours: LD_PRELOAD tells us early
    if "failslow_shim" in os.environ.get("LD_PRELOAD", ""):
        return True
    p = ring_path(pid, directory)
    try:
        return read_header(p).producer == Producer.SHIM
    except Exception:
        return False

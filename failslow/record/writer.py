"""Producer side of a ring, in Python: `RingWriter` (used by the torch hook, tests and tools).

Commit protocol (never blocks the writer, never hands a torn record to a reader): the writer claims
sequence ``s = ++write_index``, stamps the slot ``s | BUSY``, writes the payload, then stamps ``s``.
A reader copies a record only when the stamp reads ``s`` before and after the copy (see
`failslow.record.reader`).

The Python writer serialises claims with a lock (it is one process's producer, threads included) and
stores the 8-byte stamp with a single native store; on x86-64 (total store order) that gives the same
guarantees as the C writer's release stores. Timestamps are CLOCK_MONOTONIC nanoseconds
(`time.monotonic_ns`); ``header.clock_offset_ns`` converts them to wall time.
"""

from __future__ import annotations

import mmap
import os
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from failslow.errors import InputError
from failslow.record.files import env_identity, ring_dir, ring_path
from failslow.record.layout import (
    _HDR,
    _HEADER_Q,
    _OFF_FLAGS,
    _OFF_PEER,
    _PAYLOAD,
    _RECORD_Q,
    DEFAULT_CAPACITY,
    HEADER_SIZE,
    RECORD_SIZE,
    STAMP_BUSY,
    Producer,
    _check_capacity,
    _layout_sizes,
    build_header,
)


class RingWriter:
    """Producer side of one process's ring (Python): used by the torch hook, tests and tools.

    Never blocks on a reader: claims are serialised by a short in-process lock, overflow overwrites the
    oldest record (counted in ``overwritten``), and a slot still held by an unfinished deferred record
    after a full wrap makes the new record be dropped (counted in ``dropped``).
    """

    def __init__(self, path: Path, mm: mmap.mmap, capacity: int) -> None:
        """Wrap an already initialised mapping; use `RingWriter.create`."""
        self.path = path
        self.capacity = capacity
        self._mask = capacity - 1
        self._mm = mm
        self._q = memoryview(mm).cast("B").cast("Q")  # native 8-byte stores for stamps and counters
        self._u32 = memoryview(mm).cast("B").cast("I")
        self._lock = threading.Lock()
        self._windex_q = _HDR["write_index"][1] // 8
        self._dropped_q = _HDR["dropped"][1] // 8
        self._over_q = _HDR["overwritten"][1] // 8
        self._control_i = _HDR["control"][1] // 4
        self._windex = int(self._q[self._windex_q])
        self._closed = False

    @classmethod
    def create(
        cls,
        *,
        directory: str | os.PathLike[str] | None = None,
        job: str | None = None,
        rank: int | None = -1,
        world_size: int | None = 0,
        layout: Any = None,
        capacity: int = DEFAULT_CAPACITY,
        producer: int = Producer.PYTHON,
        pid: int | None = None,
        env: Mapping[str, str] | None = None,
        tag: str = "",
    ) -> RingWriter:
        """Create (or replace) the ring file of this process and return its writer.

        Unset identity fields (``job=None``, ``rank=-1``/``None``, ``world_size=0``/``None``,
        ``layout=None``) are filled from the environment (`env_identity`). The file is written under a
        temporary name and renamed, so readers never see a half-written header. ``tag`` names a second
        ring of the same process (see `ring_path`).

        Raises:
            InputError: bad capacity or layout, or the directory is not writable.
        """
        ident = env_identity(env)
        cap = _check_capacity(capacity)
        lay = _layout_sizes(layout) or {k: ident[k] for k in ("tp", "pp", "dp", "cp")}
        pid = os.getpid() if pid is None else pid
        mono = time.monotonic_ns()
        offset = time.time_ns() - mono
        hdr = build_header(
            capacity=cap,
            pid=pid,
            job=ident["job"] if job is None else str(job),
            rank=ident["rank"] if rank is None or rank < 0 else int(rank),
            world_size=ident["world_size"] if not world_size else int(world_size),
            local_rank=ident["local_rank"],
            layout=lay,
            node_id=ident["node_id"],
            hostname=socket.gethostname(),
            producer=producer,
            clock_offset_ns=offset,
            created_mono_ns=mono,
        )
        d = ring_dir(directory)
        final = ring_path(pid, d, tag)
        tmp = d / f".{final.name}.{threading.get_ident()}.tmp"
        size = HEADER_SIZE + cap * RECORD_SIZE
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as exc:
            raise InputError(f"cannot create ring in {d}: {exc.strerror or exc}") from exc
        try:
            os.ftruncate(fd, size)
            # reserve the pages: writing a sparse page of a full tmpfs would be a SIGBUS in the producer
            os.posix_fallocate(fd, 0, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise InputError(f"cannot size ring {tmp}: {exc.strerror or exc}") from exc
        os.close(fd)
        mm[:HEADER_SIZE] = hdr
        os.replace(tmp, final)
        return cls(final, mm, cap)

    def _claim(self) -> tuple[int, int] | None:
        q = self._q
        with self._lock:
            self._windex += 1
            s = self._windex
            q[self._windex_q] = s
            qi = _HEADER_Q + ((s - 1) & self._mask) * _RECORD_Q
            old = q[qi]
            if old & STAMP_BUSY or old >= s:
                q[self._dropped_q] += 1
                return None
            q[qi] = s | STAMP_BUSY
            if old:  # same rule as the C writer: records lost to wrapping = write_index - capacity
                q[self._over_q] = s - self.capacity
        return s, qi

    def begin(
        self,
        op: int,
        comm: int,
        nranks: int,
        comm_rank: int,
        peer: int,
        count: int,
        nbytes: int,
        dtype: int,
        t_enqueue_ns: int,
        t_start_ns: int = 0,
        t_end_ns: int = 0,
        flags: int = 0,
        *,
        t_return_ns: int = 0,
        group_depth: int = 0,
        tid: int | None = None,
        stream: int = 0,
        aux: int = 0,
        device: int = -1,
    ) -> int:
        """Claim a slot and write a record without committing it; returns its seq (0 if dropped).

        Use for calls whose end time is known later (async work); `finish` commits it. Readers wait for
        an uncommitted record, so every `begin` must be followed by `finish` soon.
        """
        if self._closed:
            return 0
        got = self._claim()
        if got is None:
            return 0
        s, qi = got
        _PAYLOAD.pack_into(
            self._mm, qi * 8 + 8,
            comm & 0xFFFFFFFFFFFFFFFF, count, nbytes, t_enqueue_ns, t_start_ns, t_end_ns, t_return_ns,
            nranks, comm_rank, peer, op, dtype & 0xFF, min(group_depth, 255), flags,
            (threading.get_native_id() if tid is None else tid) & 0xFFFFFFFF, stream, aux, device, 0, 0, 0,
        )
        return s

    def finish(
        self,
        seq: int,
        *,
        t_start_ns: int | None = None,
        t_end_ns: int | None = None,
        t_return_ns: int | None = None,
        add_flags: int = 0,
        peer: int | None = None,
    ) -> None:
        """Fill in the late fields of a record from `begin` and commit it (stamp written last).

        ``peer`` fixes a peer that was unknown at the call (a receive from any source).
        """
        if seq <= 0 or self._closed:
            return
        base = HEADER_SIZE + ((seq - 1) & self._mask) * RECORD_SIZE
        qi = base >> 3
        if self._q[qi] != seq | STAMP_BUSY:  # pragma: no cover - cannot happen: BUSY slots are not taken
            return
        q = self._q
        if t_start_ns is not None:
            q[qi + 5] = t_start_ns & 0xFFFFFFFFFFFFFFFF  # offset 40
        if t_end_ns is not None:
            q[qi + 6] = t_end_ns & 0xFFFFFFFFFFFFFFFF  # offset 48
        if t_return_ns is not None:
            q[qi + 7] = t_return_ns & 0xFFFFFFFFFFFFFFFF  # offset 56
        if peer is not None:
            self._u32[(base + _OFF_PEER) // 4] = peer & 0xFFFFFFFF
        if add_flags:
            fi = (base + _OFF_FLAGS) // 4
            self._u32[fi] = self._u32[fi] | int(add_flags)
        q[qi] = seq

    def append(
        self,
        op: int,
        comm: int,
        nranks: int,
        comm_rank: int,
        peer: int,
        count: int,
        nbytes: int,
        dtype: int,
        t_enqueue_ns: int,
        t_start_ns: int = 0,
        t_end_ns: int = 0,
        flags: int = 0,
        **extra: int,
    ) -> int:
        """Write and commit one record; returns its seq (0 if it had to be dropped).

        ``extra`` may carry t_return_ns, group_depth, tid, stream, aux and device.
        """
        s = self.begin(op, comm, nranks, comm_rank, peer, count, nbytes, dtype, t_enqueue_ns, t_start_ns,
                       t_end_ns, flags, **extra)
        if s:
            self._q[(HEADER_SIZE + ((s - 1) & self._mask) * RECORD_SIZE) // 8] = s
        return s

    def control(self) -> int:
        """The current control word (``Control`` bits set by a controller)."""
        return 0 if self._closed else int(self._u32[self._control_i])

    @property
    def control_word(self) -> tuple[memoryview, int]:
        """(32-bit view, index) of the control word, for hot paths that poll it without a method call."""
        return self._u32, self._control_i

    def set_features(self, features: int) -> None:
        """Advertise producer capabilities (``Feature`` bits) in the header."""
        off = _HDR["features"][1]
        self._u32[off // 4] = int(features)

    def suspend_timeout_ms(self) -> int:
        """The controller's bound on one suspended call (0 = use the producer's default)."""
        return 0 if self._closed else int(self._u32[_HDR["suspend_timeout_ms"][1] // 4])

    def add_suspended(self, delta: int) -> None:
        """Adjust the count of threads currently held by SUSPEND (shown to controllers)."""
        if self._closed:
            return
        with self._lock:
            i = _HDR["suspended"][1] // 4
            self._u32[i] = max(0, int(self._u32[i]) + delta)

    @property
    def write_index(self) -> int:
        """Records claimed so far."""
        return self._windex

    def close(self, unlink: bool = False) -> None:
        """Unmap the ring; with ``unlink`` also remove the file (a clean exit)."""
        if self._closed:
            return
        self._closed = True
        self._q.release()
        self._u32.release()
        self._mm.close()
        if unlink:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> RingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

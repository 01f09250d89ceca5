"""Consumer side of a ring: `RingReader`, and the `failslow shim-dump` view of records (`record_to_dict`,
`dump_ring`).

A reader copies a record only when its stamp reads ``s`` before and after the copy. A slot whose stamp
is newer than expected was overwritten (lost, counted); an older one or ``s | BUSY`` is pending (not yet
committed) and the reader waits for it unless the producer is dead or the pending slot timed out.
"""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError
from failslow.record.files import process_alive
from failslow.record.layout import (
    _HDR,
    DTYPE_NAMES,
    HEADER_SIZE,
    OP_NAMES,
    RECORD_DTYPE,
    RECORD_SIZE,
    STAMP_BUSY,
    RingHeader,
    parse_header,
)


class RingReader:
    """Consumer side of one ring: returns each committed record once, in sequence order.

    `read_new` returns the records committed since the previous call and counts the ones lost to
    overwrite (``lost``). It never returns a torn record. A record that is claimed but not committed
    (in flight, or waiting for a late field) holds back the records after it until it commits, its
    producer dies, or it has been pending for ``pending_timeout_s`` (then it is counted as lost). Pending
    records are async work in flight (the torch hook commits them at completion) and records waiting for
    GPU event times (the shim gives up on those after 2 s); the 30 s default lets a slow async operation
    — the very thing a straggler causes — complete rather than be dropped.
    """

    def __init__(self, path: str | os.PathLike[str], pending_timeout_s: float = 30.0) -> None:
        """Open the ring at ``path``, starting at the oldest record still in it.

        Records overwritten before the reader attached are not counted as lost. The ring is mapped
        read-write when permitted (so `set_control` works), else read-only.

        Args:
            path: Ring file.
            pending_timeout_s: How long an uncommitted record may hold back the ones after it.

        Raises:
            InputError: not a readable ring.
        """
        self.path = Path(path)
        self.writable = True
        try:
            fd = os.open(self.path, os.O_RDWR)
        except PermissionError:
            self.writable = False
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except OSError as exc:
                raise InputError(f"cannot open ring {path}: {exc.strerror or exc}") from exc
        except OSError as exc:
            raise InputError(f"cannot open ring {path}: {exc.strerror or exc}") from exc
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                raise InputError(f"not a failslow ring: {path} is {size} bytes")
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if self.writable else 0)
            self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
        finally:
            os.close(fd)
        hdr = parse_header(self._mm[:HEADER_SIZE])
        if size < HEADER_SIZE + hdr.capacity * RECORD_SIZE:
            self._mm.close()
            raise InputError(f"ring {path} is truncated ({size} bytes for capacity {hdr.capacity})")
        self.capacity = hdr.capacity
        self.pid = hdr.pid
        self._mask = self.capacity - 1
        self._q = memoryview(self._mm).cast("B").cast("Q")
        self._u32 = memoryview(self._mm).cast("B").cast("I")
        self._stamps = np.ndarray((self.capacity,), dtype="<u8", buffer=self._mm, offset=HEADER_SIZE,
                                  strides=(RECORD_SIZE,))
        self._recs = np.ndarray((self.capacity,), dtype=RECORD_DTYPE, buffer=self._mm, offset=HEADER_SIZE)
        self.pending_timeout_s = float(pending_timeout_s)
        w = int(self._q[_HDR["write_index"][1] // 8])
        self._next = max(1, w - self.capacity + 1)
        #: Records this reader lost to overwrite (or to a dead/timed-out producer) since it opened.
        self.lost = 0
        self._pending_seq = 0
        self._pending_since = 0.0
        self._closed = False

    @property
    def header(self) -> RingHeader:
        """The header as it is now (live counters included)."""
        return parse_header(self._mm[:HEADER_SIZE])

    @property
    def next_seq(self) -> int:
        """Sequence number of the next record this reader will return."""
        return self._next

    def write_index(self) -> int:
        """Records the producer has claimed so far."""
        return int(self._q[_HDR["write_index"][1] // 8])

    def read_new(self, max_records: int | None = None) -> npt.NDArray[Any]:
        """Records committed since the last call, as an array of `RECORD_DTYPE` (seq ascending)."""
        w = self.write_index()
        start = self._next
        if w - start + 1 > self.capacity:
            self.lost += (w - self.capacity + 1) - start
            start = w - self.capacity + 1
        self._next = start
        n = w - start + 1
        if max_records is not None:
            n = min(n, max_records)
        if n <= 0:
            return np.empty(0, dtype=RECORD_DTYPE)
        seqs = np.arange(start, start + n, dtype=np.uint64)
        slots = ((seqs - np.uint64(1)) & np.uint64(self._mask)).astype(np.intp)
        s1 = self._stamps[slots]  # fancy indexing copies: a snapshot of the stamps
        recs = self._recs[slots]
        s2 = self._stamps[slots]
        busy = np.uint64(STAMP_BUSY)
        ok = (s1 == seqs) & (s2 == seqs)
        newer = ((s1 & ~busy) > seqs) | ((s2 & ~busy) > seqs)
        pending = ~ok & ~newer
        cut = n
        if pending.any():
            idx = np.flatnonzero(pending)
            alive: bool | None = None
            now = time.monotonic()
            for i in idx:
                seq = int(seqs[i])
                if alive is None:
                    alive = process_alive(self.pid)
                if not alive:
                    break  # the producer is gone: nothing pending will ever commit
                if seq != self._pending_seq:
                    self._pending_seq, self._pending_since = seq, now
                if now - self._pending_since < self.pending_timeout_s:
                    cut = int(i)
                    break
                # timed out: it is counted as lost below and the reader moves past it
        take = ok[:cut]
        self.lost += int(np.count_nonzero(~take))
        out: npt.NDArray[Any] = recs[:cut][take]
        out["seq"] = seqs[:cut][take]
        self._next = start + cut
        return out

    def _need_writable(self) -> None:
        if not self.writable:
            raise InputError(f"ring {self.path} is read-only for this user: cannot set its control word")

    def set_control(self, bits: int) -> None:
        """Set the producer's control word (``Control`` bits; 0 clears everything)."""
        self._need_writable()
        self._u32[_HDR["control"][1] // 4] = int(bits) & 0xFFFFFFFF

    def set_suspend_timeout_ms(self, ms: int) -> None:
        """Bound (ms) on how long one hooked call may be held while SUSPEND is set (0 = producer default)."""
        if ms < 0:
            raise InputError(f"suspend timeout must be >= 0 ms, got {ms}")
        self._need_writable()
        self._u32[_HDR["suspend_timeout_ms"][1] // 4] = int(ms) & 0xFFFFFFFF

    def producer_alive(self) -> bool:
        """Whether the producing process still runs."""
        return process_alive(self.pid)

    def close(self) -> None:
        """Unmap the ring."""
        if self._closed:
            return
        self._closed = True
        del self._stamps, self._recs
        self._q.release()
        self._u32.release()
        self._mm.close()

    def __enter__(self) -> RingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def record_to_dict(rec: Any, header: RingHeader) -> dict[str, Any]:
    """One record as a JSON-ready dict (the `failslow shim-dump` schema) with the ring's identity."""
    op = int(rec["op"])
    return {
        "pid": header.pid,
        "rank": header.rank,
        "job": header.job,
        "host": header.hostname,
        "producer": header.producer_name,
        "op": OP_NAMES.get(op, f"Op{op}"),
        "comm": f"{int(rec['comm']):016x}",
        "nranks": int(rec["nranks"]),
        "comm_rank": int(rec["comm_rank"]),
        "peer": int(rec["peer"]),
        "count": int(rec["count"]),
        "bytes": int(rec["bytes"]),
        "dtype": DTYPE_NAMES.get(int(rec["dtype"]), str(int(rec["dtype"]))),
        "t_enqueue_ns": int(rec["t_enqueue_ns"]),
        "t_start_ns": int(rec["t_start_ns"]),
        "t_end_ns": int(rec["t_end_ns"]),
        "t_return_ns": int(rec["t_return_ns"]),
        "wall_enqueue_ns": int(rec["t_enqueue_ns"]) + header.clock_offset_ns,
        "seq": int(rec["seq"]),
        "flags": int(rec["flags"]),
        "tid": int(rec["tid"]),
        "group_depth": int(rec["group_depth"]),
        "stream": int(rec["stream"]),
        "aux": int(rec["aux"]),
        "device": int(rec["device"]),
    }


def dump_ring(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every committed record now in the ring at ``path`` as `record_to_dict` dicts (oldest first).

    Raises:
        InputError: the file is not a readable ring.
    """
    with RingReader(path, pending_timeout_s=0.0) as r:
        hdr = r.header
        return [record_to_dict(rec, hdr) for rec in r.read_new()]

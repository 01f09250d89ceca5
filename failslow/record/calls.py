"""The call table: per-rank call timings as parallel arrays, read from ring records or built from columns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from failslow.errors import InputError
from failslow.record.files import find_rings
from failslow.record.layout import Op
from failslow.record.reader import RingReader

#: Op codes (ring.Op) of point-to-point calls; everything else below 64 is a collective.
SEND, RECV = int(Op.SEND), int(Op.RECV)  # the record's op codes, as ints for array comparisons


@dataclass
class Calls:
    """Call timings of many ranks, one entry per call (parallel arrays).

    Attributes:
        rank: Global rank that made the call.
        comm: Communicator id (identical on every member).
        seq: Order of the call within the rank's stream (e.g. the ring sequence number).
        op: Op code (``failslow.record.Op``).
        nranks: Size of the communicator.
        comm_rank: Position of the calling rank in the communicator.
        peer: For send/recv, the peer's position in the communicator (-1 otherwise).
        nbytes: Payload bytes.
        start: Entry time, seconds (one clock for all ranks: wall time).
        end: Exit/completion time, seconds.
    """

    rank: NDArray[np.int64]
    comm: NDArray[np.uint64]
    seq: NDArray[np.int64]
    op: NDArray[np.int64]
    nranks: NDArray[np.int64]
    comm_rank: NDArray[np.int64]
    peer: NDArray[np.int64]
    nbytes: NDArray[np.int64]
    start: NDArray[np.float64]
    end: NDArray[np.float64]

    def __post_init__(self) -> None:
        n = self.rank.shape[0]
        for name in ("comm", "seq", "op", "nranks", "comm_rank", "peer", "nbytes", "start", "end"):
            if getattr(self, name).shape != (n,):
                raise InputError(f"Calls.{name} must have shape ({n},), got {getattr(self, name).shape}")
        if n and (np.any(~np.isfinite(self.start)) or np.any(~np.isfinite(self.end))):
            raise InputError("call start/end times must be finite")
        if n and np.any(self.end < self.start):
            raise InputError("a call ends before it starts")

    @classmethod
    def from_columns(cls, **cols: Sequence[Any] | NDArray[Any]) -> Calls:
        """Build from lists/arrays; ``peer`` defaults to -1, ``nbytes`` to 0, ``seq`` to input order per rank."""
        n = len(cols["rank"])

        def col(name: str, dtype: Any, default: Any) -> NDArray[Any]:
            return np.asarray(cols[name], dtype=dtype) if name in cols else np.full(n, default, dtype=dtype)

        return cls(rank=col("rank", np.int64, 0), comm=col("comm", np.uint64, 0),
                   seq=col("seq", np.int64, 0) if "seq" in cols else np.arange(n, dtype=np.int64),
                   op=col("op", np.int64, 1), nranks=col("nranks", np.int64, 0),
                   comm_rank=col("comm_rank", np.int64, -1), peer=col("peer", np.int64, -1),
                   nbytes=col("nbytes", np.int64, 0), start=col("start", np.float64, 0.0),
                   end=col("end", np.float64, 0.0))

    @classmethod
    def concat(cls, parts: Sequence[Calls]) -> Calls:
        """Concatenate call sets."""
        if not parts:
            return cls.from_columns(rank=[])
        return cls(**{k: np.concatenate([getattr(p, k) for p in parts]) for k in
                      ("rank", "comm", "seq", "op", "nranks", "comm_rank", "peer", "nbytes", "start", "end")})

    def __len__(self) -> int:
        return int(self.rank.shape[0])


def calls_from_records(records: NDArray[Any], rank: int, clock_offset_ns: int = 0,
                       call_ops: frozenset[int] | None = None) -> Calls:
    """Calls of one rank from ring records (``failslow.record.RECORD_DTYPE``), in wall-clock seconds.

    Records without an end time (never completed) and control events (op >= 64) are dropped.
    """
    r = records
    ok = (r["t_end_ns"] > 0) & (r["t_start_ns"] > 0) & (r["t_end_ns"] >= r["t_start_ns"])
    ops = r["op"].astype(np.int64)
    ok &= np.isin(ops, list(call_ops)) if call_ops is not None else ((ops > 0) & (ops < 64))
    r = r[ok]
    n = r.shape[0]
    return Calls(rank=np.full(n, rank, dtype=np.int64), comm=r["comm"].astype(np.uint64),
                 seq=r["seq"].astype(np.int64), op=r["op"].astype(np.int64), nranks=r["nranks"].astype(np.int64),
                 comm_rank=r["comm_rank"].astype(np.int64), peer=r["peer"].astype(np.int64),
                 nbytes=r["bytes"].astype(np.int64),
                 start=(r["t_start_ns"].astype(np.int64) + clock_offset_ns) / 1e9,
                 end=(r["t_end_ns"].astype(np.int64) + clock_offset_ns) / 1e9)


def calls_from_ring_dir(directory: Any) -> list[Calls]:
    """Calls of every ring in ``directory`` (e.g. kept after a job with ``FAILSLOW_KEEP_RINGS=1``), one per ring."""
    parts = []
    for path in find_rings(directory):
        r = RingReader(path)
        try:
            parts.append(calls_from_records(r.read_new(), r.header.rank, r.header.clock_offset_ns))
        finally:
            r.close()
    return parts

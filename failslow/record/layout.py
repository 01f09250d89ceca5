"""The ring's byte layout (Python mirror of ``shim/include/failslow_ring.h``, the source of truth).

A ring is a 4096-byte header followed by ``capacity`` (a power of two) records of 128 bytes each.
Default capacity 65536 → 8 MiB per process; docs/record.md explains the choice. This module holds the constants and enums of the contract (`Op`, `Flag`, `Control`, `ClockSource`, `Producer`,
`Feature`), the numpy record type `RECORD_DTYPE`, the header fields and their struct formats, and the pure
functions that build and decode a header (`build_header`, `parse_header`). It is tested against the C header
(sizes and offsets from a compiled C program, and a ring written by C decoded here).
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import Any, Final

import numpy as np

from failslow.errors import InputError

MAGIC: Final[bytes] = b"FSLRING\x00"
VERSION: Final[int] = 1
HEADER_SIZE: Final[int] = 4096
RECORD_SIZE: Final[int] = 128
DEFAULT_CAPACITY: Final[int] = 65536
MIN_CAPACITY: Final[int] = 16
MAX_CAPACITY: Final[int] = 1 << 24
STAMP_BUSY: Final[int] = 1 << 63
DEFAULT_DIR: Final[str] = "/dev/shm"
RING_PREFIX: Final[str] = "failslow-"
RING_SUFFIX: Final[str] = ".ring"


class Op(IntEnum):
    """Kind of call in a record: collectives and p2p (< 64) and control events (>= 64)."""

    UNKNOWN = 0
    ALLREDUCE = 1
    ALLGATHER = 2
    REDUCESCATTER = 3
    BROADCAST = 4
    REDUCE = 5
    ALLTOALL = 6
    SEND = 7
    RECV = 8
    BARRIER = 9
    GATHER = 10
    SCATTER = 11
    ALLTOALLV = 12
    COMM_INIT = 64
    COMM_SPLIT = 65
    COMM_DESTROY = 66
    COMM_ABORT = 67


OP_NAMES: Final[dict[int, str]] = {
    Op.UNKNOWN: "Unknown",
    Op.ALLREDUCE: "AllReduce",
    Op.ALLGATHER: "AllGather",
    Op.REDUCESCATTER: "ReduceScatter",
    Op.BROADCAST: "Broadcast",
    Op.REDUCE: "Reduce",
    Op.ALLTOALL: "AllToAll",
    Op.SEND: "Send",
    Op.RECV: "Recv",
    Op.BARRIER: "Barrier",
    Op.GATHER: "Gather",
    Op.SCATTER: "Scatter",
    Op.ALLTOALLV: "AllToAllv",
    Op.COMM_INIT: "CommInit",
    Op.COMM_SPLIT: "CommSplit",
    Op.COMM_DESTROY: "CommDestroy",
    Op.COMM_ABORT: "CommAbort",
}

#: Op values that are real communication calls; control events (comm init/split/destroy) are not.
CALL_OPS: Final[frozenset[int]] = frozenset(int(o) for o in Op if 0 < o < 64)


class Flag(IntFlag):
    """Per-record flags (``record.flags``)."""

    HOST_TIMES = 0x1  # t_start/t_end are host times (entry / return or completion)
    GPU_TIMES = 0x2  # t_start/t_end are GPU kernel times mapped to CLOCK_MONOTONIC
    ASYNC = 0x4  # async work handle: t_end is when completion was observed
    IN_GROUP = 0x8  # inside ncclGroupStart/End or a coalesced p2p batch
    GPU_FAILED = 0x10  # PROFILE was on but GPU times could not be obtained
    ERROR = 0x20  # the real call returned/raised an error
    END_AT_WAIT = 0x40  # t_end observed at wait(): an upper bound on completion
    SUSPENDED = 0x80  # held by the SUSPEND control bit
    SUSPEND_TIMEOUT = 0x100  # released by the suspend timeout


class Control(IntFlag):
    """Bits of the header's control word, set by controllers and read by the producer."""

    PROFILE = 1
    SUSPEND = 2


class ClockSource(IntEnum):
    """How a producer takes its record timestamps (header ``clock_source``); all are CLOCK_MONOTONIC ns."""

    MONOTONIC = 0  #: clock_gettime(CLOCK_MONOTONIC) / time.monotonic_ns()
    TSC = 1  #: the CPU's invariant counter mapped onto CLOCK_MONOTONIC by the shim (< 1 us off)


class Producer(IntEnum):
    """Which tracking path writes a ring."""

    UNKNOWN = 0
    SHIM = 1
    TORCH = 2
    PYTHON = 3


class Feature(IntFlag):
    """Bits of ``header.features``."""

    CUDA = 1
    REAL_NCCL = 2


#: ncclDataType_t numbering (record.dtype); 255 = unknown or other.
DTYPE_UNKNOWN: Final[int] = 255
DTYPE_NAMES: Final[dict[int, str]] = {
    0: "int8", 1: "uint8", 2: "int32", 3: "uint32", 4: "int64", 5: "uint64", 6: "float16",
    7: "float32", 8: "float64", 9: "bfloat16", 10: "float8_e4m3", 11: "float8_e5m2", DTYPE_UNKNOWN: "unknown",
}

# (name, numpy type, offset) of every record field: must match struct failslow_record.
_RECORD_FIELDS: Final[tuple[tuple[str, str, int], ...]] = (
    ("seq", "<u8", 0),
    ("comm", "<u8", 8),
    ("count", "<u8", 16),
    ("bytes", "<u8", 24),
    ("t_enqueue_ns", "<i8", 32),
    ("t_start_ns", "<i8", 40),
    ("t_end_ns", "<i8", 48),
    ("t_return_ns", "<i8", 56),
    ("nranks", "<i4", 64),
    ("comm_rank", "<i4", 68),
    ("peer", "<i4", 72),
    ("op", "<u2", 76),
    ("dtype", "u1", 78),
    ("group_depth", "u1", 79),
    ("flags", "<u4", 80),
    ("tid", "<u4", 84),
    ("stream", "<u8", 88),
    ("aux", "<u8", 96),
    ("device", "<i4", 104),
    ("reserved0", "<u4", 108),
    ("reserved1", "<u8", 112),
    ("reserved2", "<u8", 120),
)

#: numpy mirror of ``struct failslow_record`` (128 bytes, little-endian).
RECORD_DTYPE: Final[np.dtype[Any]] = np.dtype(
    {
        "names": [f[0] for f in _RECORD_FIELDS],
        "formats": [f[1] for f in _RECORD_FIELDS],
        "offsets": [f[2] for f in _RECORD_FIELDS],
        "itemsize": RECORD_SIZE,
    }
)

# (name, struct format, offset) of every header field: must match struct failslow_ring_header.
HEADER_FIELDS: Final[tuple[tuple[str, str, int], ...]] = (
    ("magic", "8s", 0),
    ("version", "I", 8),
    ("header_size", "I", 12),
    ("record_size", "I", 16),
    ("capacity", "I", 20),
    ("pid", "i", 24),
    ("rank", "i", 28),
    ("world_size", "i", 32),
    ("local_rank", "i", 36),
    ("tp", "i", 40),
    ("pp", "i", 44),
    ("dp", "i", 48),
    ("cp", "i", 52),
    ("node_id", "i", 56),
    ("producer", "I", 60),
    ("clock_offset_ns", "q", 64),
    ("created_mono_ns", "q", 72),
    ("job", "64s", 80),
    ("hostname", "64s", 144),
    ("features", "I", 208),
    ("clock_source", "I", 212),
    ("write_index", "Q", 256),
    ("dropped", "Q", 320),
    ("overwritten", "Q", 328),
    ("control", "I", 384),
    ("suspend_timeout_ms", "I", 388),
    ("suspended", "I", 392),
    ("reserved1", "I", 396),
)
_HDR: Final[dict[str, tuple[struct.Struct, int]]] = {
    name: (struct.Struct("<" + fmt), off) for name, fmt, off in HEADER_FIELDS
}

# Payload after the stamp (bytes 8..128), in field order; '<' = little-endian, no padding.
_PAYLOAD: Final[struct.Struct] = struct.Struct("<QQQqqqqiiiHBBIIQQiIQQ")
if _PAYLOAD.size != RECORD_SIZE - 8:  # pragma: no cover - a programming error in this module
    raise RuntimeError("record payload format does not match RECORD_SIZE")
_OFF_FLAGS: Final[int] = 80
_HEADER_Q: Final[int] = HEADER_SIZE // 8  # header size in 8-byte words
_RECORD_Q: Final[int] = RECORD_SIZE // 8
_OFF_PEER: Final[int] = 72

if sys.byteorder != "little":  # pragma: no cover - the ring is little-endian by contract
    raise ImportError("failslow.record supports little-endian hosts only")


@dataclass(frozen=True)
class RingHeader:
    """Decoded ring header: who writes the ring, its geometry and its live counters."""

    version: int
    header_size: int
    record_size: int
    capacity: int
    pid: int
    rank: int
    world_size: int
    local_rank: int
    tp: int
    pp: int
    dp: int
    cp: int
    node_id: int
    producer: int
    clock_offset_ns: int
    created_mono_ns: int
    job: str
    hostname: str
    features: int
    write_index: int
    dropped: int
    overwritten: int
    control: int
    suspend_timeout_ms: int
    suspended: int
    clock_source: int = 0

    @property
    def clock_name(self) -> str:
        """``monotonic`` or ``tsc``: where the producer's timestamps come from (``unknown`` otherwise)."""
        try:
            return ClockSource(self.clock_source).name.lower()
        except ValueError:
            return "unknown"

    @property
    def producer_name(self) -> str:
        """``shim``, ``torch``, ``python`` or ``unknown``."""
        try:
            return Producer(self.producer).name.lower()
        except ValueError:
            return "unknown"

    def layout(self) -> dict[str, int]:
        """The parallel sizes recorded by the producer (0 = unknown)."""
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "cp": self.cp}

    def wall_ns(self, mono_ns: int) -> int:
        """Convert a CLOCK_MONOTONIC timestamp of this process to Unix time in ns."""
        return mono_ns + self.clock_offset_ns


def _cstr(b: bytes) -> str:
    return b.split(b"\x00", 1)[0].decode("utf-8", "replace")


def parse_header(buf: bytes | bytearray | memoryview) -> RingHeader:
    """Decode a ring header from its bytes (pure).

    Raises:
        InputError: the bytes are not a failslow ring header of a supported version.
    """
    if len(buf) < HEADER_SIZE:
        raise InputError(f"ring header too short: {len(buf)} bytes, need {HEADER_SIZE}")
    vals: dict[str, Any] = {name: st.unpack_from(buf, off)[0] for name, (st, off) in _HDR.items()}
    if vals["magic"] != MAGIC:
        raise InputError(f"not a failslow ring (magic {vals['magic']!r})")
    if vals["version"] != VERSION:
        raise InputError(f"unsupported ring version {vals['version']} (this reader knows {VERSION})")
    if vals["header_size"] != HEADER_SIZE or vals["record_size"] != RECORD_SIZE:
        raise InputError(
            f"ring geometry mismatch: header {vals['header_size']} B, record {vals['record_size']} B"
        )
    cap = vals["capacity"]
    if cap < MIN_CAPACITY or cap > MAX_CAPACITY or cap & (cap - 1):
        raise InputError(f"bad ring capacity {cap}")
    vals["job"] = _cstr(vals["job"])
    vals["hostname"] = _cstr(vals["hostname"])
    for k in ("magic", "reserved1"):
        vals.pop(k)
    return RingHeader(**vals)


def _layout_sizes(layout: Any) -> dict[str, int]:
    if layout is None:
        return {}
    get = layout.get if isinstance(layout, Mapping) else lambda k, d=0: getattr(layout, k, d)
    out = {}
    for k in ("tp", "pp", "dp", "cp"):
        v = get(k, 0)
        if v is None:
            v = 0
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0:
            raise InputError(f"layout: {k} must be a non-negative integer, got {v!r}")
        out[k] = int(v)
    return out


def _check_capacity(capacity: int) -> int:
    if (
        isinstance(capacity, bool)
        or not isinstance(capacity, int | np.integer)
        or capacity < MIN_CAPACITY
        or capacity > MAX_CAPACITY
        or capacity & (capacity - 1)
    ):
        raise InputError(
            f"ring capacity must be a power of two in [{MIN_CAPACITY}, {MAX_CAPACITY}], got {capacity!r}"
        )
    return int(capacity)


def build_header(
    *,
    capacity: int,
    pid: int,
    job: str,
    rank: int,
    world_size: int,
    local_rank: int = -1,
    layout: Mapping[str, int] | None = None,
    node_id: int = -1,
    hostname: str = "",
    producer: int = Producer.PYTHON,
    clock_offset_ns: int = 0,
    created_mono_ns: int = 0,
    features: int = 0,
) -> bytearray:
    """Bytes of a fresh ring header (pure; counters zero)."""
    buf = bytearray(HEADER_SIZE)
    lay = dict(layout or {})
    vals: dict[str, Any] = {
        "magic": MAGIC, "version": VERSION, "header_size": HEADER_SIZE, "record_size": RECORD_SIZE,
        "capacity": _check_capacity(capacity), "pid": pid, "rank": rank, "world_size": world_size,
        "local_rank": local_rank, "tp": lay.get("tp", 0), "pp": lay.get("pp", 0), "dp": lay.get("dp", 0),
        "cp": lay.get("cp", 0), "node_id": node_id, "producer": int(producer),
        "clock_offset_ns": clock_offset_ns, "created_mono_ns": created_mono_ns,
        # the C writer truncates to 63 bytes + NUL; do the same (on a UTF-8 boundary)
        "job": job.encode()[:63].decode("utf-8", "ignore").encode(),
        "hostname": hostname.encode()[:63].decode("utf-8", "ignore").encode(),
        "features": features,
    }
    for name, v in vals.items():
        st, off = _HDR[name]
        st.pack_into(buf, off, v)
    return buf

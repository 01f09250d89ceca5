"""The record contract: a per-process ring of fixed-size call records in shared memory (Python mirror).

Every tracking path (the C NCCL shim, the torch.distributed hook, tests) writes one ring per process;
the exporter and `failslow shim-dump` read them. The byte layout is defined by the C header
`shim/include/failslow_ring.h` (the source of truth); this module mirrors it and is tested against it
(sizes and offsets from a compiled C program, and a ring written by C decoded here).

Layout: a 4096-byte header followed by ``capacity`` (a power of two) records of 128 bytes each, in
``$FAILSLOW_SHM_DIR/failslow-<pid>.ring`` (default ``/dev/shm``). Default capacity 65536 → 8 MiB per
process; docs/record.md explains the choice.

Commit protocol (never blocks the writer, never hands a torn record to a reader): the writer claims
sequence ``s = ++write_index``, stamps the slot ``s | BUSY``, writes the payload, then stamps ``s``.
A reader copies a record only when the stamp reads ``s`` before and after the copy. A slot whose stamp
is newer than expected was overwritten (lost, counted); an older one or ``s | BUSY`` is pending (not yet
committed) and the reader waits for it unless the producer is dead or the pending slot timed out.

The Python writer serialises claims with a lock (it is one process's producer, threads included) and
stores the 8-byte stamp with a single native store; on x86-64 (total store order) that gives the same
guarantees as the C writer's release stores. Timestamps are CLOCK_MONOTONIC nanoseconds
(`time.monotonic_ns`); ``header.clock_offset_ns`` converts them to wall time.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

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
    raise ImportError("failslow.ring supports little-endian hosts only")


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

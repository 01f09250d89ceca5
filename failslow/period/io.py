"""Call sequences from files, for `failslow period`: CSV traces and `failslow shim-dump` JSON lines.

`parse_calls` is pure (text in, arrays out) and tested with literals; `read_calls` only adds the
file read. Both raise `InputError` with the line at fault.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError

CSV_COLUMNS = ("t_start_s", "op", "bytes", "duration_s", "comm")


@dataclass(frozen=True)
class CallSequence:
    """One process's call sequence in call order, as period inference reads it; features are small
    integer codes. (The timings of many ranks' completed calls, for culprit analysis, are the record's
    call table, `failslow.record.Calls`.)

    Attributes:
        t_start: Call start (or enqueue) times, seconds.
        op, comm, nbytes, peer: Integer-coded features (codes are only compared for equality); ``peer``
            tells Send/Recv to the previous stage from those to the next (all zero for CSV input).
        sync: Per call, whether it is a collective over a group, not a point-to-point Send/Recv (from the
            operation's name, see `point_to_point`); None when unknown.
        duration: Call durations in seconds (NaN when unknown).
        source: Which process the calls came from, for messages (e.g. ``pid 123 rank 0``).
    """

    t_start: npt.NDArray[np.float64]
    op: npt.NDArray[np.int64]
    comm: npt.NDArray[np.int64]
    nbytes: npt.NDArray[np.int64]
    duration: npt.NDArray[np.float64]
    source: str = ""
    peer: npt.NDArray[np.int64] | None = None
    sync: npt.NDArray[np.bool_] | None = None


#: Operation names of point-to-point calls, as the shim, NCCL kernels, c10d ops and backend annotations
#: spell them once lower-cased, stripped of a namespace (``nccl:``, ``c10d::``) and an ``nccl`` prefix.
_P2P_NAMES = frozenset({"send", "recv", "isend", "irecv", "sendrecv", "batch"})


def point_to_point(name: str) -> bool:
    """Whether an operation name is a point-to-point call (``SEND``, ``ncclSend``, ``SendRecv`` kernels,
    ``c10d::recv_``, ``nccl:send``, ``batch_isend_irecv``), not a collective."""
    token = re.split(r"[:.]", name.strip().lower())[-1].strip("_")
    token = token.removeprefix("nccl").removeprefix("devkernel_").removeprefix("kernel_")
    return token.split("_")[0] in _P2P_NAMES


def sync_of(ops: list[str]) -> npt.NDArray[np.bool_]:
    """Per call, whether its operation (by name) is a collective (see `point_to_point`)."""
    return np.array([not point_to_point(o) for o in ops], dtype=bool)


def _codes(values: list[str]) -> npt.NDArray[np.int64]:
    _, inv = np.unique(np.asarray(values, dtype=object).astype(str), return_inverse=True)
    return inv.astype(np.int64)


def finite_float(v: object, what: str, where: str) -> float:
    """`v` (a number or its text) as a finite float; else an InputError saying ``where: what v is not ...``."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise InputError(f"{where}: no numeric {what!r} (got {v!r})")
    try:
        x = float(v)
    except ValueError:
        raise InputError(f"{where}: {what} {v!r} is not a number") from None
    if not np.isfinite(x):
        raise InputError(f"{where}: {what} {v!r} is not finite")
    return x


def _float(v: str, what: str, line: int) -> float:
    return finite_float(v, what, f"line {line}")


def _finish(t: list[float], op: list[str], comm: list[str], nb: list[str], dur: list[float],
            source: str, peer: list[str] | None = None) -> CallSequence:
    if not t:
        raise InputError("no calls in the input")
    ta = np.asarray(t, dtype=np.float64)
    order = np.argsort(ta, kind="stable")  # threads of one process may interleave slightly
    pa = _codes(peer)[order] if peer is not None else np.zeros(len(ta), dtype=np.int64)
    return CallSequence(t_start=ta[order], op=_codes(op)[order], comm=_codes(comm)[order], nbytes=_codes(nb)[order],
                 duration=np.asarray(dur, dtype=np.float64)[order], source=source, peer=pa, sync=sync_of(op)[order])


def parse_csv(text: str) -> CallSequence:
    """Parse a CSV trace: header ``t_start_s,op`` and optionally ``bytes,duration_s,comm`` (any order).

    Without a header row the columns are taken positionally in that order.

    Raises:
        InputError: missing columns, non-numeric times, or no rows.
    """
    rows = [r for r in csv.reader(io.StringIO(text)) if r and any(c.strip() for c in r)]
    if not rows:
        raise InputError("empty CSV")
    head = [c.strip() for c in rows[0]]
    if "t_start_s" in head:
        if "op" not in head:
            raise InputError("CSV header has no 'op' column (need t_start_s,op[,bytes,duration_s,comm])")
        unknown = [c for c in head if c not in CSV_COLUMNS]
        if unknown:
            raise InputError(f"CSV header: unknown column(s) {unknown}; known: {', '.join(CSV_COLUMNS)}")
        col = {c: head.index(c) for c in head}
        body, first_line = rows[1:], 2
    else:
        try:
            float(head[0])
        except ValueError:
            raise InputError(f"CSV header {head} lacks 't_start_s' (need t_start_s,op[,bytes,duration_s,comm])"
                             ) from None
        col = {c: i for i, c in enumerate(CSV_COLUMNS[: len(head)])}
        body, first_line = rows, 1
    if len(col) < 2 and "op" not in col:
        raise InputError("CSV needs at least the columns t_start_s,op")
    t: list[float] = []
    op: list[str] = []
    comm: list[str] = []
    nb: list[str] = []
    dur: list[float] = []
    for i, r in enumerate(body):
        line = first_line + i
        if len(r) < len(col):
            raise InputError(f"line {line}: expected {len(col)} columns, got {len(r)}")
        t.append(_float(r[col["t_start_s"]], "t_start_s", line))
        op.append(r[col["op"]].strip())
        nb.append(r[col["bytes"]].strip() if "bytes" in col else "")
        comm.append(r[col["comm"]].strip() if "comm" in col else "")
        dur.append(_float(r[col["duration_s"]], "duration_s", line) if "duration_s" in col else float("nan"))
    return _finish(t, op, comm, nb, dur, "csv")


def parse_jsonl(text: str, *, pid: int | None = None, rank: int | None = None) -> CallSequence:
    """Parse `failslow shim-dump` JSON lines; the calls of one process (chosen by ``pid`` or ``rank``).

    Control events (communicator init/split/destroy) are skipped. Time is ``t_enqueue_ns`` (host time at
    call entry), duration is ``t_end_ns - t_start_ns`` when both are known.

    Raises:
        InputError: malformed JSON, missing keys, several processes and no selection, or no calls.
    """
    by_proc: dict[tuple[int, int], list[dict[str, object]]] = {}
    control = {"CommInit", "CommSplit", "CommDestroy", "CommAbort"}
    for i, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InputError(f"line {i}: not JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise InputError(f"line {i}: expected a JSON object")
        missing = [k for k in ("pid", "op", "t_enqueue_ns") if k not in rec]
        if missing:
            raise InputError(f"line {i}: missing key(s) {missing} (is this `failslow shim-dump` output?)")
        if rec["op"] in control:
            continue
        try:
            key = (int(rec["pid"]), int(rec.get("rank", -1)))
        except (TypeError, ValueError):
            raise InputError(f"line {i}: pid/rank must be integers") from None
        rec["_line"] = i
        by_proc.setdefault(key, []).append(rec)
    procs = sorted(by_proc)
    if pid is not None:
        procs = [p for p in procs if p[0] == pid]
    if rank is not None:
        procs = [p for p in procs if p[1] == rank]
    if not procs:
        raise InputError("no calls in the input" if not by_proc else "no calls match the --pid/--rank selection")
    if len(procs) > 1:
        listed = ", ".join(f"pid {p} rank {r}" for p, r in procs[:8])
        raise InputError(f"the dump holds {len(procs)} processes ({listed}{', ...' if len(procs) > 8 else ''});"
                         " choose one with --pid or --rank")
    recs = sorted(by_proc[procs[0]], key=lambda r: int(r.get("seq", 0)))  # type: ignore[call-overload]
    t: list[float] = []
    op: list[str] = []
    comm: list[str] = []
    nb: list[str] = []
    dur: list[float] = []
    peers: list[str] = []
    for r in recs:
        line = int(r["_line"])  # type: ignore[call-overload]
        t.append(_float(str(r["t_enqueue_ns"]), "t_enqueue_ns", line) * 1e-9)
        op.append(str(r["op"]))
        comm.append(str(r.get("comm", "")))
        nb.append(str(r.get("bytes", "")))
        peers.append(str(r.get("peer", "")))
        ts, te = r.get("t_start_ns", 0), r.get("t_end_ns", 0)
        ok = isinstance(ts, int) and isinstance(te, int) and ts > 0 and te >= ts
        dur.append((te - ts) * 1e-9 if ok else float("nan"))  # type: ignore[operator]
    return _finish(t, op, comm, nb, dur, f"pid {procs[0][0]} rank {procs[0][1]}", peers)


def parse_calls(text: str, *, pid: int | None = None, rank: int | None = None) -> CallSequence:
    """Parse either format: JSON lines when the first non-blank character is ``{``, else CSV."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return parse_jsonl(text, pid=pid, rank=rank)
    if pid is not None or rank is not None:
        raise InputError("--pid/--rank apply to shim-dump JSON lines, not to CSV")
    return parse_csv(text)


def read_calls(path: str | os.PathLike[str], *, pid: int | None = None, rank: int | None = None) -> CallSequence:
    """Read and parse a call file (CSV or shim-dump JSON lines)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return parse_calls(text, pid=pid, rank=rank)

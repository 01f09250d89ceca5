"""Call sequences from PyTorch profiler traces (Kineto / Chrome trace JSON), for `failslow period`.

A trace of one rank holds its communication calls in one of several forms; the first one present is used:

1. ``gpu``: NCCL kernels on the GPU timeline (``cat`` "kernel", names such as
   ``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`` or ``ncclKernel_...``): when each collective ran.
2. ``c10d``: the CPU-side ``c10d::`` operators (``c10d::allreduce_``, ``c10d::send``, ...): when the trainer
   issued each call (what `failslow.record.torchhook` records).
3. ``record_param_comms``: the CPU-side communication records, named by their ``Collective name`` arg.
4. ``backend``: the backends' own annotations (``gloo:all_reduce``, ``nccl:all_reduce``, ...).

``ProfilerStep#N`` annotations (``cat`` "user_annotation", else "gpu_user_annotation"), written by
``torch.profiler.profile.step()``, are the trainer's iterations: their durations are ground truth for the
inferred iteration time.

`parse_profiler_trace` is pure (bytes in) and raises `InputError` naming what is wrong; `read_profiler_trace`
adds the file read; `is_profiler_trace` tells a trace from the other call formats by its first bytes.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError
from failslow.period.io import CallSequence, finite_float, sync_of

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z0-9_]+)")
_BACKEND = ("gloo:", "nccl:", "ucc:", "mpi:")
#: File names a directory of traces is searched for.
TRACE_SUFFIXES = (".json", ".json.gz")


@dataclass(frozen=True)
class ProfilerTrace:
    """One rank's communication calls and profiler steps from a profiler trace.

    Attributes:
        calls: The calls, in time order (features: op name, stream or process group, message size).
        source: Which events the calls are (``gpu``, ``c10d``, ``record_param_comms``, ``backend``).
        step_s: Duration of each ``ProfilerStep#N``, in step order (empty when there are none).
        step_start: Start of each step, seconds on the calls' clock (``calls.t_start``).
        rank: The rank the trace names (``distributedInfo.rank``), or ``None``.
    """

    calls: CallSequence
    source: str
    step_s: npt.NDArray[np.float64]
    step_start: npt.NDArray[np.float64]
    rank: int | None = None

    @property
    def step_median_s(self) -> float | None:
        """Median step time from the annotations, or ``None`` without them."""
        return float(np.median(self.step_s)) if len(self.step_s) else None


def is_profiler_trace(head: str) -> bool:
    """Whether text that begins with ``head`` is a Chrome/Kineto trace (not CSV or shim-dump JSON lines)."""
    h = head.lstrip()
    if h.startswith("["):
        return True
    return h.startswith("{") and any(k in h[:4096] for k in ('"traceEvents"', '"schemaVersion"',
                                                             '"displayTimeUnit"', '"deviceProperties"'))


def decompress(data: bytes, name: str = "trace") -> bytes:
    """``data`` itself, or its gzip content when it is gzipped.

    Raises:
        InputError: a gzip file that is truncated or corrupt.
    """
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{name}: corrupt or truncated gzip ({exc})") from None


def _num(e: dict[str, Any], key: str, name: str, i: int) -> float:
    return finite_float(e.get(key), key, f"{name}: event {i} ({e.get('name')!r})")


def _args(e: dict[str, Any]) -> dict[str, Any]:
    a = e.get("args")
    return a if isinstance(a, dict) else {}


def _classify(e: dict[str, Any]) -> tuple[str, str, str, str] | None:
    """(source, op, comm, size) of a communication event, or ``None`` for any other event."""
    name = str(e.get("name", ""))
    cat = str(e.get("cat", "")).lower()
    a = _args(e)
    if cat == "kernel":
        m = _NCCL_KERNEL.match(name)
        if m:
            return "gpu", m.group(1), f"{a.get('device', '')}:{a.get('stream', '')}", ""
        return None
    comm = str(a.get("Process Group Name", a.get("Process Group Ranks", "")))
    # Message size: record_param_comms args, else the tensor shapes of a trace recorded with record_shapes.
    size = f"{a.get('In msg nelems', '')}/{a.get('Out msg nelems', '')}/{a.get('dtype', '')}/{a.get('Input Dims', '')}"
    if name.startswith("c10d::") and cat == "cpu_op":
        return "c10d", name[6:], comm, size
    if name == "record_param_comms":
        return "record_param_comms", str(a.get("Collective name", "")), comm, size
    if name.startswith(_BACKEND) and cat in ("user_annotation", "cpu_op", "gpu_user_annotation"):
        return "backend", name, comm, size
    return None


_SOURCES = ("gpu", "c10d", "record_param_comms", "backend")


def _codes(values: list[str]) -> npt.NDArray[np.int64]:
    _, inv = np.unique(np.asarray(values, dtype=str), return_inverse=True)
    return inv.astype(np.int64)


def parse_profiler_trace(data: bytes | str, *, name: str = "trace") -> ProfilerTrace:
    """Parse a profiler trace (JSON, optionally gzipped) into one rank's calls and steps.

    Times are the events' ``ts``/``dur`` in microseconds (the Chrome trace unit, whatever
    ``displayTimeUnit`` says), returned in seconds from the trace's first event.

    Args:
        data: The file's bytes (gzip is recognised by its magic bytes) or its text.
        name: The file's name, for messages.

    Raises:
        InputError: not JSON (or truncated), no ``traceEvents`` list, events without numeric ``ts``/``dur``,
            NCCL kernels of several GPUs in one file, or no communication calls at all.
    """
    raw = decompress(data, name) if isinstance(data, bytes) else data
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InputError(f"{name}: not valid JSON (truncated?): {exc.msg} at line {exc.lineno} column {exc.colno}"
                         ) from None
    except UnicodeDecodeError:
        raise InputError(f"{name}: not a text file") from None
    if isinstance(doc, list):
        events, meta = doc, {}
    elif isinstance(doc, dict):
        if "traceEvents" not in doc:
            raise InputError(f"{name}: JSON object without 'traceEvents': not a PyTorch profiler / Chrome trace")
        events, meta = doc["traceEvents"], doc
    else:
        raise InputError(f"{name}: expected a JSON object with 'traceEvents' or a list of events")
    if not isinstance(events, list):
        raise InputError(f"{name}: 'traceEvents' is not a list")
    found: dict[str, list[tuple[float, float, str, str, str]]] = {s: [] for s in _SOURCES}
    steps: dict[str, list[tuple[int, float, float]]] = {"user_annotation": [], "gpu_user_annotation": []}
    devices: set[str] = set()
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue  # metadata, counters, flows, instant events
        st = _STEP.match(str(e.get("name", "")))
        cat = str(e.get("cat", "")).lower()
        if st and cat in steps:
            steps[cat].append((int(st.group(1)), _num(e, "ts", name, i), _num(e, "dur", name, i) * 1e-6))
            continue
        c = _classify(e)
        if c is None:
            continue
        ts, dur = _num(e, "ts", name, i), _num(e, "dur", name, i)
        found[c[0]].append((ts, dur, c[1], c[2], c[3]))
        if c[0] == "gpu":
            devices.add(str(_args(e).get("device", e.get("pid", ""))))
    source = next((s for s in _SOURCES if found[s]), None)
    if source is None:
        raise InputError(f"{name}: no communication calls (no NCCL kernels, c10d:: ops, record_param_comms or "
                         f"gloo:/nccl: annotations among {len(events)} events)")
    if source == "gpu" and len(devices) > 1:
        raise InputError(f"{name}: NCCL kernels of {len(devices)} GPUs ({', '.join(sorted(devices))}); "
                         "give one trace per rank")
    rows = sorted(found[source], key=lambda r: r[0])
    ts0 = rows[0][0]
    t = (np.array([r[0] for r in rows]) - ts0) * 1e-6
    calls = CallSequence(t_start=t, op=_codes([r[2] for r in rows]), comm=_codes([r[3] for r in rows]),
                  nbytes=_codes([r[4] for r in rows]), duration=np.array([r[1] for r in rows]) * 1e-6,
                  source=f"{name} ({source})", peer=np.zeros(len(rows), dtype=np.int64),
                  sync=sync_of([r[2] for r in rows]))
    st_rows = sorted(steps["user_annotation"] or steps["gpu_user_annotation"])
    info = meta.get("distributedInfo") if isinstance(meta, dict) else None
    rank = info.get("rank") if isinstance(info, dict) else None
    return ProfilerTrace(calls=calls, source=source, step_s=np.array([d for _, _, d in st_rows], dtype=np.float64),
                         step_start=np.array([(a - ts0) * 1e-6 for _, a, _ in st_rows], dtype=np.float64),
                         rank=int(rank) if isinstance(rank, int) and not isinstance(rank, bool) else None)


@dataclass(frozen=True)
class StepComparison:
    """Inferred iterations against the trace's ``ProfilerStep#N`` annotations.

    Attributes:
        steps: Annotated steps in the trace.
        matched: Inferred iterations whose time span overlaps an annotated step; each is matched to the
            step it overlaps most.
        profiler_step_s: Median duration of the matched steps (of all steps when none matched).
        all_steps_s: Median duration of all annotated steps.
        step_error: Median inferred iteration time over ``profiler_step_s``, minus 1.
        iteration_error: Median over matched iterations of ``|inferred / covered step time - 1|`` (``None``
            if none matched).
    """

    steps: int
    matched: int
    profiler_step_s: float
    all_steps_s: float
    step_error: float
    iteration_error: float | None


def compare_steps(trace: ProfilerTrace, iteration_s: npt.ArrayLike, iteration_end_t: npt.ArrayLike
                  ) -> StepComparison | None:
    """Compare inferred iterations (durations and end times on the calls' clock) with the annotated steps.

    Each iteration is compared with the step its span overlaps most, so the comparison is on the same
    iterations even when the capture's first or last step holds no whole iteration, and GPU kernels that run
    a little after the CPU step that launched them still match it. Iterations marked at another call than
    the one a step begins with straddle two steps and are compared with the one they overlap most.
    Returns ``None`` without annotations or iterations.
    """
    d = np.asarray(iteration_s, dtype=np.float64)
    e = np.asarray(iteration_end_t, dtype=np.float64)
    if len(trace.step_s) == 0 or len(d) == 0:
        return None
    a, b = trace.step_start, trace.step_start + trace.step_s
    s = e - d
    overlap = np.minimum(e[:, None], b[None, :]) - np.maximum(s[:, None], a[None, :])
    best = np.argmax(overlap, axis=1)
    hit = overlap[np.arange(len(d)), best] > 0
    all_s = float(np.median(trace.step_s))
    if not hit.any():
        return StepComparison(steps=len(trace.step_s), matched=0, profiler_step_s=all_s, all_steps_s=all_s,
                              step_error=float(np.median(d)) / all_s - 1.0, iteration_error=None)
    covered = trace.step_s[best[hit]]
    ref = float(np.median(covered))
    return StepComparison(steps=len(trace.step_s), matched=int(hit.sum()), profiler_step_s=ref, all_steps_s=all_s,
                          step_error=float(np.median(d[hit])) / ref - 1.0,
                          iteration_error=float(np.median(np.abs(d[hit] / covered - 1.0))))


def read_profiler_trace(path: str | os.PathLike[str]) -> ProfilerTrace:
    """Read and parse one profiler trace file (``.json`` or ``.json.gz``)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    return parse_profiler_trace(data, name=str(path))


def trace_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The profiler traces (``*.json``, ``*.json.gz``) directly in ``directory``, sorted by name.

    Raises:
        InputError: the directory cannot be listed or holds no trace file.
    """
    d = Path(directory)
    try:
        files = sorted(p for p in d.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
    except OSError as exc:
        raise InputError(f"cannot list {d}: {exc.strerror or exc}") from None
    if not files:
        raise InputError(f"{d}: no profiler traces (*.json, *.json.gz)")
    return files

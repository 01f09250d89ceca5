"""`failslow period FILE|DIR`: calls per iteration and iteration times from recorded calls or profiler traces.

Exit status: 0 every answer confident; 2 bad input (unreadable or malformed file, no periodic pattern at
all); 3 a period was found but its confidence is below ``--min-confidence`` (the reason is on stderr,
nothing is printed for that file). A directory is read file by file: one JSON line per confident file,
and the worst status of all files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from failslow.errors import InputError
from failslow.period import (
    CONFIDENCE_MIN,
    CallSequence,
    IterationResult,
    compare_steps,
    decompress,
    infer_iterations,
    is_profiler_trace,
    parse_calls,
    parse_profiler_trace,
    trace_files,
)

HELP = ("infer calls per iteration and iteration times from a call trace (CSV, shim-dump JSON lines, "
        "PyTorch profiler trace or a directory of them)")
#: Exit status when a period was found but is not stated (confidence below the threshold).
EXIT_NOT_CONFIDENT = 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `failslow period`."""
    p.add_argument("file", help="CSV with t_start_s,op[,bytes,duration_s,comm], `failslow shim-dump` output, a "
                                "PyTorch profiler trace (.json[.gz]), or a directory of profiler traces (one per rank)")
    p.add_argument("--pid", type=int, default=None, help="shim-dump input: the process to analyse")
    p.add_argument("--rank", type=int, default=None, help="shim-dump input: the rank to analyse")
    p.add_argument("--timing-only", action="store_true",
                   help="ignore op/communicator/bytes/peer and use call timing alone")
    p.add_argument("--min-confidence", type=float, default=CONFIDENCE_MIN,
                   help=f"state a period only at this confidence or more, else exit 3 (default {CONFIDENCE_MIN})")


def _analyse(calls: CallSequence, args: argparse.Namespace) -> tuple[dict[str, Any] | None, str, IterationResult]:
    """The JSON answer for one call sequence (``None`` and why when it is not stated), and the result."""
    peer = calls.peer if calls.peer is not None else calls.op * 0
    feats = () if args.timing_only else (calls.op, calls.comm, calls.nbytes, peer)
    res = infer_iterations(calls.t_start, *feats, sync=None if args.timing_only else calls.sync)
    if res.period is None or res.median_s is None:
        raise InputError(f"no periodic call pattern found in {len(calls.t_start)} calls of {calls.source} "
                         "(need at least 2 iterations split by long gaps, else 4 iterations, 8 when all calls "
                         "look alike)")
    if res.confidence < args.min_confidence:
        return None, (f"{calls.source}: no confident period (confidence {res.confidence:.2f} < "
                      f"{args.min_confidence:g}): {res.reason or 'weak structure'}"), res
    out: dict[str, Any] = {
        "period": res.period,
        "iteration_time_s": res.median_s,
        "iterations_s": [round(float(x), 9) for x in res.iteration_s],
        "periods": list(res.periods),
        "calls": len(calls.t_start),
        "confidence": round(res.confidence, 3),
        "method": res.method,
        "fold": res.fold,
    }
    return out, "", res


def _one(path: Path, args: argparse.Namespace, *, in_dir: bool) -> tuple[dict[str, Any] | None, str]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    raw = decompress(data, str(path))
    head = raw[:8192].decode("utf-8", errors="replace")
    if in_dir or is_profiler_trace(head):
        if args.pid is not None or args.rank is not None:
            raise InputError("--pid/--rank apply to shim-dump JSON lines, not to profiler traces")
        tr = parse_profiler_trace(raw, name=str(path))
        out, why, res = _analyse(tr.calls, args)
        if out is None:
            return None, why
        full: dict[str, Any] = {"file": str(path), "rank": tr.rank, "source": tr.source, **out}
        cmp = compare_steps(tr, res.iteration_s, res.iteration_end_t)
        if cmp is not None:
            full["profiler_steps"] = cmp.steps
            full["matched_steps"] = cmp.matched
            full["profiler_step_s"] = cmp.profiler_step_s
            full["profiler_all_steps_s"] = cmp.all_steps_s
            full["step_error"] = round(cmp.step_error, 6)
            full["iteration_error"] = None if cmp.iteration_error is None else round(cmp.iteration_error, 6)
        return full, ""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"cannot read {path}: not a text file") from None
    out, why, _ = _analyse(parse_calls(text, pid=args.pid, rank=args.rank), args)
    return out, why


def run(args: argparse.Namespace) -> int:
    """Print ``{"period", "iteration_time_s", "iterations_s", "confidence", ...}`` as JSON (one line per file).

    Profiler traces add ``file``, ``rank``, ``source`` and, with ``ProfilerStep#N`` annotations,
    ``profiler_steps``, ``matched_steps``, ``profiler_step_s`` (median step time the inferred iterations
    cover), ``profiler_all_steps_s`` (median of all steps), ``step_error`` (inferred median over
    ``profiler_step_s``, minus 1) and ``iteration_error`` (median per-iteration relative error). Exit 2 on bad input, 3 when a period is not confident.
    """
    if not 0.0 <= args.min_confidence <= 1.0:
        raise InputError("--min-confidence must be in [0, 1]")
    path = Path(args.file)
    if not path.is_dir():
        out, why = _one(path, args, in_dir=False)
        if out is None:
            print(f"failslow period: {why}", file=sys.stderr)
            return EXIT_NOT_CONFIDENT
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
        return 0
    status = 0
    for f in trace_files(path):
        try:
            out, why = _one(f, args, in_dir=True)
        except InputError as exc:
            print(f"failslow period: {exc}", file=sys.stderr)
            status = 2
            continue
        if out is None:
            print(f"failslow period: {why}", file=sys.stderr)
            status = status or EXIT_NOT_CONFIDENT
            continue
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
        sys.stdout.flush()
    return status

"""`failslow period FILE`: calls per iteration and iteration times from a recorded call sequence."""

from __future__ import annotations

import argparse
import json
import sys

from failslow.acf import infer_iterations
from failslow.errors import InputError
from failslow.period_io import read_calls

HELP = "infer calls per iteration and iteration times from a call trace (CSV or shim-dump JSON lines)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `failslow period`."""
    p.add_argument("file", help="CSV with t_start_s,op[,bytes,duration_s,comm] or `failslow shim-dump` output")
    p.add_argument("--pid", type=int, default=None, help="shim-dump input: the process to analyse")
    p.add_argument("--rank", type=int, default=None, help="shim-dump input: the rank to analyse")
    p.add_argument("--timing-only", action="store_true",
                   help="ignore op/communicator/bytes/peer and use call timing alone")


def run(args: argparse.Namespace) -> int:
    """Print ``{"period", "iteration_time_s", "iterations_s", ...}`` as JSON; exit 2 on bad input."""
    calls = read_calls(args.file, pid=args.pid, rank=args.rank)
    peer = calls.peer if calls.peer is not None else calls.op * 0
    feats = () if args.timing_only else (calls.op, calls.comm, calls.nbytes, peer)
    res = infer_iterations(calls.t_start, *feats)
    if res.period is None or res.median_s is None:
        raise InputError(f"no periodic call pattern found in {len(calls.t_start)} calls of {calls.source} "
                         "(need at least 4 iterations, 8 when all calls look alike)")
    out = {
        "period": res.period,
        "iteration_time_s": res.median_s,
        "iterations_s": [round(float(x), 9) for x in res.iteration_s],
        "periods": list(res.periods),
        "calls": len(calls.t_start),
    }
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0

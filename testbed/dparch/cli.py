"""`failslow testbed dp-scaling`: profile one worker and measure data-parallel scaling for real.

Trains the testbed MLP data-parallel with gloo in three architectures (ring all-reduce, synchronous
and asynchronous parameter server), each process in its own network namespace behind `tc tbf` and
its own CPU-capped cgroup, and writes:

* ``--profile-out``: the single-worker profile (``failslow-dp-profile/1``) that `failslow predict` reads;
* ``--out``: measured samples/s per architecture and K (plus the raw per-run data).

Needs root (namespaces, tc, cgroups).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from failslow.errors import InputError

HELP = "measure data-parallel scaling (ring / PS sync / PS async) and write a single-worker profile"


def _workers(text: str) -> list[int]:
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.strip().partition("-")
            out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    except ValueError as exc:
        raise InputError(f"bad --workers {text!r}: expected e.g. 1,2,4 or 1-8") from exc
    if not out or min(out) < 1 or max(out) > 16:
        raise InputError(f"bad --workers {text!r}: worker counts must be in 1..16")
    return sorted(set(out))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `failslow testbed dp-scaling`."""
    p.add_argument("--arch", default="ring,ps-sync,ps-async", help="comma-separated: ring, ps-sync, ps-async")
    p.add_argument("--workers", default="1-8", help="worker counts, e.g. 1,2,4 or 1-8 (default 1-8)")
    p.add_argument("--rate", default="200mbit", help="tc tbf rate of every node's link (default 200mbit)")
    p.add_argument("--steps", type=int, help="measured steps per run (default per architecture)")
    p.add_argument("--warmup", type=int, default=3, help="unmeasured steps at the start of each run")
    p.add_argument("--cpu-total", type=float, default=1.4,
                   help="CPUs shared by the largest run; each process gets cpu-total/(max K + 1) (default 1.4)")
    p.add_argument("--profile-out", type=Path, help="write the single-worker profile JSON here")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per (arch, K) in shuffled order, median reported; profiles after each round")
    p.add_argument("--out", type=Path, help="write measured throughput (and raw run data) here")


def run(args: argparse.Namespace) -> int:
    """Run the sweep and print the measured throughput as JSON."""
    from testbed.dparch.measure import sweep
    from testbed.dparch.run import ARCHS, RunSpec
    from testbed.netns import parse_rate

    archs = [a.strip() for a in args.arch.split(",") if a.strip()]
    bad = [a for a in archs if a not in ARCHS]
    if bad or not archs:
        raise InputError(f"unknown architecture(s) {bad}; use {', '.join(ARCHS)}")
    workers = _workers(args.workers)
    try:
        parse_rate(args.rate)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    if args.steps is not None and args.steps < 1:
        raise InputError("--steps must be >= 1")
    if args.repeats < 1:
        raise InputError("--repeats must be >= 1")
    if args.warmup < 1:
        raise InputError("--warmup must be >= 1 (the first step includes connection set-up)")
    if not 0 < args.cpu_total <= (os.cpu_count() or 1):
        raise InputError(f"--cpu-total must be in (0, {os.cpu_count()}]")
    if os.geteuid() != 0:
        raise InputError("dp-scaling needs root (network namespaces, tc, cgroups)")
    cap = args.cpu_total / (max(workers) + 1)
    base = RunSpec(arch="ring", workers=1, rate=args.rate, cpu_cap=cap, warmup=args.warmup)
    from testbed.cgroup import CgroupError
    from testbed.dparch.run import RunError
    from testbed.netns import NetError

    try:
        doc = sweep(base, archs, workers, profile=args.profile_out is not None, repeats=args.repeats,
                    steps=args.steps, log=lambda s: print(s, file=sys.stderr, flush=True))
    except (RunError, NetError, CgroupError) as exc:
        # A run that failed on the machine (not bad input): one clear message, exit 1.
        print(f"failslow testbed dp-scaling: {exc}", file=sys.stderr)
        return 1
    if args.profile_out is not None:
        args.profile_out.write_text(json.dumps(doc["profile"], indent=1) + "\n")
    if args.out is not None:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    table: dict[str, dict[str, float]] = {}
    for r in doc["runs"]:
        table.setdefault(r["arch"], {})[str(r["workers"])] = r["samples_per_s"]
    print(json.dumps({"rate": args.rate, "cpu_cap": cap, "throughput": table}, indent=2))
    return 0

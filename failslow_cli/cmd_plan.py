"""`failslow plan SUB ...`: mitigation plans worked out by hand, before (or instead of) the remediator acting.

`failslow plan rebalance --times 0.2,0.2,0.5 --total 32 [--lower 1|1,1,2] [--upper ...] [--offsets ...]`
prints the optimal split of the micro-batches over the DP groups as JSON::

    {"counts": [...], "makespan": s, "bottleneck": i, "lower_bound": s,
     "even": {"counts": [...], "makespan": s}, "speedup": even / optimal, "moved": n}

``speedup`` is the predicted iteration speed-up over the even split (what a job runs before rebalancing)
and ``moved`` how many micro-batches change group. Logic lives in `failslow.plan`. Further planners (say
``topology``) are added as sub-commands beside ``rebalance``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from failslow.errors import InputError

HELP = "plan a mitigation by hand: rebalance micro-batches over DP groups (exact S2)"


def _numbers(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError as exc:
        raise InputError(f"bad {what} {text!r}: expected comma-separated numbers") from exc


def _integers(text: str, what: str) -> int | list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError as exc:
        raise InputError(f"bad {what} {text!r}: expected one integer or comma-separated integers") from exc
    # One value is a bound for every group; a list gives one per group.
    return values[0] if len(values) == 1 else values


def _add_rebalance(p: argparse.ArgumentParser) -> None:
    p.add_argument("--times", required=True,
                   help="seconds per micro-batch of each DP group, comma-separated (e.g. 0.2,0.2,0.5)")
    p.add_argument("--total", required=True, type=int, help="micro-batches per iteration (kept exactly)")
    p.add_argument("--lower", default="1", help="fewest micro-batches per group: one for all or one per group "
                   "(default 1)")
    p.add_argument("--upper", help="most micro-batches per group (memory): one for all or one per group "
                   "(default: no limit)")
    p.add_argument("--offsets", help="fixed seconds per group added to its time (pipeline fill/drain): one for "
                   "all or one per group (default 0)")


def _run_rebalance(args: argparse.Namespace) -> int:
    from failslow.plan import rebalance
    from failslow.plan.microbatch import even_split, makespan

    times = _numbers(args.times, "--times")
    offsets: float | list[float] | None = None
    if args.offsets is not None:
        values = _numbers(args.offsets, "--offsets")
        offsets = values[0] if len(values) == 1 else values
    lower = _integers(args.lower, "--lower")
    upper = _integers(args.upper, "--upper") if args.upper is not None else None
    best = rebalance(times, args.total, lower, upper, offsets=offsets)
    even = even_split(len(times), args.total)
    even_span = makespan(times, even, offsets=offsets)
    doc = best.to_json()
    doc["even"] = {"counts": list(even), "makespan": even_span}
    doc["speedup"] = even_span / best.makespan if best.makespan > 0 else 1.0
    doc["moved"] = sum(max(0, e - k) for e, k in zip(even, best.counts, strict=True))
    print(json.dumps(doc, indent=2))
    return 0


# sub-command -> (help, add_arguments, run)
SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                             Callable[[argparse.Namespace], int]]] = {
    "rebalance": ("optimal split of the micro-batches over DP groups of measured speeds (exact)",
                  _add_rebalance, _run_rebalance),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """One sub-parser per planner."""
    subs = p.add_subparsers(dest="plan_cmd", metavar="SUB", required=True)
    for name, (text, add, run_sub) in SUBCOMMANDS.items():
        sp = subs.add_parser(name, help=text, description=text)
        add(sp)
        sp.set_defaults(_plan_run=run_sub)


def run(args: argparse.Namespace) -> int:
    """Dispatch to the chosen planner."""
    return int(args._plan_run(args) or 0)

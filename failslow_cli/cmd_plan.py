"""`failslow plan SUB ...`: mitigation plans worked out by hand, before (or instead of) the remediator acting.

`failslow plan rebalance --times 0.2,0.2,0.5 --total 32 [--lower 1|1,1,2] [--upper ...] [--offsets ...]`
prints the optimal split of the micro-batches over the DP groups as JSON::

    {"counts": [...], "makespan": s, "bottleneck": i, "lower_bound": s,
     "even": {"counts": [...], "makespan": s}, "speedup": even / optimal, "moved": n}

``speedup`` is the predicted iteration speed-up over the even split (what a job runs before rebalancing)
and ``moved`` how many micro-batches change group.

`failslow plan topology --layout dp=2,pp=2,tp=1 [--placement 0,1,2,3] [--slow-rank 3=2.5] [--slow-link 1=0.1]
[--slow-link 0-1=0.1] [--iteration-s T] [--healthy-s T] [model options]` scores node permutations with the S3 model
(`failslow.plan.placement`) and prints the current predicted time, every candidate with its predicted iteration
time and why, and the chosen placement (``null`` with the refusal ``reason`` when no move gains ``--min-gain``).
With ``--rebalance [--micro-batch-upper N|N,N]`` every placement, the current one included, is scored under its
own best micro-batch split of the same total: each candidate (and ``current``) shows its ``counts``, ``as_is_s``
is the current placement under the current split, and a move must beat S2 alone on the current placement.
With both ``--healthy-s`` and ``--iteration-s`` and slow ranks, the healthy pace fixes the healthy compute and
the slow ranks' factors are scaled together until the current placement takes ``--iteration-s``.
Logic lives in `failslow.plan`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from failslow.errors import InputError
from failslow.topology import Layout

HELP = "plan a mitigation by hand: rebalance micro-batches (exact S2), re-place nodes (S3)"


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


def _layout(text: str, ranks_per_node: int | None) -> Layout:
    """``dp=2,pp=2,tp=1[,ranks_per_node=N]`` or a JSON file holding such a mapping (or ``{"layout": {...}}``)."""
    spec: dict[str, Any]
    if "=" in text:
        spec = {}
        for part in text.split(","):
            key, sep, value = part.partition("=")
            key = {"rpn": "ranks_per_node"}.get(key.strip(), key.strip())
            if not sep or key not in ("dp", "pp", "tp", "cp", "vpp", "ranks_per_node"):
                raise InputError(f"bad --layout {text!r}: expected dp=N,pp=N,tp=N[,ranks_per_node=N]")
            try:
                spec[key] = int(value)
            except ValueError:
                raise InputError(f"bad --layout {text!r}: {key} must be an integer") from None
    else:
        try:
            with open(text, encoding="utf-8") as fh:
                spec = json.load(fh)
        except (OSError, ValueError) as exc:
            raise InputError(f"bad --layout {text!r}: neither dp=..,pp=..,tp=.. nor a readable JSON file ({exc})") \
                from None
        if isinstance(spec, dict) and isinstance(spec.get("layout"), dict):
            spec = spec["layout"]
        if not isinstance(spec, dict):
            raise InputError(f"bad --layout file {text!r}: expected a JSON object")
    if ranks_per_node is not None:
        spec["ranks_per_node"] = ranks_per_node
    return Layout.from_mapping(spec)


def _pairs(items: list[str], what: str) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out.append((key.strip(), float(value)))
        except ValueError:
            raise InputError(f"bad {what} {item!r}: expected KEY=NUMBER") from None
    return out


def _add_topology(p: argparse.ArgumentParser) -> None:
    from failslow.plan.placement import PlacementParams

    d = PlacementParams()
    p.add_argument("--layout", required=True,
                   help="dp=N,pp=N,tp=N[,ranks_per_node=N], or a JSON file with those keys (or a \"layout\" object)")
    p.add_argument("--ranks-per-node", type=int,
                   help="ranks per node when neither --layout nor --placement says (default: tp)")
    p.add_argument("--placement", help="node of each rank, comma-separated (default: rank // ranks_per_node)")
    p.add_argument("--slow-rank", action="append", default=[], metavar="RANK=FACTOR",
                   help="a rank's compute slowdown, e.g. 3=2.5 (2.5x slower); repeatable")
    p.add_argument("--slow-link", action="append", default=[], metavar="NODE=SHARE",
                   help="bandwidth share left on a node's NIC (1=0.1) or on the path between two nodes "
                        "(0-1=0.1); repeatable")
    p.add_argument("--iteration-s", type=float, help="measured iteration time now: calibrates the model on it")
    p.add_argument("--healthy-s", type=float,
                   help="measured iteration time before the slowdown: calibrates the model on the current placement "
                        "with nothing slow; with --iteration-s and slow ranks, the slow ranks' factors are scaled "
                        "to reproduce --iteration-s (without slow ranks it takes precedence over --iteration-s)")
    p.add_argument("--micro-batches", default=str(d.microbatches),
                   help=f"micro-batches per DP replica: one or one per replica (default {d.microbatches})")
    p.add_argument("--compute-s", default=str(d.compute_s),
                   help=f"healthy seconds per micro-batch of a stage: one or one per stage (default {d.compute_s})")
    p.add_argument("--edge-weight", type=float, default=d.edge_stage_weight,
                   help=f"compute factor of the first and last stage (default {d.edge_stage_weight})")
    p.add_argument("--p2p-bytes", type=float, default=d.p2p_bytes,
                   help=f"bytes per micro-batch over a pipeline hop (default {d.p2p_bytes:.0f})")
    p.add_argument("--grad-bytes", default=f"{d.grad_bytes:.0f}",
                   help="gradient bytes of a stage all-reduced per iteration: one or one per stage "
                        f"(default {d.grad_bytes:.0f})")
    p.add_argument("--tp-bytes", type=float, default=d.tp_bytes,
                   help=f"TP all-reduce bytes per micro-batch of a stage (default {d.tp_bytes:.0f})")
    p.add_argument("--link-bw", type=float, default=d.link_bw,
                   help=f"healthy inter-node bandwidth, bytes/s (default {d.link_bw:.3g})")
    p.add_argument("--intra-bw", type=float, default=d.intra_bw,
                   help=f"bandwidth inside a node, bytes/s (default {d.intra_bw:.3g})")
    p.add_argument("--overhead-s", type=float, default=d.overhead_s,
                   help=f"seconds per iteration outside pipeline and all-reduce (default {d.overhead_s})")
    p.add_argument("--min-gain", type=float, default=0.03,
                   help="smallest relative gain worth a move (default 0.03)")
    p.add_argument("--max-candidates", type=int, default=16, help="most candidates listed (default 16)")
    p.add_argument("--rebalance", action="store_true",
                   help="score every placement, the current one included, under its own best micro-batch split "
                        "(the move followed by S2); candidates show their split as counts")
    p.add_argument("--micro-batch-upper",
                   help="with --rebalance: most micro-batches per replica (memory): one or one per replica")


def _one_or_many(text: str, what: str) -> float | tuple[float, ...]:
    values = _numbers(text, what)
    return values[0] if len(values) == 1 else tuple(values)


def _run_topology(args: argparse.Namespace) -> int:
    from failslow.plan.placement import LinkKey, PlacementParams, plan_topology

    placement = None
    if args.placement is not None:
        raw = _integers(args.placement, "--placement")
        placement = [raw] if isinstance(raw, int) else raw
    rpn = args.ranks_per_node
    layout = _layout(args.layout, rpn)
    if layout.ranks_per_node is None and placement is None:
        layout = Layout.from_mapping({**layout.to_dict(), "ranks_per_node": layout.tp})
    slow_ranks: dict[int, float] = {}
    for key, value in _pairs(args.slow_rank, "--slow-rank"):
        try:
            slow_ranks[int(key)] = value
        except ValueError:
            raise InputError(f"bad --slow-rank {key}={value}: RANK must be an integer") from None
    slow_links: dict[LinkKey, float] = {}
    for key, value in _pairs(args.slow_link, "--slow-link"):
        try:
            ends = [int(x) for x in key.split("-")]
        except ValueError:
            raise InputError(f"bad --slow-link {key}={value}: expected NODE or NODE-NODE") from None
        if len(ends) == 1:
            slow_links[ends[0]] = value
        elif len(ends) == 2:
            slow_links[(ends[0], ends[1])] = value
        else:
            raise InputError(f"bad --slow-link {key}={value}: expected NODE or NODE-NODE")
    mb = _integers(args.micro_batches, "--micro-batches")
    params = PlacementParams(
        microbatches=mb if isinstance(mb, int) else tuple(mb),
        compute_s=_one_or_many(args.compute_s, "--compute-s"), edge_stage_weight=args.edge_weight,
        p2p_bytes=args.p2p_bytes, grad_bytes=_one_or_many(args.grad_bytes, "--grad-bytes"),
        tp_bytes=args.tp_bytes, link_bw=args.link_bw, intra_bw=args.intra_bw, overhead_s=args.overhead_s)
    upper = None if args.micro_batch_upper is None else _integers(args.micro_batch_upper, "--micro-batch-upper")
    if upper is not None and not args.rebalance:
        raise InputError("--micro-batch-upper needs --rebalance")
    plan = plan_topology(layout, placement, slow_ranks=slow_ranks, slow_links=slow_links, params=params,
                         iteration_s=args.iteration_s, healthy_s=args.healthy_s, min_gain=args.min_gain,
                         max_candidates=args.max_candidates, rebalance=args.rebalance, microbatch_upper=upper)
    doc = {"layout": layout.to_dict(), "placement": list(placement) if placement is not None
           else [int(x) for x in layout.nodes_array()], **plan.to_json()}
    print(json.dumps(doc, indent=2))
    return 0


# sub-command -> (help, add_arguments, run)
SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                             Callable[[argparse.Namespace], int]]] = {
    "rebalance": ("optimal split of the micro-batches over DP groups of measured speeds (exact)",
                  _add_rebalance, _run_rebalance),
    "topology": ("score node permutations against slow ranks and links and choose a placement (S3)",
                 _add_topology, _run_topology),
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

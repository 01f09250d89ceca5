"""`failslow predict PROFILE --workers 1,2,4,8 [--arch ...] [--model ...] [--bandwidth RATE]`.

Prints ``{"arch": ..., "model": ..., "throughput": {"<K>": samples_per_second}}`` for a single-worker
profile (as written by `failslow testbed dp-scaling`). Logic lives in `failslow.predict`.
"""

from __future__ import annotations

import argparse
import json

from failslow.errors import InputError

HELP = "predict data-parallel throughput for K workers from a single-worker profile"


def _workers(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise InputError(f"bad worker range {part!r}: start after end")
                out.extend(range(lo, hi + 1))
            else:
                out.append(int(part))
        except ValueError as exc:
            raise InputError(f"bad --workers {text!r}: expected e.g. 1,2,4,8 or 1-8") from exc
    if any(k < 1 for k in out):
        raise InputError(f"bad --workers {text!r}: worker counts must be >= 1")
    return sorted(set(out))


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError as exc:
        raise InputError(f"bad {what} {text!r}: expected comma-separated numbers") from exc


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `failslow predict`."""
    p.add_argument("profile", help="single-worker profile JSON (failslow-dp-profile/1)")
    p.add_argument("--workers", default="1,2,4,8", help="worker counts, e.g. 1,2,4,8 or 1-8 (default 1,2,4,8)")
    p.add_argument("--arch", default="ring", choices=["ring", "ps-sync", "ps-async"],
                   help="ring all-reduce, synchronous or asynchronous parameter server (default ring)")
    p.add_argument("--model", default="coarse", choices=["coarse", "fine"],
                   help="coarse closed forms / MVA, or fine-grained discrete-event simulation")
    p.add_argument("--bandwidth", help="link rate replacing the profile's, e.g. 100mbit, 12.5MB/s, 1e7 (bytes/s)")
    p.add_argument("--link", help="link model: ps-sync coarse ps|fcfs|hybrid; ps-async auto|ps|fcfs|hybrid; "
                   "fine ps|fcfs|tcp|hybrid|auto")
    ov = p.add_mutually_exclusive_group()
    ov.add_argument("--overlap", dest="overlap", action="store_true", default=None,
                    help="per-layer communication overlapping compute (default: as profiled)")
    ov.add_argument("--no-overlap", dest="overlap", action="store_false", help="whole-model messages")
    p.add_argument("--slowdown", help="compute slowdown factors of the first workers, e.g. 1.5 or 2,1.2")
    p.add_argument("--flow-cap", help="fine model: most one flow gets on a shared server link (a rate, e.g. 50mbit)")
    p.add_argument("--steps", type=int, default=100, help="simulated steps per worker (fine model, default 100)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulation's step sampler")
    p.add_argument("--details", action="store_true", help="add per-K solver details to the JSON")


def run(args: argparse.Namespace) -> int:
    """Predict and print the JSON document."""
    from failslow.predict import parse_rate, predict, read_profile

    workers = _workers(args.workers)
    bandwidth = parse_rate(args.bandwidth) if args.bandwidth is not None else None
    slowdown = _floats(args.slowdown, "--slowdown") if args.slowdown else None
    flow_cap = parse_rate(args.flow_cap) if args.flow_cap is not None else None
    if args.steps < 10:
        raise InputError(f"--steps must be >= 10, got {args.steps}")
    profile = read_profile(args.profile)
    pred = predict(profile, workers, arch=args.arch, model=args.model, bandwidth=bandwidth, link=args.link,
                   overlap=args.overlap, slowdown=slowdown, steps=args.steps, seed=args.seed, flow_cap=flow_cap)
    doc = pred.to_json()
    if args.details:
        doc["details"] = {str(k): v for k, v in pred.details.items()}
    print(json.dumps(doc, indent=2))
    return 0

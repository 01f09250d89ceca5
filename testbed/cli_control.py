"""`failslow testbed control`: turn a running job's knobs from another shell (the run directory's file protocol)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from failslow.errors import InputError
from testbed.adapter import FileControlAdapter

HELP = ("change a running job (started with --run-dir): status, inject/remove a fault, micro-batches, checkpoint, "
        "restart, validate suspects")

ACTIONS = ("status", "inject", "remove", "microbatches", "checkpoint", "restart", "validate-compute",
           "validate-links")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `failslow testbed control`."""
    p.add_argument("--run-dir", required=True, help="the job's --run-dir")
    p.add_argument("action", choices=ACTIONS)
    p.add_argument("value", nargs="?", default=None,
                   help="inject/remove: a fault spec; microbatches: counts per DP replica (3,1); "
                        "checkpoint: a directory; restart: node of each rank (1,0,...); "
                        "validate-compute: suspect ranks (3 or 1,3); validate-links: the communicator's nodes "
                        "in ring order (0,1,2,3; default: the job's DP rings)")
    p.add_argument("--peers", default=None, help="validate-compute: healthy peer ranks (default: one per suspect)")
    p.add_argument("--suspects", default=None, help="validate-links: suspect nodes (the other links are the "
                                                     "reference; default: every link is)")
    p.add_argument("--topology", choices=("ring", "tree"), default="ring", help="validate-links: link schedule")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the job's answer")


def _ints(text: str | None, what: str) -> list[int]:
    try:
        return [int(x) for x in (text or "").split(",")]
    except ValueError:
        raise InputError(f"{what} wants comma-separated integers, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    """Send one request; print the job's answer as JSON."""
    run_dir = Path(args.run_dir)
    if not (run_dir / "requests").is_dir():
        raise InputError(f"{run_dir} is not a running testbed's run directory")
    ad = FileControlAdapter(run_dir, timeout_s=args.timeout)
    if args.action not in ("status", "restart", "validate-links") and not args.value:
        raise InputError(f"{args.action} needs a value")
    try:
        if args.action == "status":
            result = ad.request("status")
        elif args.action == "inject":
            result = ad.request("inject", spec=args.value)
        elif args.action == "remove":
            result = ad.request("remove", spec=args.value)
        elif args.action == "microbatches":
            result = {"from_iteration": ad.set_microbatches(_ints(args.value, "microbatches"))}
        elif args.action == "checkpoint":
            result = {"resume_iteration": ad.save_checkpoint(args.value)}
        elif args.action == "validate-compute":
            peers = _ints(args.peers, "--peers") if args.peers else None
            result = ad.request("validate_compute", ranks=_ints(args.value, "validate-compute"), peers=peers)
        elif args.action == "validate-links":
            nodes = _ints(args.value, "validate-links") if args.value else None
            suspects = _ints(args.suspects, "--suspects") if args.suspects else None
            result = ad.request("validate_links", nodes=nodes, suspects=suspects, topology=args.topology)
        else:
            placement = _ints(args.value, "restart") if args.value else None
            result = {"resumed_at": ad.restart(placement)}
    except TimeoutError as exc:
        print(f"failslow testbed control: {exc}")
        return 1
    print(json.dumps(result))
    return 0

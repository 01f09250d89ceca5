"""`failslow testbed cleanup`: remove namespaces, qdiscs, cgroups and processes testbeds left behind."""

from __future__ import annotations

import argparse
import json

from testbed.state import cleanup

HELP = "remove every testbed namespace/qdisc/cgroup/process whose owner is gone (--all: every one)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `failslow testbed cleanup`."""
    p.add_argument("--all", action="store_true",
                   help="also remove resources of testbeds that are still running (careful on shared machines)")


def run(args: argparse.Namespace) -> int:
    """Clean up; prints what was removed as JSON."""
    removed = cleanup(everything=args.all)
    print(json.dumps(removed))
    return 0

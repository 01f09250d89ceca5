"""`failslow demo` (what `make demo` runs): the whole loop on one machine, for real.

Redis, Prometheus and Alertmanager (from the repo's configs), the exporter and the detector come up on
free loopback ports; a DP2×PP2 testbed job trains with the torch.distributed hook writing rings; after a
healthy warm-up one rank is slowed (a stop-the-world pause each iteration), later the fault is removed.
The table shows every rank's iteration time as the job reports it; alerts are printed as Alertmanager
delivers them to the webhook (a stand-in for the remediator). `failslow testbed demo` is the testbed alone.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import threading
from pathlib import Path

HELP = "the whole loop: testbed job + exporter + Prometheus + detector + Alertmanager, a fault, its alerts"

_PROGRESS = re.compile(r"^rank\s+(\d+)\s+it\s+(\d+)\s+([\d.]+) ms")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `failslow demo`."""
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--fault", default="gc:rank=3,every=1,pause=0.4",
                   help="fault spec without schedule (default: 0.4 s pause every iteration on rank 3)")
    p.add_argument("--warmup", type=float, default=40.0, help="healthy seconds before the fault")
    p.add_argument("--fault-for", type=float, default=60.0,
                   help="seconds the fault stays on (detection takes ~55 s with the shipped settings)")
    p.add_argument("--after", type=float, default=90.0, help="at most this long to wait for the resolution")
    p.add_argument("--keep", default=None, help="keep logs and configs in this directory")


class _Table:
    """Collects `rank R it I T ms` lines and prints one row per iteration once every rank reported it."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.rows: dict[int, dict[int, float]] = {}
        self.next = 0
        self.lock = threading.Lock()
        self.header = " iter " + "".join(f"{'rank' + str(r):>8}" for r in range(world)) + "   (seconds)"

    def line(self, text: str) -> None:
        m = _PROGRESS.match(text.strip())
        if not m:
            return
        rank, it, ms = int(m.group(1)), int(m.group(2)), float(m.group(3))
        with self.lock:
            self.rows.setdefault(it, {})[rank] = ms / 1000.0
            while len(self.rows.get(self.next, {})) == self.world:
                if self.next % 40 == 0:
                    print(self.header, flush=True)
                row = self.rows.pop(self.next)
                slow = max(row.values())
                print(f"{self.next:5d} " + "".join(f"{row[r]:8.3f}" for r in range(self.world))
                      + "  " + "#" * min(40, int(slow / 0.05)), flush=True)
                self.next += 1


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 when FailSlowDetected reached the webhook."""
    from failslow_cli.stack.alert_path import run_alert_path

    def go(tmp: Path) -> int:
        print(f"failslow demo: working directory {tmp}", flush=True)
        table = _Table(args.dp * args.pp)
        res = run_alert_path(tmp, dp=args.dp, pp=args.pp, fault=args.fault,
                             fault_rank=_rank_of(args.fault), warmup_s=args.warmup, fault_s=args.fault_for,
                             max_after_s=args.after, say=lambda m: print(m, flush=True),
                             on_testbed_line=table.line)
        print("\n" + res.summary(), flush=True)
        if not res.firing:
            print("failslow demo: FailSlowDetected did not reach the webhook; logs:\n" + res.diagnostics())
            return 1
        return 0

    if args.keep:
        path = Path(args.keep)
        path.mkdir(parents=True, exist_ok=True)
        return go(path)
    with tempfile.TemporaryDirectory(prefix="failslow-demo-") as d:
        return go(Path(d))


def _rank_of(spec: str) -> int:
    m = re.search(r"rank=(\d+)", spec)
    return int(m.group(1)) if m else -1

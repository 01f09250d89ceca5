"""`failslow demo` (what `make demo` runs): the whole loop on one machine, for real, from fault to fix.

Redis, Prometheus and Alertmanager (from the repo's configs), the exporter, the detector and the remediator
(mode auto, the testbed adapter) come up on free loopback ports; a DP2×PP2 testbed job trains with the
torch.distributed hook, each rank a device of its own (dedicated-device emulation). After a healthy warm-up
one rank's CPU is cut; the detector confirms the slowdown, Alertmanager calls the remediator, which
rebalances the micro-batches away from the slow replica; when the fault is removed it returns to the job's
own split, the alert resolves and the event closes. A compact live view (a line per rank, redrawn in
place, the loop's phase and the last decision) shows it happen; the closing summary gives the times.
`failslow testbed demo` is the testbed alone.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HELP = "the whole loop: a fault, the alert, the remediator's decision and rebalance, the pace coming back"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `failslow demo`."""
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--fault", default="cpu:rank=1,quota=0.12",
                   help="fault spec without schedule (default: rank 1's CPU cut to 0.12 of a core while every "
                        "rank runs as a device of speed 0.4: it computes 3.3x slower)")
    p.add_argument("--warmup", type=float, default=40.0, help="healthy seconds before the fault")
    p.add_argument("--fault-for", type=float, default=110.0,
                   help="seconds the fault stays on (the alert takes about 50 s with the shipped settings)")
    p.add_argument("--max", type=float, default=420.0, help="give up after this many seconds")
    p.add_argument("--mode", choices=("auto", "dry-run"), default="auto",
                   help="the remediator's mode (dry-run: it plans and audits, acts on nothing)")
    p.add_argument("--keep", default=None, help="keep logs, configs and the job's run directory here")


class LiveView:
    """A fixed block of lines redrawn in place on a terminal (or printed every 10 s when not a terminal)."""

    def __init__(self, world: int, dp: int, out: Any = None) -> None:
        self.world, self.dp = world, dp
        self.out = out or sys.stdout
        self.tty = self.out.isatty()
        self.drawn = 0
        self.last_print = 0.0
        self.seen_actions: set[str] = set()

    def lines(self, s: Any) -> list[str]:
        t = time.time() - s.t0
        healthy = s.pace(s.t0 + 15.0, s.fault_start) if s.fault_start else s.pace(s.t0 + 15.0, time.time())
        recent = s.pace(time.time() - 10.0, time.time())
        ratio = f" ({recent / healthy:.2f}x healthy)" if recent and healthy else ""
        out = [f" t={t:5.0f}s  phase: {s.phase()}"]
        # bars on a fixed scale (3x the healthy iteration fills the line), so a slowdown shows as length
        width = max([3.0 * healthy if healthy else 0.0, *s.last_dt.values()])
        for r in range(self.world):
            dt = s.last_dt.get(r)
            bar = "" if dt is None or width == 0 else "#" * max(1, int(30 * dt / max(width, 1e-9)))
            tag = f"dp{r % self.dp} pp{r // self.dp}"
            out.append(f"   rank {r} ({tag})  {'-' if dt is None else f'{dt:6.3f} s'}  {bar}")
        split = next((a["params"]["counts"] for a in sorted(s.actions, key=lambda a: a.get("created_at") or 0,
                                                             reverse=True)
                      if a.get("strategy") == "rebalance" and a.get("state") == "succeeded"), None)
        out.append(f"   iteration: healthy {_f(healthy)}, last 10 s {_f(recent)}{ratio}"
                   f"{'' if split is None else f'; micro-batches per replica {split}'}")
        ev = s.event
        last = (ev or {}).get("last_decision") or {}
        out.append(f"   remediator: {('decision ' + str(last.get('strategy')) + ': ' + str(last.get('reason', ''))[:90]) if last else 'no event'}")
        return out

    def draw(self, s: Any) -> None:
        for a in sorted(s.actions, key=lambda a: a.get("created_at") or 0):
            if a["id"] not in self.seen_actions and a.get("state") in ("succeeded", "failed", "rejected"):
                self.seen_actions.add(a["id"])
                pr = a.get("predicted") or {}
                self._say(f"[{time.time() - s.t0:5.0f}s] action {a['strategy']} {a['state']}: "
                          f"{a.get('params', {}).get('counts', a.get('params'))}, iteration predicted "
                          f"{_f(pr.get('pace_before_s'))} -> {_f(pr.get('pace_s'))}; "
                          f"{(a.get('outcome') or {}).get('detail', '')}")
        block = self.lines(s)
        if self.tty:
            if self.drawn:
                self.out.write(f"\x1b[{self.drawn}F")
            for line in block:
                self.out.write("\x1b[2K" + line + "\n")
            self.drawn = len(block)
            self.out.flush()
        elif time.time() - self.last_print >= 10.0:
            self.last_print = time.time()
            self.out.write("\n".join(block) + "\n")
            self.out.flush()

    def _say(self, msg: str) -> None:
        if self.tty and self.drawn:
            self.out.write(f"\x1b[{self.drawn}F\x1b[J")
            self.drawn = 0
        self.out.write(msg + "\n")
        self.out.flush()


def _f(x: Any) -> str:
    return "-" if x is None else f"{float(x):.3f} s"


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 when the remediator acted and the event closed with the pace back."""
    from failslow_cli.stack.loop import run_loop

    def go(tmp: Path) -> int:
        print(f"failslow demo: DP{args.dp}xPP{args.pp} testbed job, fault {args.fault} after {args.warmup:g} s "
              f"for {args.fault_for:g} s, remediator in {args.mode} mode; working directory {tmp}", flush=True)
        view = LiveView(args.dp * args.pp, args.dp)
        res = run_loop(tmp, dp=args.dp, pp=args.pp, fault=args.fault, warmup_s=args.warmup,
                       fault_s=args.fault_for, max_s=args.max, mode=args.mode, on_tick=view.draw, say=view._say)
        view.draw(res.state)
        s = res.state
        t = res.times()
        print("\n" + res.summary(), flush=True)
        acts = [a for a in s.actions if a.get("job") == s.job and not a.get("dry_run")]
        ev = s.event
        print(f"fault -> alert {_t(t.get('alert'))} -> action {_t(t.get('action_started'))} -> fault removed "
              f"{_t(t.get('fault_end'))} -> event closed (pace confirmed back) {_t(t.get('event_closed'))}; "
              f"{len(acts)} action(s)", flush=True)
        print("logs, configs and the remediator's Redis file: " + (str(tmp) if args.keep else
              "pass --keep DIR to keep them"), flush=True)
        ok = bool(acts) and ev is not None and ev.get("state") == "closed"
        if args.mode == "dry-run":
            ok = ev is not None and any(a.get("dry_run") for a in s.actions)
        if not ok:
            print("failslow demo: the loop did not close; remediator log tail:\n"
                  + res.logs.get("remediator", "")[-3000:], flush=True)
        return 0 if ok else 1

    if args.keep:
        path = Path(args.keep)
        path.mkdir(parents=True, exist_ok=True)
        return go(path)
    tmp = Path(tempfile.mkdtemp(prefix="failslow-demo-"))
    try:
        return go(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _t(x: float | None) -> str:
    return "n/a" if x is None else f"+{x:.0f} s"

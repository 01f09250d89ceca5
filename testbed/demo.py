"""`failslow testbed demo` (what `make demo` runs): a short job, one fault mid-run, live per-rank times.

DP2×PP2 on four network namespaces; a 20 mbit link fault on node 1 switches on at iteration
`--fault-start` and off at `--fault-stop` (without root: a GC-pause fault, since links and cgroups
need root). Each iteration prints one row with every rank's iteration time as soon as all ranks
finished it; at the end a summary compares healthy and faulty iterations.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from testbed.cli_run import add_job_arguments, job_config
from testbed.launcher import Testbed, TestbedError, signals_raise
from testbed.netns import have_root

HELP = "short live demo: a DP2×PP2 job, one fault injected mid-run and removed, per-rank times, summary"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `failslow testbed demo`."""
    add_job_arguments(p)
    p.add_argument("--iterations", type=int, default=36)
    p.add_argument("--fault-start", type=int, default=12, help="iteration the fault starts")
    p.add_argument("--fault-stop", type=int, default=22, help="iteration the fault stops")
    p.add_argument("--fault", default=None,
                   help="fault spec without schedule (default link:node=1,rate=20mbit as root, else a GC fault)")


def classify(rep: dict[str, Any], warmup: int = 2) -> tuple[list[float], list[float], list[float]]:
    """Split iterations (slowest rank per iteration) into before, during and after the fault episodes."""
    eps = [(e["start_unix_s"], e["end_unix_s"] or float("inf")) for e in rep["faults"]]
    first_start = min((a for a, _ in eps), default=float("inf"))
    last_end = max((b for _, b in eps), default=float("-inf"))
    ranks = list(rep["iteration_time_s"])
    n = min(len(rep["iteration_time_s"][r]) for r in ranks)
    before, during, after = [], [], []
    for i in range(warmup, n):
        dt = max(rep["iteration_time_s"][r][i] for r in ranks)
        end = max(rep["iteration_end_unix_s"][r][i] for r in ranks)
        start = min(rep["iteration_end_unix_s"][r][i] - rep["iteration_time_s"][r][i] for r in ranks)
        if any(a < end and start < b for a, b in eps):
            during.append(dt)
        elif end <= first_start:
            before.append(dt)
        elif start >= last_end:
            after.append(dt)
    return before, during, after


def run(args: argparse.Namespace) -> int:
    """Run the demo; returns 0 when the job finished."""
    root = have_root() and not args.loopback
    spec = args.fault or ("link:node=1,rate=20mbit" if root else "gc:rank=1,every=1,pause=0.3")
    spec = f"{spec},start_iter={args.fault_start},stop_iter={args.fault_stop}"
    cfg = job_config(args, args.iterations)
    lay = cfg.layout()
    where = f"{lay.num_nodes} network namespaces" if root else "loopback (not root: no namespaces, no link faults)"
    print(f"failslow testbed demo: DP{cfg.dp}×PP{cfg.pp}×TP{cfg.tp}, {lay.world_size} ranks on {where}; "
          f"{args.iterations} iterations; fault {spec}", flush=True)
    w = lay.world_size
    print(" iter " + "".join(f"{'rank' + str(r):>8}" for r in range(w)) + "     loss  fault", flush=True)
    rows: dict[int, dict[int, dict[str, Any]]] = {}
    shown: set[int] = set()
    tb_ref: list[Testbed] = []

    def on_iteration(rec: dict[str, Any]) -> None:
        rows.setdefault(rec["it"], {})[rec["rank"]] = rec
        for it in sorted(rows):
            if it in shown or len(rows[it]) < w:
                continue
            shown.add(it)
            recs = rows[it]
            losses = [r["loss"] for r in recs.values() if r.get("loss") is not None]
            loss = f"{statistics.fmean(losses):8.3f}" if losses else " " * 8
            # link/cpu faults act at once; trainer faults from the iteration the ranks report them in
            active = [f.spec.split(",start_iter")[0] for f in tb_ref[0].faults
                      if f.active and f.kind in ("link", "cpu")] if tb_ref else []
            active += sorted({fid.split("@")[0] for r in recs.values() for fid in r.get("faults", [])})
            slow = max(r["dt"] for r in recs.values())
            bar = "#" * min(40, int(slow / 0.05))
            print(f"{it:5d} " + "".join(f"{recs[r]['dt']:8.3f}" for r in range(w)) +
                  f" {loss}  {'ON ' + active[0] if active else '':<28} {bar}", flush=True)

    with signals_raise(), Testbed(cfg, [spec], on_iteration=on_iteration,
                                  log=lambda m: print(f"  -- {m}", flush=True)) as tb:
        tb_ref.append(tb)
        try:
            tb.start()
            rep = tb.wait()
        except TestbedError as exc:
            print(f"failslow testbed demo: job failed: {exc}", file=sys.stderr)
            return 1
    before, during, after = classify(rep)
    print("\nsummary (slowest rank per iteration, first 2 iterations skipped as warm-up):")
    for name, xs in (("healthy before", before), ("with the fault", during), ("after removal", after)):
        if xs:
            print(f"  {name:<15} {len(xs):3d} iterations, mean {statistics.fmean(xs):.3f} s")
    if before and during:
        base = statistics.fmean(before + after)
        print(f"  slowdown under the fault: {statistics.fmean(during) / base:.2f}× "
              f"(healthy mean {base:.3f} s, faulty mean {statistics.fmean(during):.3f} s)")
    if rep["losses"]:
        print(f"  loss {rep['losses'][0]:.3f} -> {rep['losses'][-1]:.3f} (training for real)")
    return 0

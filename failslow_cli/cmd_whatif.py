"""`failslow whatif`: what-if analysis of an operation trace (how fast without stragglers, who is to blame)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = "what-if analysis of a training trace: slowdown S, per-op/worker decompositions, root cause"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `failslow whatif`."""
    p.add_argument("trace", help="trace file: .parquet, .csv or .csv.gz (whatif-ST column schema)")
    p.add_argument("--meta", help="metadata YAML (dp_size, pp_size, ...); default: found beside the trace "
                                  "(meta-<X>.yaml for trace-<X>.*, <stem>.yaml, meta.yaml), else inferred")
    p.add_argument("--out", help="also write the JSON result to this file")
    p.add_argument("--heatmap", help="write a DP x PP heatmap of per-worker slowdown S_w (PNG)")
    p.add_argument("--textfile", help="write per-worker S_w as a Prometheus textfile (.prom)")
    p.add_argument("--job", help="job label (default: the metadata's trial_name, else the trace's name)")
    p.add_argument("--ideal", choices=("mean", "median"), default="mean",
                   help="idealised compute duration per op type: mean (the what-if study's definition, "
                        "default) or median (robust for small jobs where one straggler shifts the mean)")
    p.add_argument("--equalise", choices=("all", "stage"), default="all",
                   help="ops sharing one ideal duration: all of an op type (default; stage imbalance counts as "
                        "straggling) or those of an op type on one stage (only DP ranks/steps equalised)")
    p.add_argument("--launch-delays", choices=("drop", "ideal"), default="drop",
                   help="untraced CPU gaps before ops: drop them from every timeline (the study's method, "
                        "default) or keep them as work, idealised to the per-op-type median (CPU testbeds)")
    p.add_argument("--continuous", action="store_true",
                   help="steps are consecutive iterations run back to back (a testbed run): simulate them in "
                        "sequence; T is the iteration period (implies --launch-delays ideal)")
    p.add_argument("--host-cpus", type=float, metavar="N",
                   help="the workers share N CPU cores (a CPU testbed on one host; needs --continuous): also "
                        "replay T, T_ideal and S_fix_top on a processor-sharing model of those cores ('shared_cpu')")
    p.add_argument("--skip-steps", type=int, default=0, metavar="N",
                   help="leave out the trace's first N steps (warm-up iterations)")
    p.add_argument("--max-sim-error", type=float, default=0.05,
                   help="refuse when the simulated mean step time is off the measured one by more (default 0.05)")


def run(args: argparse.Namespace) -> int:
    """Analyse the trace and print the JSON result."""
    from failslow.errors import InputError
    from failslow.whatif import analyze, find_meta, read_meta, read_trace
    from failslow.whatif.trace import select_steps

    if not args.max_sim_error > 0:
        raise InputError("--max-sim-error must be positive")
    meta_path = args.meta or find_meta(args.trace)
    meta = read_meta(meta_path) if meta_path else None
    trace = select_steps(read_trace(args.trace, meta), args.skip_steps)
    job = args.job or trace.meta.trial_name or Path(args.trace).name.split(".")[0]
    result = analyze(trace, job=job, max_sim_error=args.max_sim_error, ideal=args.ideal,
                     equalise=args.equalise, launch_delays=args.launch_delays, continuous=args.continuous,
                     host_cpus=args.host_cpus)
    text = json.dumps(result.to_json(), indent=2)
    if args.out:
        from failslow.whatif.output import write_text

        write_text(args.out, text + "\n")
    if args.textfile:
        from failslow.whatif.output import write_textfile

        write_textfile(result, args.textfile, job)
    if args.heatmap:
        from failslow.whatif.output import write_heatmap

        write_heatmap(result, args.heatmap)
    print(text)
    return 0

"""`failslow testbed run`: one training job with optional faults, a report and a trace."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from failslow.errors import InputError
from testbed.config import ModelConfig
from testbed.faults import parse_spec
from testbed.launcher import JobConfig, Testbed, TestbedError, signals_raise
from testbed.netns import have_root
from testbed.trace import check_trace_path

HELP = "run a DP×PP(×TP) training job on CPU ranks, inject faults, write the report (and trace)"


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by `run` and `demo`: layout, model and job knobs."""
    p.add_argument("--dp", type=int, default=2, help="data-parallel size (default 2)")
    p.add_argument("--pp", type=int, default=2, help="pipeline stages (default 2)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    p.add_argument("--ranks-per-node", type=int, default=None,
                   help="ranks per node/namespace (default: the TP size, one TP group per node)")
    p.add_argument("--micro-batches", type=int, default=4, help="micro-batches per iteration per DP replica")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--job", default="testbed", help="job name (FAILSLOW_JOB, ring headers, report)")
    p.add_argument("--torch-hook", action="store_true", help="ranks install failslow.record.torchhook (rings)")
    p.add_argument("--ring-dir", default=None, help="FAILSLOW_SHM_DIR for the ranks' rings (default /dev/shm)")
    p.add_argument("--loopback", action="store_true", help="no namespaces even as root (no link faults)")
    p.add_argument("--placement", default=None,
                   help="node of each rank, comma-separated (default: rank // ranks-per-node)")
    p.add_argument("--spare-nodes", type=int, default=0, metavar="N",
                   help="N extra nodes (namespaces on the same bridge) with no rank at start, nodes "
                        "num_nodes..num_nodes+N-1: a restart may move a bad node's ranks onto them (default 0)")
    p.add_argument("--resume", default=None, metavar="CKPT_DIR",
                   help="start from a testbed checkpoint (same layout), continuing its iteration count")
    c = p.add_argument_group("CPU caps (dedicated-device emulation; needs root)")
    c.add_argument("--cpu-cap", type=float, default=None, metavar="CPUS",
                   help="cap every rank at CPUS CPUs (cgroup quota), e.g. 0.4 for 4 ranks on 2 cores: with the "
                        "caps summing below the cores no rank can take another's share (CFS credit after idle "
                        "still lets a rank run ahead for a while: --device-speed is the steadier emulation of "
                        "a device of its own); cpu faults then lower one rank's cap (their quota must be "
                        "below CPUS). Default: uncapped")
    c.add_argument("--cpu-period-us", type=int, default=100_000, metavar="US",
                   help="CFS period of the rank cgroups for the cap and cpu faults, capped or not (default "
                        "100000; 10000 throttles in finer steps)")
    c.add_argument("--pin-cpus", action="store_true",
                   help="bind each rank's threads to one CPU (rank modulo the usable CPUs): a capped rank's "
                        "quota overrun then stays on its CPU, which keeps its share steadier")
    c.add_argument("--device-speed", type=float, default=None, metavar="S",
                   help="each rank's compute ops (forward, backward, optimizer) last their CPU time / S: a "
                        "device of its own S times as fast as one CPU (e.g. 0.4 for 4 ranks on 2 cores), "
                        "unaffected by what the other ranks do; cpu fault quotas must be below S. Default: off")
    m = ModelConfig()
    g = p.add_argument_group("model")
    g.add_argument("--layers", type=int, default=m.layers, help=f"transformer blocks in total (default {m.layers})")
    g.add_argument("--d-model", type=int, default=m.d_model, help=f"hidden size (default {m.d_model})")
    g.add_argument("--heads", type=int, default=m.heads, help=f"attention heads (default {m.heads})")
    g.add_argument("--seq-len", type=int, default=m.seq_len, help=f"tokens per sequence (default {m.seq_len})")
    g.add_argument("--micro-batch-size", type=int, default=m.micro_batch_size,
                   help=f"sequences per micro-batch (default {m.micro_batch_size})")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `failslow testbed run`."""
    add_job_arguments(p)
    p.add_argument("--iterations", type=int, required=True, help="training iterations")
    p.add_argument("--inject", action="append", default=[], metavar="SPEC",
                   help="fault spec, repeatable: link:node=1,rate=20mbit | cpu:rank=3,quota=0.3 | "
                        "gc:rank=2,every=5,pause=0.2 | seqlen:dp=1,factor=1.5 | stage:pp=1,layers=+2 | "
                        "poisson:mean_gap=30,mean_dur=10,kinds=cpu|link; schedule keys at=S,for=S or "
                        "start_iter=N,stop_iter=N")
    p.add_argument("--trace", default=None, help="per-operation trace (.csv, .csv.gz or .parquet) + meta YAML")
    p.add_argument("--report", required=True, help="report JSON path")
    p.add_argument("--run-dir", default=None, help="keep the run directory here (default: a temp dir)")
    p.add_argument("--progress", action="store_true", help="print one line per iteration")


def job_config(args: argparse.Namespace, iterations: int) -> JobConfig:
    """The JobConfig the options describe."""
    model = ModelConfig(layers=args.layers, d_model=args.d_model, heads=args.heads, seq_len=args.seq_len,
                        micro_batch_size=args.micro_batch_size)
    return JobConfig(dp=args.dp, pp=args.pp, tp=args.tp, ranks_per_node=args.ranks_per_node, iterations=iterations,
                     micro_batches=args.micro_batches, model=model, seed=args.seed, job=args.job,
                     torch_hook=args.torch_hook, ring_dir=args.ring_dir,
                     namespaces=False if args.loopback else None, placement=_placement(args.placement),
                     spare_nodes=args.spare_nodes,
                     resume_dir=_resume(args.resume), cpu_cap=args.cpu_cap, cpu_period_us=args.cpu_period_us,
                     pin_cpus=args.pin_cpus, device_speed=args.device_speed)


def _placement(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise InputError(f"--placement wants comma-separated node numbers, got {text!r}") from None


def _resume(directory: str | None) -> str | None:
    if directory is not None and not any(Path(directory).glob("pp*-tp*.pt")):
        raise InputError(f"--resume {directory}: no testbed checkpoint there (pp<i>-tp<j>.pt files)")
    return directory


def check_writable(path: Path, what: str) -> None:
    """Refuse an output path we could not write at the end of a long run.

    Raises:
        InputError: the directory does not exist or is not writable, or the path is a directory.
    """
    if path.is_dir():
        raise InputError(f"{what} {path} is a directory")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{what} {path}: directory {parent} does not exist")
    existed = path.exists()
    try:  # the only reliable check (root passes os.access on read-only mounts such as /proc)
        with open(path, "a"):
            pass
    except OSError as exc:
        raise InputError(f"{what} {path} is not writable: {exc.strerror}") from None
    if not existed:
        path.unlink()


def run(args: argparse.Namespace) -> int:
    """Run the job; exit 0 on success, 2 on bad input, 1 when the job failed."""
    report = Path(args.report)
    check_writable(report, "report")
    if args.trace:
        check_trace_path(Path(args.trace))
        check_writable(Path(args.trace), "trace")
    for spec in args.inject:
        parse_spec(spec)  # syntax errors before anything starts
    cfg = job_config(args, args.iterations)
    if not have_root() or args.loopback:
        print("failslow testbed: no network namespaces (not root or --loopback): ranks use loopback; "
              "link and path faults are unavailable", file=sys.stderr)

    def show(rec: dict[str, Any]) -> None:
        if args.progress:
            loss = f" loss {rec['loss']:.3f}" if rec.get("loss") is not None else ""
            print(f"rank {rec['rank']:>2} it {rec['it']:>4} {rec['dt'] * 1000:8.1f} ms{loss}", flush=True)

    with signals_raise(), Testbed(cfg, args.inject, run_dir=args.run_dir, on_iteration=show,
                                  log=lambda m: print(f"failslow testbed: {m}", file=sys.stderr)) as tb:
        try:
            tb.start()
            tb.wait()
        except TestbedError as exc:
            print(f"failslow testbed run: job failed: {exc}", file=sys.stderr)
            return 1
        rep = tb.report(trace=args.trace)
    report.write_text(json.dumps(rep, indent=1))
    times = [t for v in rep["iteration_time_s"].values() for t in v]
    mean = sum(times) / len(times) if times else float("nan")
    print(f"failslow testbed: {len(rep['iteration_time_s'])} ranks, {args.iterations} iterations, "
          f"mean iteration {mean:.3f} s, loss {rep['losses'][0]:.3f} -> {rep['losses'][-1]:.3f}; report {report}",
          file=sys.stderr)
    return 0

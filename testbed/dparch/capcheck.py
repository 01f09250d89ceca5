"""How a CPU-capped training step behaves: wall time, CPU time and CPU share per cap setting.

`python -m testbed.dparch.capcheck [--steps 40] [--repeats 3] [--idle 0.03]` (root) trains the
testbed MLP in this process, moved into a fresh cgroup v1 ``cpu`` group per setting, and prints per
run: wall time per step (mean, CV), CPU time per step (``thread_time``), the CPU share actually
received (CPU / wall) and how many CFS periods throttled. It is the evidence behind the sweep's
protocol in docs/predict.md: pinned vs unpinned ranks, the 10 ms period, and after-idle steps (a
step that starts after waiting gets a full quota and runs faster than one in a back-to-back
sequence). Not part of `make test`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from testbed.cgroup import CpuCgroup

SETTINGS = (  # (cap in CPUs, CFS period µs, pinned to one CPU)
    (0.1556, 10_000, False), (0.1556, 10_000, True), (0.1556, 100_000, True),
)


def _cpu_stat(cg: CpuCgroup) -> dict[str, int]:
    return {k: int(v) for k, v in (ln.split() for ln in (cg.path / "cpu.stat").read_text().splitlines())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed.dparch.capcheck", description=__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--idle", type=float, default=0.0, help="seconds of sleep before every step")
    args = ap.parse_args(argv)
    import torch

    from testbed.dparch.train import Trainer

    torch.set_num_threads(1)
    tr = Trainer({"width": 256, "depth": 5, "classes": 10, "seed": 0, "rank": 0, "batch_size": 512, "lr": 1e-3})
    for _ in range(3):
        tr.forward_backward()
    all_cpus = os.sched_getaffinity(0)
    for cap, period, pinned in SETTINGS:
        os.sched_setaffinity(0, {min(all_cpus)} if pinned else all_cpus)
        for _ in range(args.repeats):
            cg = CpuCgroup.create(f"capcheck{os.getpid()}")
            try:
                cg.set_quota(cap, period_us=period)
                cg.set_shares(8192)
                for tid in os.listdir(f"/proc/{os.getpid()}/task"):
                    (cg.path / "tasks").write_text(tid)
                s0 = _cpu_stat(cg)
                wall: list[float] = []
                cpu: list[float] = []
                for _ in range(args.steps):
                    if args.idle:
                        time.sleep(args.idle)
                    t0, c0 = time.perf_counter(), time.thread_time()
                    tr.forward_backward()
                    tr.apply_flat_grad(tr.gather_grad(), 1.0)
                    wall.append(time.perf_counter() - t0)
                    cpu.append(time.thread_time() - c0)
                s1 = _cpu_stat(cg)
            finally:
                cg.destroy()
            wm, cm = statistics.fmean(wall), statistics.fmean(cpu)
            print(f"cap {cap:.4f} period {period // 1000} ms pinned {pinned!s:5} idle {args.idle:.3f}s: "
                  f"wall {1e3 * wm:6.1f} ms/step (CV {100 * statistics.pstdev(wall) / wm:4.1f}%), "
                  f"CPU {1e3 * cm:5.2f} ms/step, share {cm / wm:.3f} CPU, throttled "
                  f"{s1['nr_throttled'] - s0['nr_throttled']}/{s1['nr_periods'] - s0['nr_periods']} periods",
                  flush=True)
    os.sched_setaffinity(0, all_cpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())

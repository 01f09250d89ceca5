"""Testbed benchmark: DP2×PP2 speed, and how much a link fault and a CPU fault slow it (and stop slowing it).

Each fault is measured inside one job: healthy iterations before the fault, iterations with the fault
(switched on and off by iteration number), and iterations after removal. The ratio against the healthy
phase of the same job is the figure that holds on this shared, noisy machine; absolute times are
indicative. Iteration time is the slowest rank's, as the report gives it.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from testbed.launcher import JobConfig, run_job

TITLE = "Testbed: DP2×PP2 iteration rate and fault slowdowns"

HEALTHY, TOTAL = 3, 40  # iterations; the first HEALTHY are start-up
WINDOWS = ((10, 17), (24, 31))  # fault on [a, b): two cycles, so load drift on the machine averages out
SETTLE = 1  # iterations after a switch that may straddle it (faults switch between iterations)
# The job cgroup's CPU weight, in ordinary processes per rank. The default (2) is gentle to the
# other engineers' work on this machine; the benchmark asks for 16 so that the ranks get the CPU a
# dedicated node would give them, whatever else is running — otherwise a 0.3-CPU quota can be more
# than what a starved rank gets anyway and the CPU fault measures nothing.
CPU_WEIGHT = 16.0


def _slowest(rep: dict[str, Any]) -> list[float]:
    ranks = list(rep["iteration_time_s"])
    n = min(len(rep["iteration_time_s"][r]) for r in ranks)
    return [max(rep["iteration_time_s"][r][i] for r in ranks) for i in range(n)]


def _phases(times: list[float]) -> tuple[list[float], list[float], list[float]]:
    """(healthy, with fault, after the last removal) iteration times."""
    on = {i for a, b in WINDOWS for i in range(a + SETTLE, b)}
    near = {i for a, b in WINDOWS for i in range(a, b + SETTLE)}
    healthy = [t for i, t in enumerate(times) if i >= HEALTHY and i not in near]
    during = [t for i, t in enumerate(times) if i in on]
    after = times[WINDOWS[-1][1] + SETTLE:]
    return healthy, during, after


def _job(spec: str | None) -> dict[str, Any]:
    faults = [f"{spec},start_iter={a},stop_iter={b}" for a, b in WINDOWS] if spec else []
    return run_job(JobConfig(dp=2, pp=2, iterations=TOTAL, micro_batches=4, cpu_weight=CPU_WEIGHT), faults)


def run() -> str:
    """Run the three jobs; returns the Markdown section."""
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    healthy = _job(None)
    wall = time.monotonic() - t0
    h = _slowest(healthy)[HEALTHY:]
    rows = []
    for name, spec in (("link 20 mbit on node 1 (DP + PP link of rank 1)", "link:node=1,rate=20mbit"),
                       ("CPU quota 0.3 on rank 3", "cpu:rank=3,quota=0.3")):
        rep = _job(spec)
        before, during, after = _phases(_slowest(rep))
        b, d, a = statistics.median(before), statistics.median(during), statistics.median(after)
        rows.append(f"| {name} | `{spec}` | {b:.3f} | {d:.3f} | **{d / b:.2f}×** | {a:.3f} | {a / b:.2f}× |")
    load1 = os.getloadavg()[0]
    med = statistics.median(h)
    lines = [
        f"Job: `failslow testbed run --dp 2 --pp 2 --micro-batches 4 --iterations {TOTAL}` (default model: "
        "GPT, 4 layers, d_model 192, 4 heads, seq 64, micro-batch 4 sequences; 4 ranks on 4 network "
        "namespaces, gloo over veth + bridge).",
        "",
        f"- Healthy DP2×PP2 (no fault job): median iteration **{med:.3f} s** → **{1 / med:.2f} iterations/s** "
        f"(mean {statistics.fmean(h):.3f} s over {len(h)} iterations after {HEALTHY} start-up ones); "
        f"whole job incl. start-up {wall:.1f} s.",
        f"- Machine load average (1 min) at start / end: {load0:.1f} / {load1:.1f} (shared with other engineers).",
        "",
        f"Faults on during iterations {WINDOWS[0][0]}–{WINDOWS[0][1] - 1} and {WINDOWS[1][0]}–{WINDOWS[1][1] - 1} "
        "(two `start_iter`/`stop_iter` specs); medians of the slowest rank's iteration time; the iteration a "
        "switch lands in is skipped; `after removal` = the iterations after the second window. Peer: the "
        f"healthy iterations of the same job. Job cgroup CPU weight {CPU_WEIGHT:g} processes per rank "
        "(stands in for a dedicated node on this shared machine; the testbed default is 2).",
        "",
        "| fault | spec | healthy (s) | with fault (s) | slowdown | after removal (s) | after / healthy |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Target: each fault slows iterations ≥ 1.3× and the slowdown ends after removal (after/healthy ≈ 1).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run())

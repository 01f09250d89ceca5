"""Host-path overhead of the NCCL shim: ns added per call, bare vs LD_PRELOAD, against the stand-in libnccl.

One run, interleaved rounds: the same benchmark binary (shim/tests/bench_shim.c) calls ncclAllReduce on
the stand-in libnccl (which returns at once) without and with ``LD_PRELOAD=libfailslow_shim.so``; the
difference of medians is what the shim adds per call. The cost of one clock_gettime on this machine is
measured in the same run, because the shim reads the clock twice per call.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
from pathlib import Path

TITLE = "NCCL shim host-path overhead (shim/)"
ROOT = Path(__file__).resolve().parent.parent
SHIM = ROOT / "shim"
CALLS = 2_000_000
ROUNDS = 7


def _run(args: list[str], env: dict[str, str]) -> float:
    out = subprocess.run([str(SHIM / "build" / "bench_shim"), *args], env=env, capture_output=True, text=True,
                         check=True, timeout=300).stdout.split()
    return float(out[1])


def run() -> str:
    """Build the shim and its bench, run bare and preloaded rounds, return the Markdown section."""
    from bench._report import machine

    subprocess.run(["make", "-s", "-C", str(SHIM), "bench"], check=True, capture_output=True, timeout=300)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    rows = []
    clock = []
    with tempfile.TemporaryDirectory(prefix="bench-shim-", dir=shm) as ringdir:
        base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        pre = {**base, "LD_PRELOAD": str(SHIM / "build" / "libfailslow_shim.so"), "FAILSLOW_SHM_DIR": ringdir}
        for threads in (1, 2):
            bare, hooked = [], []
            for r in range(ROUNDS):
                order = [(bare, base), (hooked, pre)] if r % 2 == 0 else [(hooked, pre), (bare, base)]
                for acc, env in order:
                    acc.append(_run([str(CALLS // threads), str(threads)], env))
                clock.append(_run(["clock", "1000000"], base))
            b, h = statistics.median(bare), statistics.median(hooked)
            rows.append((threads, b, h))
    ck = statistics.median(clock)
    lines = [
        f"Machine: {machine()}",
        "",
        f"Command: `.venv/bin/python -m bench shim` — `shim/build/bench_shim CALLS THREADS`, {CALLS:,} "
        f"ncclAllReduce calls per round on the stand-in libnccl, {ROUNDS} rounds alternating bare / "
        "`LD_PRELOAD=shim/build/libfailslow_shim.so` (ring in /dev/shm, PROFILE off); medians over rounds.",
        "",
        "| threads | bare ns/call | with shim ns/call | added ns/call | ratio | added minus 2 clock reads |",
        "|---|---|---|---|---|---|",
    ]
    for threads, b, h in rows:
        lines.append(f"| {threads} | {b:.1f} | {h:.1f} | {h - b:.1f} | {h / b:.2f} | {h - b - 2 * ck:.1f} |")
    lines += [
        "",
        f"One `clock_gettime(CLOCK_MONOTONIC)` costs {ck:.1f} ns on this machine (same run, median). The shim",
        "reads the clock twice per call (entry and return) and makes two atomic read-modify-writes (claim the",
        "sequence number, stamp the slot); the rest is ~20 plain stores into the ring. Target: < 100 ns added",
        "per call. On a VM where the clock read alone costs more than that, the target cannot be met and is",
        "not; the last column is the shim's own work without the clock reads.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run())

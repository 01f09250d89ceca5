"""Overhead of the torch.distributed hook: per call and per training iteration, hook vs no hook, one run.

Two gloo ranks on loopback. The hook is installed once; the "no hook" peer calls the unwrapped functions
(``fn.__wrapped__``), so both arms run in the same processes, interleaved in blocks to cancel drift.
Also a 1-rank group, where the collective itself costs little, to show the hook's own cost per call.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TITLE = "torch.distributed hook overhead (failslow/record/torchhook.py)"
WS = 2
BLOCKS = 10
CALLS = 200
ITERS = 10


def _worker() -> None:
    import torch
    import torch.distributed as dist

    import failslow.record.torchhook as th

    rank = int(os.environ["RANK"])
    th.install(directory=os.environ["RINGDIR"])
    dist.init_process_group("gloo", rank=rank, world_size=WS)
    solos = [dist.new_group([r]) for r in range(WS)]  # every rank creates every group
    solo = solos[rank]
    hooked = dist.all_reduce
    bare = hooked.__wrapped__
    x = torch.ones(256)  # 1 KiB

    def noop(tensor, op=None, group=None, async_op=False):  # type: ignore[no-untyped-def]
        return None

    # the hook's machinery around a function that does nothing: its own cost, no communication
    noop_hooked = th.wrap("all_reduce", noop)
    clock = time.perf_counter_ns
    cpu = time.thread_time_ns

    def timed(body, n: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
        c0, t0 = cpu(), clock()
        body()
        return (clock() - t0) / n, (cpu() - c0) / n

    def per_call(fn, group) -> tuple[float, float]:  # type: ignore[no-untyped-def]
        dist.barrier()

        def body() -> None:
            for _ in range(CALLS):
                fn(x, group=group)
        return timed(body, CALLS)

    def local(fn) -> tuple[float, float]:  # type: ignore[no-untyped-def]
        def body() -> None:
            for _ in range(CALLS * 10):
                fn(x)
        return timed(body, CALLS * 10)

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(32, 64)

    def iteration(fn) -> tuple[float, float]:  # type: ignore[no-untyped-def]
        dist.barrier()

        def body() -> None:
            for _ in range(ITERS):
                opt.zero_grad()
                model(data).square().mean().backward()
                for p in model.parameters():  # per-parameter gradient all-reduce: 16 calls per iteration
                    fn(p.grad)
                opt.step()
        return timed(body, ITERS)

    res: dict[str, list[tuple[float, float]]] = {
        f"{k}_{a}": [] for k in ("noop", "call", "solo", "iter") for a in ("bare", "hook")}
    per_call(bare, None)
    per_call(hooked, None)  # warm-up both arms
    for b in range(BLOCKS):
        order = [("bare", bare, noop), ("hook", hooked, noop_hooked)]
        if b % 2:
            order.reverse()
        for name, fn, nfn in order:
            res[f"noop_{name}"].append(local(nfn))
            res[f"call_{name}"].append(per_call(fn, None))
            res[f"solo_{name}"].append(per_call(fn, solo))
            res[f"iter_{name}"].append(iteration(fn))
    if rank == 0:
        Path(os.environ["OUTFILE"]).write_text(json.dumps({"res": res, "ring": th.ring_file()}))
    dist.barrier()
    dist.destroy_process_group()


def _shm() -> str | None:
    # rings live in /dev/shm in production; a disk-backed directory would add page-allocation costs
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


def run() -> str:
    """Run the two-rank benchmark and return its Markdown section."""
    from bench._report import machine
    from failslow_cli.stack.processes import free_port

    with tempfile.TemporaryDirectory(prefix="bench-torchhook-", dir=_shm()) as tmp:
        port = free_port()
        outfile = Path(tmp) / "out.json"
        procs = []
        for r in range(WS):
            env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(WS), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "RINGDIR": tmp, "OUTFILE": str(outfile), "OMP_NUM_THREADS": "1",
                   "GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
            procs.append(subprocess.Popen([sys.executable, "-m", "bench.bench_torchhook", "--worker"], env=env))
        for p in procs:
            if p.wait(timeout=900) != 0:
                raise RuntimeError("bench_torchhook worker failed")
        data = json.loads(outfile.read_text())["res"]

    def med(k: str, i: int) -> float:
        return statistics.median(v[i] for v in data[k])

    rows = []
    for label, key, unit in [("hook machinery around a no-op function (per call)", "noop", "µs"),
                             ("all_reduce 1 KiB, 2 ranks (per call)", "call", "µs"),
                             ("all_reduce 1 KiB, 1-rank group (per call)", "solo", "µs"),
                             ("training iteration, 8×Linear(64) + 16 all_reduces", "iter", "ms")]:
        for i, clk in enumerate(("wall", "thread CPU")):
            bare, hook = med(f"{key}_bare", i), med(f"{key}_hook", i)
            div = 1e3 if unit == "µs" else 1e6
            rows.append(f"| {label} | {clk} | {bare / div:.2f} {unit} | {hook / div:.2f} {unit} | "
                        f"{(hook - bare) / 1e3:+.2f} µs | {hook / bare:.3f} |")
    return "\n".join([
        f"Machine: {machine()}",
        "",
        "Command: `.venv/bin/python -m bench torchhook` — two gloo ranks on loopback, rings in /dev/shm, hook",
        "installed once; the peer in the same run is the unwrapped function (`dist.all_reduce.__wrapped__`),",
        f"interleaved with the hooked one in {BLOCKS} alternating blocks ({CALLS} calls / {ITERS} iterations per",
        "block); medians over blocks, rank 0's view. Each figure twice: wall time, and the calling thread's",
        "CPU time (`time.thread_time_ns`), which leaves out time spent descheduled or blocked in gloo — on this",
        "oversubscribed 2-core VM the wall figures swing with the neighbours' load.",
        "",
        "| what | clock | no hook | hook | added per call/iteration | ratio hook/no hook |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        "The hook's own work per call is argument lookup, one ring record (a lock, a struct pack into shared",
        "memory, two 8-byte stamps) and two clock reads; the no-op row isolates it from any communication.",
    ])


if __name__ == "__main__":
    if "--worker" in sys.argv:
        _worker()
    else:
        print(run())

"""Re-make the profiler-trace fixtures of tests/period/test_profiler_trace.py.

Two kinds of fixtures:

* **Recorded** (``gloo_*``): real PyTorch profiler traces (torch.profiler, CPU, gloo over 127.0.0.1) of small
  two-process jobs written here, one file per rank: many equal all-reduce buckets per step, a real
  ``DistributedDataParallel`` model with small buckets, a Send/Recv-only two-stage pipeline, and a 3-step
  capture of 7 collectives per step. Each step is a ``ProfilerStep#N`` annotation (the ground truth). The
  traces are recorded with ``record_shapes=True`` (tensor shapes tell collectives apart), trimmed to what
  the parser reads (collective events, step annotations, metadata) plus a few other CPU ops, and gzipped.
* **Synthetic GPU timelines** (``nccl_*``): seeded Kineto-format traces with NCCL kernels on a GPU stream and
  ``ProfilerStep#N`` annotations, shaped like real NCCL traces that period inference got wrong: (a) ~400
  identical AllReduce kernels per iteration, gaps <= 5 ms inside, ~0.2 s between iterations; (b, b2) a
  pipeline stage of 15-16 SendRecv kernels per iteration in three groups, five iterations (b: the groups'
  gaps make parts of ~30, 52 and 133 ms; b2: group gaps close to the iteration's own); (c) three iterations
  of 7 kernels. No GPU is needed to make them.

Usage (from the repository root)::

    .venv/bin/python tests/period/data/profiler/make_traces.py            # everything
    .venv/bin/python tests/period/data/profiler/make_traces.py --synthetic-only

Recording takes about a minute on two cores; the recorded timings differ from run to run (real jobs), the
synthetic files are identical for equal seeds.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
#: Non-collective CPU ops kept per trace, so the parser is tested against ordinary events too.
OTHER_KEPT = 40


# --- recorded gloo jobs ---------------------------------------------------------------------------


def _spin(seconds: float) -> None:
    """Real compute of about ``seconds`` (matmuls), so gaps between calls are work, not sleep."""
    import time

    import torch

    a = torch.randn(96, 96)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)


def _step_equal_buckets(rank: int, state: dict[str, Any]) -> None:
    import torch.distributed as dist

    _spin(0.06)  # forward and the start of the backward pass
    for x in state["buckets"]:
        _spin(0.0005)  # backward of one bucket's layers
        dist.all_reduce(x)
    _spin(0.02)  # optimizer step


def _step_ddp(rank: int, state: dict[str, Any]) -> None:
    import torch

    model, opt = state["model"], state["opt"]
    x = torch.randn(32, 64)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    _spin(0.01)  # data loading


def _step_pipeline(rank: int, state: dict[str, Any]) -> None:
    import torch.distributed as dist

    act, grad = state["act"], state["grad"]
    micro = 4
    if rank == 0:
        for _ in range(micro):
            _spin(0.006)  # forward of a micro-batch
            dist.send(act, 1)
        for _ in range(micro):
            dist.recv(grad, 1)
            _spin(0.01)  # backward
        _spin(0.02)  # optimizer
    else:
        for _ in range(micro):
            dist.recv(act, 0)
            _spin(0.006)  # forward of the last stage
        for _ in range(micro):
            _spin(0.01)  # backward
            dist.send(grad, 0)
        _spin(0.02)


def _step_short(rank: int, state: dict[str, Any]) -> None:
    import torch.distributed as dist

    _spin(0.05)
    for x in state["seven"]:
        _spin(0.004)
        dist.all_reduce(x)
    _spin(0.02)


SHAPES = {
    # name: (step function, profiled steps)
    "gloo_equal_buckets": (_step_equal_buckets, 5),
    "gloo_ddp": (_step_ddp, 5),
    "gloo_pipeline": (_step_pipeline, 8),
    "gloo_short": (_step_short, 3),
}


def _worker(rank: int, world: int, port: int, shape: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    state: dict[str, Any] = {
        "buckets": [torch.ones(256) for _ in range(120)],
        "seven": [torch.ones(64 << k) for k in range(7)],
        "act": torch.ones(4096),
        "grad": torch.ones(4096),
    }
    if shape == "gloo_ddp":
        from torch.nn.parallel import DistributedDataParallel

        layers = [torch.nn.Linear(64, 64) for _ in range(24)]
        model = DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=0.02)
        state["model"] = model
        state["opt"] = torch.optim.SGD(model.parameters(), lr=1e-3)
    step, active = SHAPES[shape]
    sched = schedule(wait=1, warmup=1, active=active, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched, record_shapes=True) as prof:
        for _ in range(active + 2):
            step(rank, state)
            prof.step()
    prof.export_chrome_trace(str(Path(out) / f"rank{rank}.json"))
    dist.barrier()
    dist.destroy_process_group()


_COLLECTIVE_PREFIXES = ("c10d::", "gloo:", "nccl:", "record_param_comms")


def _trim(path: Path) -> dict[str, Any]:
    """Keep the metadata, step annotations, collective events and a few other CPU ops of a raw trace."""
    doc = json.loads(path.read_text())
    kept: list[dict[str, Any]] = []
    others = 0
    for e in doc["traceEvents"]:
        name = str(e.get("name", ""))
        if e.get("ph") == "M" or name.startswith("ProfilerStep#") or name.startswith(_COLLECTIVE_PREFIXES):
            kept.append(e)
        elif e.get("cat") == "cpu_op" and others < OTHER_KEPT:
            kept.append(e)
            others += 1
    keys = ("schemaVersion", "trace_id", "distributedInfo", "displayTimeUnit", "baseTimeNanoseconds", "traceName")
    out = {k: doc[k] for k in keys if k in doc}
    out["traceEvents"] = kept
    return out


def record(shapes: list[str]) -> None:
    """Run each job with two ranks and write ``<shape>/rank{0,1}.json.gz``."""
    import torch.multiprocessing as mp

    from failslow_cli.stack.processes import free_port

    for shape in shapes:
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_worker, args=(2, free_port(), shape, tmp), nprocs=2, join=True)  # type: ignore[attr-defined,no-untyped-call]
            dest = HERE / shape
            dest.mkdir(exist_ok=True)
            for r in (0, 1):
                doc = _trim(Path(tmp) / f"rank{r}.json")
                with gzip.open(dest / f"rank{r}.json.gz", "wt", encoding="utf-8") as f:
                    json.dump(doc, f, separators=(",", ":"))
        print(f"recorded {shape}")


# --- synthetic GPU timelines ----------------------------------------------------------------------


def _kineto(kernels: list[tuple[Any, ...]], steps: list[tuple[float, float]]) -> dict[str, Any]:
    """A Kineto-style trace: ``kernels`` (name, start s, duration s[, stream]) on GPU 1, steps on the CPU."""
    ev: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "python"}},
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "GPU 1"}},
    ]
    for i, (a, b) in enumerate(steps):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i + 2}", "pid": 0, "tid": 7,
                   "ts": round(a * 1e6, 3), "dur": round((b - a) * 1e6, 3), "args": {"External id": i + 1}})
    for i, (name, t, d, *stream) in enumerate(kernels):
        st = stream[0] if stream else 20
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 1, "tid": st, "ts": round(t * 1e6, 3),
                   "dur": round(d * 1e6, 3),
                   "args": {"device": 1, "stream": st, "correlation": 1000 + i, "grid": [4, 1, 1]}})
    return {"schemaVersion": 1, "deviceProperties": [{"id": 1, "name": "synthetic"}], "displayTimeUnit": "ms",
            "traceEvents": ev}


ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


def synth_a(seed: int = 0) -> dict[str, Any]:
    """(a) 400 identical AllReduce kernels per iteration, gaps up to 5 ms inside, ~0.2 s between, 5 iterations."""
    rng = np.random.default_rng(seed)
    t, kernels, steps = 10.0, [], []
    for _ in range(5):
        start = t
        t += 0.2 * rng.lognormal(0, 0.05)  # data loading, forward: no collective
        for i in range(400):
            if i:
                # alternating short/long gaps inside the backward pass (two bucket sizes of work)
                t += (0.0002 if i % 2 else 0.0022) * rng.lognormal(0, 0.6)
            d = 0.00028 * rng.lognormal(0, 0.1)
            kernels.append((ALLREDUCE, t, d))
            t += d
        t += 0.03 * rng.lognormal(0, 0.05)  # optimizer
        steps.append((start, t))
    return _kineto(kernels, steps)


def synth_b(seed: int = 1) -> dict[str, Any]:
    """(b) pipeline stage: 15-16 SendRecv kernels per iteration in three groups of 5, five iterations.

    Each group alternates the kernels of the previous- and next-stage communicators (streams 20, 24) and
    ends with one of a third (stream 28); the first iteration has one more kernel (16). ~5 ms between the
    kernels of a group, 10 and 32 ms between groups, ~80 ms between iterations: parts of ~30, 52 and 133 ms.
    """
    rng = np.random.default_rng(seed)
    t, steps = 5.0, []
    kernels: list[tuple[Any, ...]] = []
    streams = (20, 24, 20, 24, 28)
    for k in range(5):
        start = t
        if k == 0:
            kernels.append((SENDRECV, t, 0.0005))  # a warm-up transfer before the first group
            t += 0.02
        pre = (0.080, 0.010, 0.032)
        for g in range(3):
            t += pre[g] * rng.lognormal(0, 0.03)
            for i in range(5):
                if i:
                    t += 0.0045 * rng.lognormal(0, 0.1)
                d = 0.0005 * rng.lognormal(0, 0.1)
                kernels.append((SENDRECV, t, d, streams[i]))
                t += d
        steps.append((start, t))
    return _kineto(kernels, steps)


def synth_b2(seed: int = 1) -> dict[str, Any]:
    """(b2) pipeline stage: 15-16 SendRecv kernels per iteration in three groups, five iterations.

    The groups (warm-up, steady 1F1B, cool-down) are separated by compute gaps of 15-60 ms, the iteration's
    own boundary (optimizer and data loading) by ~75 ms: not far above the group gaps.
    """
    rng = np.random.default_rng(seed)
    t, kernels, steps = 5.0, [], []
    for k in range(5):
        start = t
        counts = (5, 5, 6 if k % 2 else 5)
        pre = (0.075, 0.018, 0.060)  # the first group waits for the optimizer step and data loading
        for g in range(3):
            t += pre[g] * rng.lognormal(0, 0.05)
            for i in range(counts[g]):
                if i:
                    t += 0.0015 * rng.lognormal(0, 0.3)
                d = 0.0012 * rng.lognormal(0, 0.1)
                kernels.append((SENDRECV, t, d))
                t += d
        steps.append((start, t))
    return _kineto(kernels, steps)


def synth_c(seed: int = 2) -> dict[str, Any]:
    """(c) three iterations of 7 kernels (different collectives), ~35 ms between iterations."""
    rng = np.random.default_rng(seed)
    names = [ALLREDUCE, "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
             "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"]
    t, kernels, steps = 1.0, [], []
    for _ in range(3):
        start = t
        t += 0.035 * rng.lognormal(0, 0.05)
        for i in range(7):
            if i:
                t += 0.006 * rng.lognormal(0, 0.2)
            d = 0.0009 * rng.lognormal(0, 0.1)
            kernels.append((names[i % 3], t, d))
            t += d
        t += 0.004
        steps.append((start, t))
    return _kineto(kernels, steps)


SYNTH = {"nccl_a_many_allreduce": synth_a, "nccl_b_pipeline_sendrecv": synth_b, "nccl_b2_pipeline_groups": synth_b2,
         "nccl_c_three_iterations": synth_c}


def write_synthetic() -> None:
    """Write ``<name>.json.gz`` for every synthetic GPU timeline (mtime fixed: identical bytes per seed)."""
    for name, fn in SYNTH.items():
        raw = json.dumps(fn(), separators=(",", ":")).encode()
        with open(HERE / f"{name}.json.gz", "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as gz:
            gz.write(raw)
        print(f"wrote {name}")


def main() -> None:
    """Parse options and (re-)make the fixtures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic-only", action="store_true", help="only the seeded GPU timelines")
    ap.add_argument("--shape", action="append", choices=sorted(SHAPES), help="record only these jobs")
    args = ap.parse_args()
    write_synthetic()
    if not args.synthetic_only:
        record(args.shape or sorted(SHAPES))


if __name__ == "__main__":
    main()

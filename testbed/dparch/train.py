"""One process of a data-parallel scaling run: a worker, a parameter server, or the profiler.

Run by `testbed.dparch.run` inside a node's network namespace as
``python -m testbed.dparch.train CONFIG_JSON``. The config names the role and the rendezvous; the
process imports torch, joins the gloo process group, writes ``ready-<rank>`` into the run directory
and waits for ``go`` — by then the orchestrator has put it into its CPU cgroup, so start-up (torch
import, rendezvous) runs uncapped and only training is capped. Results go to ``result-<rank>.json``.

Architectures (all over torch.distributed with the gloo backend, whole-model messages, no overlap):

* ``ring``: every rank is a worker; after backward the flat gradient is all-reduced (gloo's ring
  algorithm), averaged and applied locally.
* ``ps-sync``: rank 0 is the server. Each step it sends the flat parameters to every worker at once,
  then receives every worker's flat gradient, sums them, applies the mean, and starts the next step.
* ``ps-async``: rank 0 is the server. It receives gradients from any worker, applies each at once and
  sends that worker the fresh parameters; workers never wait for each other.
* ``profile``: rank 0 trains alone (per-layer forward/backward timing), then measures the link with
  rank 1 (latency by small ping-pong, payload rate by model-sized transfers).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def build_model(width: int, depth: int, classes: int, seed: int) -> nn.ModuleList:
    """The trained MLP as a list of blocks (Linear + ReLU; the last is a plain Linear)."""
    torch.manual_seed(seed)
    blocks: list[nn.Module] = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)]
    blocks.append(nn.Linear(width, classes))
    return nn.ModuleList(blocks)


class Trainer:
    """Model, data and the local half of a step, with flat parameter/gradient buffers for messaging."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.model = build_model(cfg["width"], cfg["depth"], cfg["classes"], cfg["seed"])
        self.params = [p for p in self.model.parameters()]
        self.numel = sum(p.numel() for p in self.params)
        g = torch.Generator().manual_seed(cfg["seed"] + 1 + cfg["rank"])
        self.x = torch.randn(cfg["batch_size"], cfg["width"], generator=g)
        self.y = torch.randint(0, cfg["classes"], (cfg["batch_size"],), generator=g)
        self.lr = cfg["lr"]
        self.flat_grad = torch.zeros(self.numel)
        self.flat_param = torch.zeros(self.numel)
        self.last_loss = float("nan")

    def forward_backward(self, timing: bool = False) -> tuple[list[float], list[float]]:
        """One forward and backward pass; per-block times when `timing`."""
        for p in self.params:
            p.grad = None
        n = len(self.model)
        fwd = [0.0] * n
        bwd = [0.0] * n
        grad_t = [0.0] * n
        h = self.x
        for i, block in enumerate(self.model):
            t0 = time.perf_counter()
            h = block(h)
            fwd[i] = time.perf_counter() - t0
            if timing and i < n - 1:
                # When the gradient of block i's output exists, block i+1's backward has just finished.
                h.register_hook(lambda g, i=i: grad_t.__setitem__(i, time.perf_counter()))
        t0 = time.perf_counter()  # the loss is accounted to the last block's backward
        loss = nn.functional.cross_entropy(h, self.y)
        loss.backward()
        t_end = time.perf_counter()
        self.last_loss = float(loss.detach())
        if timing:
            for i in range(n - 1, -1, -1):
                start = t0 if i == n - 1 else grad_t[i]
                end = t_end if i == 0 else grad_t[i - 1]
                bwd[i] = max(0.0, end - start)
        return fwd, bwd

    def gather_grad(self) -> torch.Tensor:
        """The gradient as one flat tensor (the message a worker sends)."""
        torch.cat([p.grad.reshape(-1) for p in self.params], out=self.flat_grad)  # type: ignore[union-attr]
        return self.flat_grad

    def load_params(self, flat: torch.Tensor) -> None:
        """Copy a flat parameter message into the model."""
        off = 0
        with torch.no_grad():
            for p in self.params:
                k = p.numel()
                p.copy_(flat[off:off + k].view_as(p))
                off += k

    def apply_flat_grad(self, flat: torch.Tensor, scale: float) -> None:
        """SGD step with a flat (summed) gradient scaled by `scale`."""
        off = 0
        with torch.no_grad():
            for p in self.params:
                k = p.numel()
                p.add_(flat[off:off + k].view_as(p), alpha=-self.lr * scale)
                off += k

    def param_bytes(self) -> list[int]:
        """Parameter bytes per block."""
        return [sum(p.numel() * p.element_size() for p in b.parameters()) for b in self.model]


def _barrier_files(run_dir: Path, rank: int) -> None:
    (run_dir / f"ready-{rank}").write_text(str(os.getpid()))
    go = run_dir / "go"
    deadline = time.monotonic() + 600
    while not go.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("orchestrator never said go")
        time.sleep(0.01)


def run_ring(cfg: dict[str, Any], tr: Trainer) -> dict[str, Any]:
    """All-reduce data parallel; returns per-step end times (perf_counter) on this rank."""
    world = cfg["world_size"]
    ends: list[float] = []
    phases: list[tuple[float, float, float]] = []  # compute, all-reduce, update (diagnostics)
    for _ in range(cfg["warmup"] + cfg["steps"]):
        t0 = time.perf_counter()
        tr.forward_backward()
        flat = tr.gather_grad()
        t1 = time.perf_counter()
        if world > 1:
            dist.all_reduce(flat)
        t2 = time.perf_counter()
        tr.apply_flat_grad(flat, 1.0 / world)
        ends.append(time.perf_counter())
        phases.append((t1 - t0, t2 - t1, ends[-1] - t2))
    return {"step_end_s": ends, "phases_s": phases}


def _ps_worker(tr: Trainer, steps: int) -> dict[str, Any]:
    """A parameter-server worker: receive parameters, compute, send the gradient; phases for diagnostics."""
    phases: list[tuple[float, float, float]] = []  # waiting for parameters, compute, sending the gradient
    for _ in range(steps):
        t0 = time.perf_counter()
        dist.recv(tr.flat_param, src=0)
        t1 = time.perf_counter()
        tr.load_params(tr.flat_param)
        tr.forward_backward()
        flat = tr.gather_grad()
        t2 = time.perf_counter()
        dist.send(flat, dst=0)
        phases.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
    return {"phases_s": phases}


def run_ps_sync(cfg: dict[str, Any], tr: Trainer) -> dict[str, Any]:
    """Synchronous parameter server: rank 0 serves, ranks 1..K work."""
    world = cfg["world_size"]
    workers = list(range(1, world))
    steps = cfg["warmup"] + cfg["steps"]
    if cfg["rank"] == 0:
        params = torch.cat([p.detach().reshape(-1) for p in tr.params])
        bufs = {w: torch.zeros(tr.numel) for w in workers}
        total = torch.zeros(tr.numel)
        ends: list[float] = []
        for _ in range(steps):
            sends = [dist.isend(params, dst=w) for w in workers]
            recvs = [dist.irecv(bufs[w], src=w) for w in workers]
            for s in sends:
                s.wait()
            total.zero_()
            for w, r in zip(workers, recvs, strict=True):
                r.wait()
                total.add_(bufs[w])
            params.add_(total, alpha=-tr.lr / len(workers))
            ends.append(time.perf_counter())
        return {"step_end_s": ends}
    return _ps_worker(tr, steps)


def run_ps_async(cfg: dict[str, Any], tr: Trainer) -> dict[str, Any]:
    """Asynchronous parameter server: gradients applied as they come, fresh parameters sent back."""
    world = cfg["world_size"]
    workers = list(range(1, world))
    steps = cfg["warmup"] + cfg["steps"]
    if cfg["rank"] == 0:
        params = torch.cat([p.detach().reshape(-1) for p in tr.params])
        pending = {w: dist.isend(params.clone(), dst=w) for w in workers}
        done = dict.fromkeys(workers, 0)
        buf = torch.zeros(tr.numel)
        updates: list[tuple[int, float]] = []
        for _ in range(steps * len(workers)):
            src = dist.recv(buf)
            params.add_(buf, alpha=-tr.lr)
            done[src] += 1
            updates.append((src, time.perf_counter()))
            pending[src].wait()
            if done[src] < steps:
                pending[src] = dist.isend(params.clone(), dst=src)
        return {"updates": updates}
    return _ps_worker(tr, steps)


def run_profile(cfg: dict[str, Any], tr: Trainer) -> dict[str, Any]:
    """Rank 0: per-layer single-worker profile, then link calibration against rank 1."""
    out: dict[str, Any] = {}
    if cfg["rank"] == 0:
        fwds: list[list[float]] = []
        bwds: list[list[float]] = []
        upd: list[float] = []
        acc: list[float] = []
        other = torch.zeros(tr.numel)
        for i in range(cfg["warmup"] + cfg["steps"]):
            f, b = tr.forward_backward(timing=True)
            t0 = time.perf_counter()
            flat = tr.gather_grad()
            tr.apply_flat_grad(flat, 1.0)
            t1 = time.perf_counter()
            other.add_(flat)
            t2 = time.perf_counter()
            if i >= cfg["warmup"]:
                fwds.append(f)
                bwds.append(b)
                upd.append(t1 - t0)
                acc.append(t2 - t1)
        out.update(forward_s=fwds, backward_s=bwds, update_s=upd, accumulate_s=acc, param_bytes=tr.param_bytes(),
                   names=[type(b).__name__ if not isinstance(b, nn.Sequential) else "Linear+ReLU" for b in tr.model])
    dist.barrier()
    # Link calibration: ping-pong a 1-float request against replies of several sizes, so that the
    # profile can fit t(s) = α + s/B (latency and payload rate) over the message sizes the runs use.
    small = torch.zeros(1)
    sizes = [1] + [max(1, tr.numel // d) for d in (16, 8, 4, 2, 1)]
    bufs = {n: torch.zeros(n) for n in sizes}
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for rnd in range(cfg["calib_rounds"] + 2):
        for n in sizes:
            if cfg["rank"] == 0:
                t0 = time.perf_counter()
                dist.send(small, dst=1)
                dist.recv(bufs[n], src=1)
                if rnd >= 2:
                    times[n].append(time.perf_counter() - t0)
            else:
                dist.recv(small, src=0)
                dist.send(bufs[n], dst=0)
            time.sleep(0.02)  # idle between messages, as the compute phase of a step is
    # The same for gloo's ring all-reduce between the two ranks (t(s) = 2(s/(2B) + α) at K = 2).
    ar_sizes = [max(1, tr.numel // d) for d in (8, 4, 2, 1)]
    ar_times: dict[int, list[float]] = {n: [] for n in ar_sizes}
    for rnd in range(cfg["calib_rounds"] + 2):
        for n in ar_sizes:
            dist.barrier()
            time.sleep(0.02)
            t0 = time.perf_counter()
            dist.all_reduce(bufs[n])
            if rnd >= 2:
                ar_times[n].append(time.perf_counter() - t0)
    if cfg["rank"] == 0:
        out["calibration"] = {str(n * 4): v for n, v in times.items()}
        out["allreduce_calibration"] = {str(n * 4): v for n, v in ar_times.items()}
    return out


def main(argv: list[str]) -> int:
    cfg: dict[str, Any] = json.loads(argv[0])
    torch.set_num_threads(1)
    run_dir = Path(cfg["run_dir"])
    rank = cfg["rank"]
    dist.init_process_group("gloo", init_method=cfg["init_method"], rank=rank, world_size=cfg["world_size"],
                            timeout=datetime.timedelta(seconds=300))
    tr = Trainer(cfg)
    # One untimed exchange so gloo's lazy connections are up before the clock starts.
    dist.barrier()
    _barrier_files(run_dir, rank)
    t_start = time.perf_counter()
    arch = cfg["arch"]
    fn = {"ring": run_ring, "ps-sync": run_ps_sync, "ps-async": run_ps_async, "profile": run_profile}[arch]
    res = fn(cfg, tr)
    res["t_start"] = t_start
    res["rank"] = rank
    res["loss"] = tr.last_loss
    dist.barrier()
    dist.destroy_process_group()
    (run_dir / f"result-{rank}.json").write_text(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


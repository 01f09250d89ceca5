"""One process of a data-parallel scaling sweep: worker, parameter server or profiler, job after job.

Run by `testbed.dparch.run.run_pool` inside a node's network namespace as
``python -m testbed.dparch.train CONFIG_JSON``. The process imports torch, joins the gloo world,
writes ``ready-<rank>`` into the run directory and waits for ``go`` — by then the orchestrator has put
it into its CPU cgroup, so start-up (torch import, rendezvous) runs uncapped and only training is
capped. It then works through the config's schedule: each job is a gloo subgroup of the first ranks
(for a parameter server the first member serves); ranks outside it wait at a world barrier. Results
of all jobs go to ``result-<rank>.json``.

Architectures (all over torch.distributed with the gloo backend, whole-model messages, no overlap):

* ``ring``: every rank is a worker; after backward the flat gradient is all-reduced (gloo's ring
  algorithm), averaged and applied locally.
* ``ps-sync``: the first member is the server. Each step it sends the flat parameters to every worker at once,
  then receives every worker's flat gradient, sums them, applies the mean, and starts the next step.
* ``ps-async``: the first member is the server. It receives gradients from any worker, applies each at once and
  sends that worker the fresh parameters; workers never wait for each other.
* ``profile``: the first member trains alone (per-layer forward/backward timing), then measures the
  link with the second: ping-pong with replies of several sizes, and all-reduces of several sizes.
* ``profile-lite``: the training part of ``profile`` only, taken next to every run (machine state).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
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


@dataclass
class Ctx:
    """Where one scheduled run happens: the members (global ranks, server first) and their group."""

    rank: int
    members: list[int]
    group: Any
    steps: int
    warmup: int
    calib_rounds: int
    calibrate: bool = True

    @property
    def total(self) -> int:
        return self.warmup + self.steps


def run_ring(c: Ctx, tr: Trainer) -> dict[str, Any]:
    """All-reduce data parallel; returns per-step end times (perf_counter) on this rank."""
    world = len(c.members)
    ends: list[float] = []
    phases: list[tuple[float, float, float]] = []  # compute, all-reduce, update (diagnostics)
    cpu: list[float] = []  # CPU time of the compute phase: separates slower work from a late quota
    pcpu: list[float] = []  # the same for the whole process (gloo's threads share the quota)
    for _ in range(c.total):
        t0 = time.perf_counter()
        c0 = time.thread_time()
        p0 = time.process_time()
        tr.forward_backward()
        flat = tr.gather_grad()
        cpu.append(time.thread_time() - c0)
        pcpu.append(time.process_time() - p0)
        t1 = time.perf_counter()
        if world > 1:
            dist.all_reduce(flat, group=c.group)
        t2 = time.perf_counter()
        tr.apply_flat_grad(flat, 1.0 / world)
        ends.append(time.perf_counter())
        phases.append((t1 - t0, t2 - t1, ends[-1] - t2))
    return {"step_end_s": ends, "phases_s": phases, "compute_cpu_s": cpu, "compute_proc_cpu_s": pcpu}


def _ps_worker(c: Ctx, tr: Trainer) -> dict[str, Any]:
    """A parameter-server worker: receive parameters, compute, send the gradient; phases for diagnostics."""
    server = c.members[0]
    phases: list[tuple[float, float, float]] = []  # waiting for parameters, compute, sending the gradient
    for _ in range(c.total):
        t0 = time.perf_counter()
        dist.recv(tr.flat_param, src=server, group=c.group)
        t1 = time.perf_counter()
        tr.load_params(tr.flat_param)
        tr.forward_backward()
        flat = tr.gather_grad()
        t2 = time.perf_counter()
        dist.send(flat, dst=server, group=c.group)
        phases.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
    return {"phases_s": phases}


def run_ps_sync(c: Ctx, tr: Trainer) -> dict[str, Any]:
    """Synchronous parameter server: the first member serves, the others work."""
    if c.rank != c.members[0]:
        return _ps_worker(c, tr)
    workers = c.members[1:]
    params = torch.cat([p.detach().reshape(-1) for p in tr.params])
    bufs = {w: torch.zeros(tr.numel) for w in workers}
    total = torch.zeros(tr.numel)
    ends: list[float] = []
    for _ in range(c.total):
        sends = [dist.isend(params, dst=w, group=c.group) for w in workers]
        recvs = [dist.irecv(bufs[w], src=w, group=c.group) for w in workers]
        for s in sends:
            s.wait()
        total.zero_()
        for w, r in zip(workers, recvs, strict=True):
            r.wait()
            total.add_(bufs[w])
        params.add_(total, alpha=-tr.lr / len(workers))
        ends.append(time.perf_counter())
    return {"step_end_s": ends}


def run_ps_async(c: Ctx, tr: Trainer) -> dict[str, Any]:
    """Asynchronous parameter server: gradients applied as they come, fresh parameters sent back."""
    if c.rank != c.members[0]:
        return _ps_worker(c, tr)
    workers = c.members[1:]
    params = torch.cat([p.detach().reshape(-1) for p in tr.params])
    pending = {w: dist.isend(params.clone(), dst=w, group=c.group) for w in workers}
    done = dict.fromkeys(workers, 0)
    buf = torch.zeros(tr.numel)
    updates: list[tuple[int, float]] = []
    for _ in range(c.total * len(workers)):
        src = dist.recv(buf, group=c.group)
        if src not in done:  # a group rank rather than a global one
            src = dist.get_global_rank(c.group, src)
        params.add_(buf, alpha=-tr.lr)
        done[src] += 1
        updates.append((workers.index(src) + 1, time.perf_counter()))
        pending[src].wait()
        if done[src] < c.total:
            pending[src] = dist.isend(params.clone(), dst=src, group=c.group)
    return {"updates": updates}


def _ring_step(tr: Trainer, c: Ctx) -> tuple[list[float], list[float], float]:
    """One step of a 2-member ring job as the runs execute it: compute, all-reduce the gradient with the
    other member, apply the mean. Returns the per-layer forward and backward times and the step's wall
    time less the collective (compute phase + update)."""
    w0 = time.perf_counter()
    f, b = tr.forward_backward(timing=True)
    flat = tr.gather_grad()
    w1 = time.perf_counter()
    dist.all_reduce(flat, group=c.group)
    w2 = time.perf_counter()
    tr.apply_flat_grad(flat, 0.5)
    return f, b, (w1 - w0) + (time.perf_counter() - w2)


def run_profile(c: Ctx, tr: Trainer) -> dict[str, Any]:
    """First member: per-layer single-worker profile, then link calibration against the second."""
    out: dict[str, Any] = {}
    me, peer = c.members[0], c.members[1]
    if c.rank == me:
        fwds: list[list[float]] = []
        bwds: list[list[float]] = []
        upd: list[float] = []
        acc: list[float] = []
        other = torch.zeros(tr.numel)
        cpu: list[float] = []
        # Whole step (forward, backward, flattening, update), wall clock: under the CPU quota a throttle
        # stall lands wherever the tick finds the process, also between the timed layers and in the
        # update whose *median* time leaves it out, so the per-layer sums alone miss ~15 % of a step.
        walls: list[float] = []
        for i in range(c.total):
            w0 = time.perf_counter()
            c0 = time.thread_time()
            f, b = tr.forward_backward(timing=True)
            c1 = time.thread_time() - c0
            t0 = time.perf_counter()
            flat = tr.gather_grad()
            tr.apply_flat_grad(flat, 1.0)
            t1 = time.perf_counter()
            other.add_(flat)
            t2 = time.perf_counter()
            if i >= c.warmup:
                fwds.append(f)
                bwds.append(b)
                upd.append(t1 - t0)
                acc.append(t2 - t1)
                cpu.append(c1)
                walls.append(t1 - w0)
        # The same steps after 30 ms of idle each (3 CFS periods), as every step of a distributed run
        # starts after waiting for the network: the quota is full then, so such a step is faster than
        # one of a back-to-back sequence (steady throttling), by ~10 % at our cap (docs/predict.md).
        idle_f: list[list[float]] = []
        idle_b: list[list[float]] = []
        idle_w: list[float] = []
        for i in range(c.total):
            time.sleep(0.03)
            w0 = time.perf_counter()
            f, b = tr.forward_backward(timing=True)
            flat = tr.gather_grad()
            tr.apply_flat_grad(flat, 1.0)
            if i >= c.warmup:
                idle_f.append(f)
                idle_b.append(b)
                idle_w.append(time.perf_counter() - w0)
        # Steps as a parameter-server worker runs them: wait for the whole model from the peer, load
        # it, compute, flatten the gradient (timed: the worker's compute phase), send it back. The
        # receive runs gloo's threads and copies under the same CPU quota, which a sleep does not.
        net_f: list[list[float]] = []
        net_b: list[list[float]] = []
        net_w: list[float] = []
        for i in range(c.total):
            dist.recv(tr.flat_param, src=peer, group=c.group)
            w0 = time.perf_counter()
            tr.load_params(tr.flat_param)
            f, b = tr.forward_backward(timing=True)
            flat = tr.gather_grad()
            w1 = time.perf_counter()
            dist.send(flat, dst=peer, group=c.group)
            if i >= c.warmup:
                net_f.append(f)
                net_b.append(b)
                net_w.append(w1 - w0)
        # Steps as a ring worker runs them at K = 2: compute, all-reduce the gradient with the peer,
        # apply it. The all-reduce's sends, receives and reductions share the CPU quota with the next
        # step's compute; timed are the compute phase and the update (the step less the collective).
        ar_f: list[list[float]] = []
        ar_b: list[list[float]] = []
        ar_w: list[float] = []
        for i in range(c.total):
            f, b, wall = _ring_step(tr, c)
            if i >= c.warmup:
                ar_f.append(f)
                ar_b.append(b)
                ar_w.append(wall)
        out.update(idle_forward_s=idle_f, idle_backward_s=idle_b, idle_step_wall_s=idle_w,
                   net_forward_s=net_f, net_backward_s=net_b, net_step_wall_s=net_w,
                   ring_forward_s=ar_f, ring_backward_s=ar_b, ring_step_wall_s=ar_w)
        out.update(step_wall_s=walls, compute_cpu_s=cpu, forward_s=fwds, backward_s=bwds, update_s=upd,
                   accumulate_s=acc, param_bytes=tr.param_bytes(),
                   names=[type(b).__name__ if not isinstance(b, nn.Sequential) else "Linear+ReLU" for b in tr.model])
    elif c.rank == peer:
        # The server side of the parameter-server steps above.
        params = torch.cat([p.detach().reshape(-1) for p in tr.params])
        grad = torch.zeros(tr.numel)
        for _ in range(c.total):
            dist.send(params, dst=me, group=c.group)
            dist.recv(grad, src=me, group=c.group)
        # The other ring member: it runs the same step (timed the same way, the collective left out),
        # so that the collective starts as in a real step and the two members' step times can be
        # paired: how much of their step-to-step jitter is shared is what the max over K must know.
        peer_w: list[float] = []
        for i in range(c.total):
            wall = _ring_step(tr, c)[2]
            if i >= c.warmup:
                peer_w.append(wall)
        out["ring_peer_step_wall_s"] = peer_w
    dist.barrier(group=c.group)
    if not c.calibrate:
        return out
    # Link calibration: ping-pong a 1-float request against replies of several sizes, so that the
    # profile can fit t(s) = α + s/B (latency and payload rate) over the message sizes the runs use.
    small = torch.zeros(1)
    sizes = [1] + [max(1, tr.numel // d) for d in (16, 8, 4, 2, 1)]
    bufs = {n: torch.zeros(n) for n in sizes}
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for rnd in range(c.calib_rounds + 2):
        for n in sizes:
            if c.rank == me:
                t0 = time.perf_counter()
                dist.send(small, dst=peer, group=c.group)
                dist.recv(bufs[n], src=peer, group=c.group)
                if rnd >= 2:
                    times[n].append(time.perf_counter() - t0)
            else:
                dist.recv(small, src=me, group=c.group)
                dist.send(bufs[n], dst=me, group=c.group)
            time.sleep(0.02)  # idle between messages, as the compute phase of a step is
    # The same for gloo's ring all-reduce between the two ranks (t(s) = 2(s/(2B) + α) at K = 2).
    ar_sizes = [max(1, tr.numel // d) for d in (8, 4, 2, 1)]
    ar_times: dict[int, list[float]] = {n: [] for n in ar_sizes}
    for rnd in range(c.calib_rounds + 2):
        for n in ar_sizes:
            dist.barrier(group=c.group)
            time.sleep(0.02)
            t0 = time.perf_counter()
            dist.all_reduce(bufs[n], group=c.group)
            if rnd >= 2:
                ar_times[n].append(time.perf_counter() - t0)
    if c.rank == me:
        out["calibration"] = {str(n * 4): v for n, v in times.items()}
        out["allreduce_calibration"] = {str(n * 4): v for n, v in ar_times.items()}
    return out


# Rounds of the net-ring microbenchmark with compute-staggered entries (their spread needs more than 8).
STAGGER_ROUNDS = 16


def run_net_ring(c: Ctx, tr: Trainer) -> dict[str, Any]:
    """Network microbenchmark: all-reduces of a whole-model buffer among the members, no compute.

    Each round starts after a barrier and 20 ms of idle (as after a compute phase); every member
    records its own all-reduce time. Characterises gloo's ring on the shaped links at this K without
    any training, so the ring model can be checked against the collective alone.
    """
    buf = torch.zeros(tr.numel)
    times: list[float] = []
    starts: list[float] = []
    ends: list[float] = []
    for rnd in range(c.total):
        dist.barrier(group=c.group)
        time.sleep(0.02)
        t0 = time.perf_counter()
        dist.all_reduce(buf, group=c.group)
        t1 = time.perf_counter()
        if rnd >= c.warmup:
            times.append(t1 - t0)
            starts.append(t0)  # one clock for all processes: the entry skew can be taken out
            ends.append(t1)
    # The same collective with the entries staggered as in a training step: each
    # member first computes one real step (forward, backward, flattening; no update), so the members
    # enter with their own compute jitter and the last one with its quota spent, as in a ring job. The
    # collective after the last entry is then what a job's step pays on top of its slowest worker.
    stag_starts: list[float] = []
    stag_ends: list[float] = []
    for rnd in range(c.warmup + STAGGER_ROUNDS):
        dist.barrier(group=c.group)
        time.sleep(0.02)
        tr.forward_backward()
        flat = tr.gather_grad()
        t0 = time.perf_counter()
        dist.all_reduce(flat, group=c.group)
        t1 = time.perf_counter()
        if rnd >= c.warmup:
            stag_starts.append(t0)
            stag_ends.append(t1)
    return {"allreduce_s": times, "start": starts, "end": ends, "stagger_start": stag_starts,
            "stagger_end": stag_ends}


def run_net_ps(c: Ctx, tr: Trainer) -> dict[str, Any]:
    """Network microbenchmark of a parameter server's link: fan-out and fan-in of whole models, no compute.

    Fan-out: the first member sends the flat parameters to every other member at once; each receiver
    records when its copy is complete (``perf_counter`` is one clock for all processes on the host).
    Fan-in: every other member sends a flat gradient at once and the first member notes when each
    arrives (polling the pending receives). The completion times show how real TCP flows share the
    server's shaped link: in what order and how unevenly they finish, compared with processor sharing
    (all end together at K·M/B) and FCFS (one every M/B).
    """
    server, workers = c.members[0], c.members[1:]
    buf = torch.zeros(tr.numel)
    bufs = {w: torch.zeros(tr.numel) for w in workers} if c.rank == server else {}
    out: dict[str, list[Any]] = {"fanout_start": [], "fanout_done": [], "fanin_start": [], "fanin_done": []}
    for rnd in range(c.total):
        keep = rnd >= c.warmup
        dist.barrier(group=c.group)
        time.sleep(0.02)
        if c.rank == server:
            t0 = time.perf_counter()
            for s in [dist.isend(buf, dst=w, group=c.group) for w in workers]:
                s.wait()
            if keep:
                out["fanout_start"].append(t0)
        else:
            dist.recv(buf, src=server, group=c.group)
            if keep:
                out["fanout_done"].append(time.perf_counter())
        dist.barrier(group=c.group)
        time.sleep(0.02)
        if c.rank == server:
            # One blocking receive per worker in its own thread: a gloo receive's completion is only
            # observed by waiting on it, and waiting on them in a fixed order would hide the order.
            done: dict[int, float] = {}

            def take(w: int, done: dict[int, float] = done) -> None:
                dist.recv(bufs[w], src=w, group=c.group)
                done[w] = time.perf_counter()

            t0 = time.perf_counter()
            threads = [threading.Thread(target=take, args=(w,)) for w in workers]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            if keep:
                out["fanin_start"].append(t0)
                out["fanin_done"].append([done[w] for w in workers])
        else:
            t0 = time.perf_counter()
            dist.send(buf, dst=server, group=c.group)
            if keep:
                out["fanin_start"].append(t0)
    return out


RUNNERS = {"ring": run_ring, "ps-sync": run_ps_sync, "ps-async": run_ps_async, "profile": run_profile,
           "profile-lite": run_profile,
           "net-ring": run_net_ring, "net-ps": run_net_ps}


def main(argv: list[str]) -> int:
    cfg: dict[str, Any] = json.loads(argv[0])
    torch.set_num_threads(1)
    run_dir = Path(cfg["run_dir"])
    rank = cfg["rank"]
    dist.init_process_group("gloo", init_method=cfg["init_method"], rank=rank, world_size=cfg["world_size"],
                            timeout=datetime.timedelta(seconds=600))
    tr = Trainer(cfg)
    dist.barrier()
    _barrier_files(run_dir, rank)
    results: list[dict[str, Any] | None] = []
    for item in cfg["schedule"]:
        members = list(item["members"])
        # Every rank takes part in creating every group (a collective), members or not.
        group = dist.new_group(ranks=members) if len(members) < cfg["world_size"] else dist.group.WORLD
        res: dict[str, Any] | None = None
        if rank in members:
            dist.barrier(group=group)  # connections up before the clock starts
            c = Ctx(rank=rank, members=members, group=group, steps=item["steps"], warmup=item["warmup"],
                    calib_rounds=cfg["calib_rounds"], calibrate=item["arch"] != "profile-lite")
            t_start = time.perf_counter()
            res = RUNNERS[item["arch"]](c, tr)
            res["t_start"] = t_start
            res["loss"] = tr.last_loss
        results.append(res)
        dist.barrier()
    (run_dir / f"result-{rank}.json").write_text(json.dumps({"results": results}))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

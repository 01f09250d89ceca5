"""Fine-grained discrete-event simulation of data-parallel SGD steps, operation by operation.

Where the coarse models see a step as a few phases, this simulates each layer's operations — download
of its parameters, forward, backward, upload of its gradient, the server's update — as a DAG, on
resources with their own schedulers:

* each worker's processor: FIFO, one operation at a time (forward l needs forward l−1 and, for a
  parameter server, the parameters of layer l; backward l needs backward l+1);
* the server's links (downlink and uplink): ``fcfs`` (one message at a time at full rate) or ``ps``
  (processor sharing: active flows split the rate, each capped at ``flow_cap`` — the worker's own
  link), plus a fixed per-message latency;
* the ring for all-reduce: a collective per gradient bucket that starts when every worker has the
  bucket and takes 2(K−1)(bytes/(K·B) + α); buckets go round the ring one at a time in order;
* the server's processor: FIFO (accumulate a gradient, apply the update).

Steps are synchronous (ring all-reduce; PS Sync-SGD: the server waits for all K gradients) or
asynchronous (PS Async-SGD: the server applies each gradient as it comes and sends that worker fresh
parameters). Every worker-step draws one profiled step (per-layer forward/backward times) at random
with a seeded generator, so variance — and the max over K workers at a barrier — is carried through.
Each worker sends its messages in layer order over one connection (one in flight per worker).

The event loop and the resources (processors, links, the ring) are in `engine`; this module wires
them into each worker's step DAG for the three architectures and measures the throughput (`simulate`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from failslow.errors import InputError
from failslow.predict.engine import (
    FcfsLink,
    Fifo,
    FloatArray,
    PsLink,
    Ring,
    Sim,
    TcpLink,
    fan_completion,
    fit_sharing_sigma,
    weighted_share,
)
from failslow.predict.profile import Profile

# fan_completion, fit_sharing_sigma and weighted_share live in `engine`; importers know them from here.
__all__ = [
    "Arch",
    "Sharing",
    "SimResult",
    "fan_completion",
    "fit_sharing_sigma",
    "simulate",
    "weighted_share",
]

Sharing = Literal["fcfs", "ps", "tcp"]
Arch = Literal["ring", "ps-sync", "ps-async"]


@dataclass(frozen=True)
class SimResult:
    """What a simulation run measured."""

    samples_per_s: float
    steps_per_s: float  # worker-steps per second, all workers together
    sim_time_s: float
    events: int
    step_end_s: FloatArray  # (workers, steps): when each worker finished each step


class _Worker:
    __slots__ = ("arrived", "bwd", "computing", "cpu", "fwd", "fwd_next", "grads_out", "index", "reduced",
                 "send_q", "sending", "step", "up_done")

    def __init__(self, index: int, cpu: Fifo) -> None:
        self.index = index
        self.cpu = cpu
        self.step = -1
        self.fwd: FloatArray = np.zeros(0)
        self.bwd: FloatArray = np.zeros(0)
        self.arrived = 0
        self.fwd_next = 0
        self.computing = False
        self.send_q: deque[float] = deque()
        self.sending = False
        self.up_done = 0
        self.reduced = 0
        self.grads_out = 0


class _Job:
    """Wires workers, links, ring and server together and runs the step DAG."""

    def __init__(self, p: Profile, k: int, arch: Arch, *, steps: int, sharing: Sharing, overlap: bool,
                 flow_cap: float | None, slowdown: FloatArray, rng: np.random.Generator) -> None:
        self.p = p
        self.k = k
        self.arch = arch
        self.steps = steps
        self.overlap = overlap
        self.sim = Sim()
        bw = p.effective_bandwidth
        cap = bw if flow_cap is None else flow_cap
        if sharing == "tcp":
            # Own generator for the flow weights, so the compute draws below stay those of the seed.
            link_rng = np.random.default_rng(rng.bit_generator.seed_seq.spawn(1)[0])  # type: ignore[attr-defined]
            self.down: PsLink | FcfsLink = TcpLink(self.sim, bw, cap, p.latency_s, p.share_sigma_down or 0.0,
                                                   link_rng)
            self.up: PsLink | FcfsLink = TcpLink(self.sim, bw, cap, p.latency_s, p.share_sigma_up or 0.0, link_rng)
        else:
            link_cls = PsLink if sharing == "ps" else FcfsLink
            self.down = link_cls(self.sim, bw, cap, p.latency_s)
            self.up = link_cls(self.sim, bw, cap, p.latency_s)
        self.ring = Ring(self.sim, k, min(p.ring_bandwidth, cap), p.ring_hop_latency)
        self.server = Fifo(self.sim)
        self.workers = [_Worker(i, Fifo(self.sim)) for i in range(k)]
        self.slowdown = slowdown
        sf, sb = p.step_samples()
        self.sf, self.sb = sf, sb
        # One draw per worker-step, made up front so results depend only on the seed.
        self.draws = rng.integers(0, sf.shape[0], size=(k, steps))
        # Ring steps are in lock step: the jitter share all workers have in common (same host, same
        # moment) is one draw per step, the rest one per worker-step, as in `coarse.expected_max`.
        self.shared = float(p.shared_jitter) if arch == "ring" else 0.0
        if self.shared > 0.0:
            self.shared_draws = rng.integers(0, sf.shape[0], size=steps)
            self.mu_f, self.mu_b = sf.mean(axis=0), sb.mean(axis=0)
            self.w_shared, self.w_own = np.sqrt(self.shared), np.sqrt(1.0 - self.shared)
        self.nl = p.n_layers
        self.msg_bytes: list[float] = (p.param_bytes.tolist() if overlap else [p.model_bytes])
        self.ends = np.full((k, steps), np.nan)
        self.sync_uploads = 0

    # --- step lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        for w in self.workers:
            self._begin_step(w)
        if self.arch != "ring":
            for w in self.workers:
                self._download(w)

    def _begin_step(self, w: _Worker) -> None:
        w.step += 1
        d = self.draws[w.index, w.step]
        s = self.slowdown[w.index]
        if self.shared > 0.0:
            c = self.shared_draws[w.step]
            fwd = self.mu_f + self.w_shared * (self.sf[c] - self.mu_f) + self.w_own * (self.sf[d] - self.mu_f)
            bwd = self.mu_b + self.w_shared * (self.sb[c] - self.mu_b) + self.w_own * (self.sb[d] - self.mu_b)
            # √ρ + √(1−ρ) ≥ 1: two short draws can reach below zero in a short layer.
            w.fwd = np.maximum(fwd, 0.0) * s
            w.bwd = np.maximum(bwd, 0.0) * s
        else:
            w.fwd = self.sf[d] * s
            w.bwd = self.sb[d] * s
        if self.arch != "ring":
            # Packing the gradient / unpacking parameters, after the last backward (as in `coarse`).
            w.bwd = w.bwd.copy()
            w.bwd[0] += self.p.update_s * s
        w.fwd_next = 0
        w.computing = False
        w.up_done = 0
        w.reduced = 0
        w.grads_out = 0
        # Ring workers hold the parameters already; PS workers wait for them.
        w.arrived = self.nl if self.arch == "ring" else 0
        if self.arch == "ring":
            self._try_forward(w)

    def _download(self, w: _Worker) -> None:
        self._download_msg((w, 0))

    def _download_msg(self, x: tuple[_Worker, int]) -> None:
        w, i = x
        self.down.send(self.msg_bytes[i], self._downloaded, (w, i))

    def _downloaded(self, x: tuple[_Worker, int]) -> None:
        w, i = x
        w.arrived = self.nl if not self.overlap else i + 1
        if i + 1 < len(self.msg_bytes):
            self._download_msg((w, i + 1))
        self._try_forward(w)

    def _try_forward(self, w: _Worker) -> None:
        if w.computing or w.fwd_next >= self.nl or w.fwd_next >= w.arrived:
            return
        w.computing = True
        w.cpu.submit(float(w.fwd[w.fwd_next]), self._forwarded, w)

    def _forwarded(self, w: _Worker) -> None:
        w.computing = False
        w.fwd_next += 1
        if w.fwd_next < self.nl:
            self._try_forward(w)
        else:
            w.computing = True
            w.cpu.submit(float(w.bwd[self.nl - 1]), self._backwarded, (w, self.nl - 1))

    def _backwarded(self, x: tuple[_Worker, int]) -> None:
        w, layer = x
        if self.overlap:
            self._gradient_ready(w, layer, float(self.p.param_bytes[layer]))
        elif layer == 0:
            self._gradient_ready(w, -1, self.p.model_bytes)
        if layer > 0:
            w.cpu.submit(float(w.bwd[layer - 1]), self._backwarded, (w, layer - 1))
        else:
            w.computing = False

    def _gradient_ready(self, w: _Worker, layer: int, nbytes: float) -> None:
        w.grads_out += 1
        if self.arch == "ring":
            self.ring.submit((w.step, layer), nbytes, self._reduced, w)
            return
        w.send_q.append(nbytes)
        if not w.sending:
            self._upload_next(w)

    def _upload_next(self, w: _Worker) -> None:
        w.sending = True
        self.up.send(w.send_q.popleft(), self._uploaded, w)

    def _uploaded(self, w: _Worker) -> None:
        w.up_done += 1
        if w.send_q:
            self._upload_next(w)
        else:
            w.sending = False
        if w.up_done < len(self.msg_bytes):
            return
        if self.arch == "ps-async":
            self.server.submit(2 * self.p.accumulate_s, self._applied_async, w)
        else:
            self.server.submit(self.p.accumulate_s, self._accumulated_sync, w)

    # --- ring --------------------------------------------------------------------------------------
    def _reduced(self, w: _Worker) -> None:
        w.reduced += 1
        if w.reduced == len(self.msg_bytes):
            w.cpu.submit(self.p.update_s * float(self.slowdown[w.index]), self._step_done_ring, w)

    def _step_done_ring(self, w: _Worker) -> None:
        self.ends[w.index, w.step] = self.sim.now
        if w.step + 1 < self.steps:
            self._begin_step(w)

    # --- parameter server ----------------------------------------------------------------------------
    def _accumulated_sync(self, w: _Worker) -> None:
        self.sync_uploads += 1
        if self.sync_uploads == self.k:
            self.sync_uploads = 0
            self.server.submit(self.p.accumulate_s, self._updated_sync, None)

    def _updated_sync(self, _: Any) -> None:
        for w in self.workers:
            self.ends[w.index, w.step] = self.sim.now
        if self.workers[0].step + 1 < self.steps:
            for w in self.workers:
                self._begin_step(w)
            for w in self.workers:
                self._download(w)

    def _applied_async(self, w: _Worker) -> None:
        self.ends[w.index, w.step] = self.sim.now
        if w.step + 1 < self.steps:
            self._begin_step(w)
            self._download(w)


def simulate(p: Profile, k: int, arch: Arch, *, steps: int = 100, warmup: int = 5, sharing: Sharing = "ps",
             overlap: bool | None = None, flow_cap: float | None = None,
             slowdown: Sequence[float] | None = None, seed: int = 0) -> SimResult:
    """Simulate K workers for `steps` steps each and measure throughput after `warmup` steps.

    Args:
        p: single-worker profile (per-step per-layer samples are drawn when present).
        k: number of workers.
        arch: ``ring`` (synchronous all-reduce), ``ps-sync`` or ``ps-async``.
        steps: steps per worker.
        warmup: steps per worker left out of the measurement (start-up transient).
        sharing: how the server's links share their rate among flows: ``ps``, ``fcfs`` or ``tcp``
            (weighted sharing with random per-transfer weights, σ from the profile's link.sharing;
            plain ``ps`` when the profile has none).
        overlap: per-layer messages overlapping compute (default: the profile's flag).
        flow_cap: the most one flow can get, bytes/s (default: the link rate, i.e. the worker's own link).
        slowdown: per-worker compute slowdown factors (heterogeneous workers).
        seed: seed of the step sampler.

    Raises:
        InputError: on inconsistent arguments.
    """
    if arch not in ("ring", "ps-sync", "ps-async"):
        raise InputError(f"unknown architecture {arch!r}; use ring, ps-sync or ps-async")
    if sharing not in ("ps", "fcfs", "tcp"):
        raise InputError(f"link sharing must be ps, fcfs or tcp, got {sharing!r}")
    if k < 1:
        raise InputError(f"number of workers must be >= 1, got {k}")
    if steps < 2 or not 0 <= warmup < steps - 1:
        raise InputError(f"need steps >= 2 and 0 <= warmup < steps - 1, got steps={steps}, warmup={warmup}")
    if flow_cap is not None and not flow_cap > 0:
        raise InputError(f"flow cap must be positive, got {flow_cap}")
    f = np.ones(k) if slowdown is None else np.asarray(slowdown, dtype=np.float64)
    if f.shape != (k,) or not np.all(np.isfinite(f)) or np.any(f <= 0):
        raise InputError(f"need {k} positive finite slowdown factors")
    job = _Job(p, k, arch, steps=steps, sharing=sharing, overlap=p.overlap if overlap is None else overlap,
               flow_cap=flow_cap, slowdown=f, rng=np.random.default_rng(seed))
    job.start()
    job.sim.run()
    ends = job.ends
    if np.isnan(ends).any():
        raise RuntimeError("simulation ended with unfinished steps (a dependency was never met)")
    if arch == "ps-async":
        # Window: from when every worker finished its warm-up to when the first worker runs out of
        # steps, so the measured mix always has all K workers active.
        t0 = float(ends[:, warmup].max()) if warmup > 0 else 0.0
        t1 = float(ends[:, -1].min())
        count = int(np.count_nonzero((ends > t0) & (ends <= t1)))
        if t1 <= t0 or count == 0:
            t0, t1, count = 0.0, float(ends.max()), ends.size
    else:
        per_step = ends.max(axis=0)
        t0 = float(per_step[warmup - 1]) if warmup > 0 else 0.0
        t1 = float(per_step[-1])
        count = (steps - warmup) * k
    rate = count / (t1 - t0)
    return SimResult(samples_per_s=rate * p.batch_size, steps_per_s=rate, sim_time_s=float(ends.max()),
                     events=job.sim.events, step_end_s=ends)

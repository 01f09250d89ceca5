"""The engine of the discrete-event simulation (`des`): the event loop and the resources it schedules.

* `Sim`: a heap of timed callbacks;
* `Fifo`: a processor serving one operation at a time, in arrival order (a worker's or the server's);
* links: `FcfsLink` (whole messages one after another), `PsLink` (processor sharing under a per-flow
  cap), `TcpLink` (weighted sharing with a random weight per transfer, σ fitted by `fit_sharing_sigma`
  from a fan-out/fan-in microbenchmark, see `fan_completion`), each with a fixed per-message latency;
* `Ring`: ring all-reduce, one bucket at a time once every worker has produced it.

Every resource calls back ``cb(arg)`` when an operation completes; `des` wires them into the step DAG.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

Callback = Callable[[Any], None]


class Sim:
    """The event loop: a heap of (time, sequence, callback, argument)."""

    __slots__ = ("events", "heap", "now", "seq")

    def __init__(self) -> None:
        self.now = 0.0
        self.heap: list[tuple[float, int, Callback, Any]] = []
        self.seq = 0
        self.events = 0

    def after(self, delay: float, fn: Callback, arg: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (self.now + delay, self.seq, fn, arg))

    def run(self) -> None:
        heap = self.heap
        pop = heapq.heappop
        while heap:
            t, _, fn, arg = pop(heap)
            self.now = t
            self.events += 1
            fn(arg)


class Fifo:
    """A resource serving one operation at a time, in arrival order."""

    __slots__ = ("busy", "queue", "sim")

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.queue: deque[tuple[float, Callback, Any]] = deque()
        self.busy = False

    def submit(self, duration: float, cb: Callback, arg: Any = None) -> None:
        if self.busy:
            self.queue.append((duration, cb, arg))
        else:
            self.busy = True
            self.sim.after(duration, self._done, (cb, arg))

    def _done(self, x: tuple[Callback, Any]) -> None:
        if self.queue:
            dur, cb2, arg2 = self.queue.popleft()
            self.sim.after(dur, self._done, (cb2, arg2))
        else:
            self.busy = False
        x[0](x[1])


class FcfsLink:
    """A link that sends whole messages one after another at min(rate, flow cap), then a latency."""

    __slots__ = ("cap", "fifo", "latency", "rate", "sim")

    def __init__(self, sim: Sim, rate: float, flow_cap: float, latency: float) -> None:
        self.sim = sim
        self.fifo = Fifo(sim)
        self.rate = min(rate, flow_cap)
        self.latency = latency
        self.cap = flow_cap

    def send(self, nbytes: float, cb: Callback, arg: Any = None) -> None:
        self.fifo.submit(nbytes / self.rate, self._sent, (cb, arg))

    def _sent(self, x: tuple[Callback, Any]) -> None:
        self.sim.after(self.latency, x[0], x[1])


class PsLink:
    """A processor-sharing link: active flows split the rate (water-filling under a per-flow cap)."""

    __slots__ = ("cap", "flows", "last", "latency", "rate", "sim", "token")

    def __init__(self, sim: Sim, rate: float, flow_cap: float, latency: float) -> None:
        self.sim = sim
        self.rate = rate
        self.cap = flow_cap
        self.latency = latency
        # each flow: [remaining bytes, current rate, callback, argument]
        self.flows: list[list[Any]] = []
        self.last = 0.0
        self.token = 0

    def send(self, nbytes: float, cb: Callback, arg: Any = None) -> None:
        self._advance()
        self.flows.append([float(nbytes), 0.0, cb, arg])
        self._reschedule()

    def _advance(self) -> None:
        dt = self.sim.now - self.last
        if dt > 0:
            for f in self.flows:
                f[0] -= f[1] * dt
        self.last = self.sim.now

    def _reschedule(self) -> None:
        n = len(self.flows)
        if n == 0:
            return
        # Equal caps, so water-filling reduces to min(cap, rate / n).
        r = min(self.cap, self.rate / n)
        nxt = float("inf")
        for f in self.flows:
            f[1] = r
            nxt = min(nxt, f[0] / r)
        self.token += 1
        self.sim.after(max(nxt, 0.0), self._complete, self.token)

    def _complete(self, token: int) -> None:
        if token != self.token:
            return  # a newer arrival or completion rescheduled the link
        self._advance()
        done = [f for f in self.flows if f[0] <= 1e-9 * max(1.0, f[1])]
        self.flows = [f for f in self.flows if f[0] > 1e-9 * max(1.0, f[1])]
        self._reschedule()
        for f in done:
            self.sim.after(self.latency, f[2], f[3])


class TcpLink(PsLink):
    """Weighted processor sharing with a random weight per transfer: how TCP flows really share a link.

    K flows through one shaped link do not get exactly 1/K each: some grab more (window and timing
    luck) and finish early, the others take the rest — flows end in some order instead of all at once.
    Each transfer draws a weight w = exp(σ·z), z ~ N(0, 1); active flows split the rate in proportion
    to their weights (water-filling under the per-flow cap). σ = 0 is plain processor sharing, large σ
    approaches one-at-a-time (FCFS in random order). σ is a property of the link, fitted from a
    separate fan-out/fan-in microbenchmark (`fit_sharing_sigma`), never from the throughput sweep.
    """

    __slots__ = ("rng", "sigma")

    def __init__(self, sim: Sim, rate: float, flow_cap: float, latency: float, sigma: float,
                 rng: np.random.Generator) -> None:
        super().__init__(sim, rate, flow_cap, latency)
        self.sigma = sigma
        self.rng = rng

    def send(self, nbytes: float, cb: Callback, arg: Any = None) -> None:
        self._advance()
        self.flows.append([float(nbytes), 0.0, cb, arg, float(np.exp(self.sigma * self.rng.standard_normal()))])
        self._reschedule()

    def _reschedule(self) -> None:
        if not self.flows:
            return
        rates = weighted_share([f[4] for f in self.flows], self.rate, self.cap)
        nxt = float("inf")
        for f, r in zip(self.flows, rates, strict=True):
            f[1] = r
            if r > 0:  # a flow with a negligible weight waits until the others are done
                nxt = min(nxt, f[0] / r)
        self.token += 1
        self.sim.after(max(nxt, 0.0), self._complete, self.token)


def weighted_share(weights: Sequence[float], rate: float, cap: float) -> list[float]:
    """Rates of flows sharing `rate` in proportion to `weights`, none above `cap` (water-filling)."""
    order = sorted(range(len(weights)), key=lambda i: -weights[i])
    left_rate = rate
    left_w = float(sum(weights))
    out = [0.0] * len(weights)
    for i in order:  # the heaviest flows hit the cap first; what they cannot use goes to the rest
        r = max(0.0, min(cap, left_rate * weights[i] / left_w)) if left_w > 0 else 0.0
        out[i] = r
        left_rate -= r
        left_w -= weights[i]
    return out


def fan_completion(k: int, sigma: float, *, rounds: int = 400, seed: int = 0) -> FloatArray:
    """Expected sorted completion times of K equal transfers started together on a `TcpLink`.

    In units of one transfer alone (size / rate); per-flow cap = the link rate. Processor sharing
    (σ = 0) gives K for every flow, one-at-a-time gives 1, 2, …, K.
    """
    rng = np.random.default_rng(seed)
    out = np.zeros(k)
    for _ in range(rounds):
        w = np.exp(sigma * rng.standard_normal(k))
        left = np.ones(k)
        active = list(range(k))
        t = 0.0
        done = []
        while active:
            rates = weighted_share([float(w[i]) for i in active], 1.0, 1.0)
            dt = min(left[i] / r for i, r in zip(active, rates, strict=True) if r > 0)
            t += dt
            for i, r in zip(active, rates, strict=True):
                left[i] -= r * dt
            finished = [i for i in active if left[i] <= 1e-9]
            done += [t] * len(finished)
            active = [i for i in active if left[i] > 1e-9]
        out += np.sort(done)
    return out / rounds


def fit_sharing_sigma(completions: dict[int, Sequence[float]], *, grid: Sequence[float] | None = None) -> float:
    """σ of `TcpLink` that best reproduces measured fan-out (or fan-in) completion times.

    Args:
        completions: K → sorted completion times of K simultaneous equal transfers, in units of one
            transfer alone (from the network microbenchmark).
        grid: candidate σ values (default 0 … 3 in steps of 0.05).

    Returns:
        the σ minimising the squared error of the normalised completion curves over all K ≥ 2.
    """
    cands = np.arange(0.0, 3.0001, 0.05) if grid is None else np.asarray(grid, dtype=np.float64)
    use = {k: np.asarray(v, dtype=np.float64) for k, v in completions.items() if k >= 2}
    if not use:
        return 0.0
    best, best_err = 0.0, float("inf")
    for sg in cands:
        err = 0.0
        for k, v in use.items():
            # Compare shapes (completion / last completion): absolute times also carry the link's
            # efficiency and latency, which the profile's point-to-point fit already accounts for.
            model = fan_completion(k, float(sg), rounds=100)
            err += float(np.mean((model / model[-1] - v / v[-1]) ** 2))
        if err < best_err:
            best, best_err = float(sg), err
    return best


class Ring:
    """Ring all-reduce: one bucket at a time round the ring, each once every worker has produced it."""

    __slots__ = ("arrived", "bw", "fifo", "k", "latency", "waiting")

    def __init__(self, sim: Sim, k: int, bw: float, latency: float) -> None:
        self.fifo = Fifo(sim)
        self.k = k
        self.bw = bw
        self.latency = latency
        self.arrived: dict[Any, int] = {}
        self.waiting: dict[Any, list[tuple[Callback, Any]]] = {}

    def submit(self, key: Any, nbytes: float, cb: Callback, arg: Any = None) -> None:
        n = self.arrived.get(key, 0) + 1
        self.arrived[key] = n
        self.waiting.setdefault(key, []).append((cb, arg))
        if n == self.k:
            k = self.k
            dur = 0.0 if k == 1 else 2 * (k - 1) * (nbytes / (k * self.bw) + self.latency)
            self.fifo.submit(dur, self._done, key)

    def _done(self, key: Any) -> None:
        del self.arrived[key]
        for cb, arg in self.waiting.pop(key):
            cb(arg)

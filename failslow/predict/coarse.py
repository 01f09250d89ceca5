"""Coarse-grained throughput models of data-parallel SGD (Li, Paolieri & Golubchik, TPDS 2022).

Each model turns a single-worker `Profile` into the throughput of K workers, treating a step as a few
phases (download, forward, backward, upload, update) rather than per-layer operations:

* ring all-reduce Sync-SGD: T = T_F + T_B + 2(K−1)·M/(K·B) (+ 2(K−1) message latencies) + T_update,
  and an overlap form where each layer's gradient is all-reduced as soon as its backward finishes;
* parameter-server Sync-SGD: the *PS model* (the server link shares bandwidth among all K transfers),
  the *FCFS model* (the server link sends one worker's model at a time, so workers start computing
  staggered), their average (*hybrid*), and an overlap correction;
* parameter-server Async-SGD: a closed multi-class queueing network (worker compute as a delay, server
  downlink, server uplink, server CPU) solved by mean value analysis — exact for small K, Bard–Schweitzer
  for large K — with PS or FCFS link stations picked by a utilisation threshold and the overlap correction
  S_W = max(0, S_F − T_D) + max(0, S_B − T_U).

All models take optional per-worker compute slowdown factors (heterogeneous workers). Times are
seconds, bandwidths payload bytes per second (`Profile.effective_bandwidth`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError
from failslow.predict.mva import MVAResult, Station, StationKind, mva_exact, mva_schweitzer
from failslow.predict.profile import Profile

FloatArray = npt.NDArray[np.float64]
LinkModel = Literal["ps", "fcfs", "hybrid", "tcp"]

#: Async link stations switch from PS to FCFS when the busiest link is at least this utilised.
DEFAULT_FCFS_THRESHOLD = 0.8
#: Largest K solved by exact MVA (2^K populations); above it Bard–Schweitzer.
EXACT_MVA_MAX = 10


def _factors(k: int, slowdown: Sequence[float] | None) -> FloatArray:
    if k < 1:
        raise InputError(f"number of workers must be >= 1, got {k}")
    if slowdown is None:
        return np.ones(k)
    f = np.asarray(slowdown, dtype=np.float64)
    if f.shape != (k,):
        raise InputError(f"need one slowdown factor per worker ({k}), got {f.shape[0] if f.ndim else 0}")
    if not np.all(np.isfinite(f)) or np.any(f <= 0):
        raise InputError("slowdown factors must be positive and finite")
    return f


def expected_max(samples: FloatArray, factors: FloatArray, shared: float = 0.0) -> float:
    """E[max_w f_w·X_w] for X_w drawn from the empirical distribution of `samples`.

    The barrier of a synchronous step waits for the slowest worker, so the step pays the expected
    maximum of K compute times, not their mean. With the empirical CDF F, P(max ≤ t) = Π_w F(t / f_w);
    it only jumps at the candidates f_w·x_i, so the expectation is an exact finite sum.

    `shared` is the fraction ρ of the samples' variance that all workers share in a step (the same
    host at the same moment): X_w = μ + √ρ·(S − μ) + √(1−ρ)·(Y_w − μ), S and Y_w drawn from the samples.
    The common term moves every worker alike and leaves the max's mean alone, so E[max] is the
    independent max over the samples shrunk towards their mean by √(1−ρ) (exact for equal factors;
    with unequal ones the common term is taken at the mean factor's weight, i.e. left out). ρ = 0 is
    the independent max, ρ = 1 the mean (times the largest factor).
    """
    if not (0.0 <= shared <= 1.0):
        raise InputError(f"shared jitter fraction must be within [0, 1], got {shared!r}")
    xs = np.sort(np.asarray(samples, dtype=np.float64))
    if shared > 0.0:
        mu = float(xs.mean())
        xs = mu + np.sqrt(1.0 - shared) * (xs - mu)
    n = xs.shape[0]
    if n == 1:
        return float(xs[0] * factors.max())
    cand = np.unique(np.outer(factors, xs).ravel())
    cdf = np.ones_like(cand)
    for f in factors:
        cdf *= np.searchsorted(xs, cand / f * (1 + 1e-12), side="right") / n
    return float(np.sum(cand * np.diff(cdf, prepend=0.0)))


def expected_order_stats(samples: FloatArray, k: int) -> FloatArray:
    """E[X_(1)] ≤ … ≤ E[X_(k)]: expected sorted values of k independent draws from `samples`."""
    from scipy.stats import binom

    xs = np.sort(np.asarray(samples, dtype=np.float64))
    n = xs.shape[0]
    if n == 1:
        return np.full(k, xs[0])
    f_hi = np.arange(1, n + 1) / n
    f_lo = np.arange(0, n) / n
    j = np.arange(1, k + 1)[:, None]
    # P(X_(j) ≤ x_i) = P(at least j of k draws ≤ x_i) = binom.sf(j − 1, k, F(x_i))
    mass = binom.sf(j - 1, k, f_hi[None, :]) - binom.sf(j - 1, k, f_lo[None, :])
    return np.asarray(mass @ xs, dtype=np.float64)


def ring_step_time(p: Profile, k: int, *, overlap: bool | None = None,
                   slowdown: Sequence[float] | None = None) -> float:
    """Seconds per step of ring all-reduce Sync-SGD with K workers.

    Without overlap: T = E[max_w (T_F + T_B + T_update)_w] + 2(K−1)(M/(K·B) + α), the expectation over
    the profiled per-step compute times (the all-reduce is a barrier: it starts when the slowest worker
    of the step arrives; with one recorded step this is the mean form of the paper). The part of the
    jitter all workers share (`Profile.shared_jitter`) does not widen the max (`expected_max`). With overlap, each layer's
    gradient is all-reduced (in backward order, one at a time on the ring) as soon as every worker has
    computed it, so the all-reduce of the last layers hides behind the backward of the first ones.
    """
    f = _factors(k, slowdown)
    ov = p.overlap if overlap is None else overlap
    slow = float(f.max())
    bw = p.ring_bandwidth
    hop = p.ring_hop_latency
    if not ov:
        comm = 0.0 if k == 1 else 2 * (k - 1) * (p.model_bytes / (k * bw) + hop)
        sf, sb = p.step_samples()
        # Only the workers' independent jitter makes the slowest one slower than the rest.
        compute = expected_max(sf.sum(axis=1) + sb.sum(axis=1) + p.update_s, f, p.shared_jitter)
        return float(compute + comm)
    t = float(slow * p.forward_s.sum())
    link_free = t
    for layer in range(p.n_layers - 1, -1, -1):
        t += slow * float(p.backward_s[layer])
        ar = 0.0 if k == 1 else 2 * (k - 1) * (float(p.param_bytes[layer]) / (k * bw) + hop)
        link_free = max(link_free, t) + ar
    return max(t, link_free) + slow * p.update_s


def _makespan(arrivals: FloatArray, work: float) -> float:
    """When a work-conserving link finishes equal transfers arriving at the given times.

    Valid for FCFS and for processor sharing alike (the total is the same for any work-conserving order).
    """
    a = np.sort(arrivals)
    n = a.shape[0]
    return float(np.max(a + (n - np.arange(n)) * work))


def ps_sync_step_time(p: Profile, k: int, *, link: LinkModel = "hybrid", overlap: bool | None = None,
                      slowdown: Sequence[float] | None = None) -> float:
    """Seconds per step of synchronous SGD with one parameter server and K workers.

    The server's link (rate B each way) carries K model downloads then K gradient uploads.
    ``ps``: downloads share the link, all finish at K·M/B, every worker then computes.
    ``fcfs``: the server sends whole models one after another, worker i starts computing at i·M/B.
    Uploads finish at the makespan of a work-conserving link (the same under PS and FCFS); under PS
    they land together and the server then sums K gradients, under FCFS it sums each as it lands. Then
    it applies the update. ``hybrid`` averages the two step times. ``tcp``: downloads share the link
    unevenly as measured (the profile's ``share_sigma_down``; expected sorted completion times of K
    simultaneous transfers under the simulation's ``tcp`` sharing, `des.fan_completion`), so early
    workers start computing while others still download; uploads as under ``ps`` (the makespan of a
    work-conserving link does not depend on how it shares). With
    overlap, the compute a worker does in a step is corrected to max(0, T_F − T_D) + max(0, T_B − T_U)
    with T_D, T_U its own download/upload times, as forward/backward of a layer start as soon as that
    layer's parameters arrive / gradients are ready.

    Local work: a worker packs its gradient and unpacks parameters (about the memory traffic of the
    profiled ``update_s``, counted with its backward); the server spends ``accumulate_s`` per gradient
    summed plus one more to apply the mean.
    """
    if link not in ("ps", "fcfs", "hybrid", "tcp"):
        raise InputError(f"link model must be ps, fcfs, hybrid or tcp, got {link!r}")
    if link == "hybrid":
        return 0.5 * (ps_sync_step_time(p, k, link="ps", overlap=overlap, slowdown=slowdown)
                      + ps_sync_step_time(p, k, link="fcfs", overlap=overlap, slowdown=slowdown))
    f = _factors(k, slowdown)
    ov = p.overlap if overlap is None else overlap
    m = p.model_bytes / p.effective_bandwidth
    lat = p.latency_s
    if link == "ps":
        down_done = np.full(k, k * m + lat)
        own_down = np.full(k, k * m)
    elif link == "tcp":
        from failslow.predict.des import fan_completion

        own_down = fan_completion(k, p.share_sigma_down or 0.0) * m
        down_done = own_down + lat
    else:
        down_done = (np.arange(k) + 1.0) * m + lat
        own_down = np.full(k, m)
    fwd = f * p.forward_s.sum()
    bwd = f * (p.backward_s.sum() + p.update_s)  # + packing the gradient / unpacking parameters
    sf, sb = p.step_samples()
    if not ov and np.all(f == f[0]) and sf.shape[0] > 1:
        # Compute times vary step to step: use the expected order statistics of K draws, so the last
        # upload starts as late as the slowest worker does (under FCFS, paired with download order —
        # an approximation; under PS every download ends together and the pairing does not matter).
        stats = f[0] * expected_order_stats(sf.sum(axis=1) + sb.sum(axis=1) + p.update_s, k)
        return _finish_ps_sync(p, k, "ps" if link == "tcp" else link, down_done + stats, m, lat)
    if ov:
        # Forward overlaps the worker's own download; backward overlaps its upload (≈ one transfer alone
        # when the others are still computing, k transfers' worth when all upload together).
        own_up = np.full(k, m)
        compute = np.maximum(0.0, fwd - own_down) + np.maximum(0.0, bwd - own_up)
        up_start = down_done + compute
    else:
        up_start = down_done + fwd + bwd
    return _finish_ps_sync(p, k, "ps" if link == "tcp" else link, up_start, m, lat)


def _finish_ps_sync(p: Profile, k: int, link: str, up_start: FloatArray, m: float, lat: float) -> float:
    """From when each worker starts its upload to the end of the server's update."""
    if link == "ps":
        # Shared uplink: the K gradients land together, then the server sums them.
        return _makespan(up_start, m) + lat + (k + 1) * p.accumulate_s
    # One gradient at a time: the server sums each as it lands, overlapping the next transfer.
    link_t = 0.0
    cpu_t = 0.0
    for a in np.sort(up_start):
        link_t = max(link_t, float(a)) + m
        cpu_t = max(cpu_t, link_t + lat) + p.accumulate_s
    return cpu_t + p.accumulate_s  # applying the mean costs one more pass over the model


@dataclass(frozen=True)
class AsyncPrediction:
    """Async-SGD throughput from the queueing network, with what the solver chose."""

    steps_per_s: FloatArray  # per worker
    link_kind: StationKind
    exact: bool
    link_utilisation: float
    mva: MVAResult

    @property
    def total_steps_per_s(self) -> float:
        """Gradient updates per second applied by the server (all workers)."""
        return float(self.steps_per_s.sum())


def ps_async(p: Profile, k: int, *, link: StationKind | Literal["auto"] = "auto",
             threshold: float = DEFAULT_FCFS_THRESHOLD, overlap: bool | None = None,
             slowdown: Sequence[float] | None = None, exact_max: int = EXACT_MVA_MAX) -> AsyncPrediction:
    """Async-SGD with a parameter server as a closed multi-class queueing network solved by MVA.

    Each worker is a class with one job: its step cycles through the server downlink (M/B), its own
    compute (a delay, scaled by its slowdown factor), the server uplink (M/B) and the server CPU
    (apply the gradient and copy the parameters to send: 2 × accumulate; the worker's own packing and
    unpacking, ``update_s``, is part of its delay). Links are PS stations unless the busiest link's utilisation under PS reaches
    ``threshold`` (or ``link="fcfs"``), then FCFS with deterministic transfers (cv² = 0): a saturated
    link sends whole messages back-to-back. With overlap, the worker's delay is the overlap-corrected
    S_W = max(0, S_F − T_D) + max(0, S_B − T_U), T_D/T_U the MVA response times of the links, iterated
    to a fixed point.
    """
    if link not in ("auto", "ps", "fcfs"):
        raise InputError(f"async link model must be auto, ps or fcfs, got {link!r}")
    if not 0 < threshold <= 1.5:
        raise InputError(f"utilisation threshold must be in (0, 1.5], got {threshold}")
    f = _factors(k, slowdown)
    ov = p.overlap if overlap is None else overlap
    m = p.model_bytes / p.effective_bandwidth
    # A delay station's throughput depends on the mean service time: the mean of the profiled steps
    # (the per-layer figures are medians, below the mean when a step's distribution has a tail).
    sf, sb = p.step_samples()
    fwd = f * float(sf.mean(axis=0).sum())
    bwd = f * (float(sb.mean(axis=0).sum()) + p.update_s)
    server = np.full(k, 2 * p.accumulate_s)  # apply the gradient, copy the parameters to send
    exact = k <= exact_max

    def solve(kind: StationKind) -> MVAResult:
        stations = [Station("downlink", np.full(k, m), kind, 0.0 if kind == "fcfs" else 1.0),
                    Station("uplink", np.full(k, m), kind, 0.0 if kind == "fcfs" else 1.0),
                    Station("server", server, "fcfs", 0.0)]
        delay = fwd + bwd + 2 * p.latency_s
        res = (mva_exact if exact else mva_schweitzer)(stations, delay)
        if not ov:
            return res
        for _ in range(50):
            t_d, t_u = res.response[0], res.response[1]
            new_delay = np.maximum(0.0, fwd - t_d) + np.maximum(0.0, bwd - t_u) + 2 * p.latency_s
            if np.allclose(new_delay, delay, rtol=1e-9, atol=1e-12):
                break
            delay = 0.5 * (delay + new_delay)  # damped: the fixed point can oscillate
            res = (mva_exact if exact else mva_schweitzer)(stations, delay)
        return res

    kind: StationKind = "ps" if link in ("auto", "ps") else "fcfs"
    res = solve(kind)
    util = float(res.utilisation[:2].max())
    if link == "auto" and util >= threshold:
        kind = "fcfs"
        res = solve(kind)
        util = float(res.utilisation[:2].max())
    return AsyncPrediction(steps_per_s=res.throughput, link_kind=kind, exact=exact, link_utilisation=util,
                           mva=res)


Arch = Literal["ring", "ps-sync", "ps-async"]
ARCHS: tuple[Arch, ...] = ("ring", "ps-sync", "ps-async")


def coarse_throughput(p: Profile, k: int, arch: Arch, *, link: str | None = None, overlap: bool | None = None,
                      slowdown: Sequence[float] | None = None) -> float:
    """Samples per second of K workers under an architecture, by the coarse models.

    Args:
        p: single-worker profile.
        k: number of workers.
        arch: ``ring``, ``ps-sync`` or ``ps-async``.
        link: link model — ps-sync: ``ps``/``fcfs``/``hybrid`` (default hybrid); ps-async:
            ``hybrid``/``auto``/``ps``/``fcfs`` (default hybrid: mean of the PS and FCFS solutions;
            ``auto`` is the paper's utilisation-threshold rule); ignored for ring.
        overlap: override the profile's overlap flag.
        slowdown: per-worker compute slowdown factors.
    """
    if arch == "ring":
        return k * p.batch_size / ring_step_time(p, k, overlap=overlap, slowdown=slowdown)
    if arch == "ps-sync":
        # With a measured link-sharing σ the uneven-sharing model, as the fine default; otherwise hybrid.
        lk = link or ("tcp" if p.share_sigma_down is not None else "hybrid")
        if lk not in ("ps", "fcfs", "hybrid", "tcp"):
            raise InputError(f"ps-sync link model must be ps, fcfs, hybrid or tcp, got {lk!r}")
        return k * p.batch_size / ps_sync_step_time(p, k, link=lk, overlap=overlap,  # type: ignore[arg-type]
                                                    slowdown=slowdown)
    if arch == "ps-async":
        lk = link or "hybrid"
        if lk not in ("auto", "ps", "fcfs", "hybrid"):
            raise InputError(f"ps-async link model must be hybrid, auto, ps or fcfs, got {lk!r}")
        if lk == "hybrid":
            # As for Sync-SGD: the mean of the processor-sharing and the deterministic-FCFS solutions.
            both = [ps_async(p, k, link=kind, overlap=overlap, slowdown=slowdown).total_steps_per_s
                    for kind in ("ps", "fcfs")]
            return 0.5 * (both[0] + both[1]) * p.batch_size
        pred = ps_async(p, k, link=lk, overlap=overlap, slowdown=slowdown)  # type: ignore[arg-type]
        return pred.total_steps_per_s * p.batch_size
    raise InputError(f"unknown architecture {arch!r}; use one of {', '.join(ARCHS)}")

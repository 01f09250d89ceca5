"""Seeded generator of labelled iteration-time series: the ground truth the detectors are scored on.

What it is for: a reproducible benchmark that looks like what FALCON characterised on production
hybrid-parallel jobs, with the answer attached.

Shape of a job (all multiplicative on a base iteration time drawn in 0.5–5 s):

* healthy jitter with heavy tails: Student-t (3 dof) noise of 0.5–3 % scale;
* warm-up: the first 5–30 iterations are up to 1.5–4× slower, decaying;
* periodic spikes in half of the jobs: one iteration every 50/100/200 is 1.5–4× slower (checkpoint or
  evaluation), which must not alarm;
* missing samples in a fifth of the jobs (1 % NaN);
* a scenario (see :data:`SCENARIOS`): computation fail-slow on one rank (mean ~10 min), communication
  fail-slow on a group (mean ~24 min), both at once (compound), a ladder of three steps, flapping,
  sub-10 % degradations (labelled *not* a fail-slow), slow drift (not a fail-slow) or nothing.

Fail-slow severities are drawn uniformly in 1.1–3× as characterised by FALCON; sub-10 % degradations in
1.01–1.06× so the label is unambiguous (nothing is generated between 1.06 and 1.1). In synchronous training
every rank waits for the straggler, so the job's iteration time carries the slowdown; per-rank series are
the job series with a little independent measurement noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from failslow.errors import InputError

#: Scenario name -> relative frequency in :func:`generate_suite`.
SCENARIOS: dict[str, float] = {
    "healthy": 0.30, "compute": 0.15, "comm": 0.15, "compound": 0.08, "ladder": 0.08, "flapping": 0.08,
    "sub10": 0.08, "drift": 0.08,
}
#: Scenarios whose label is "has a fail-slow".
POSITIVE = frozenset({"compute", "comm", "compound", "ladder", "flapping"})


@dataclass(frozen=True)
class Event:
    """One ground-truth slowdown: iterations ``[onset, end)`` are ``severity`` times slower."""

    onset: int
    end: int
    severity: float
    kind: str  # compute | comm | sub10


@dataclass
class SyntheticJob:
    """A generated job and its ground truth.

    Attributes:
        values: Job iteration time per iteration (seconds), NaN where the sample is missing.
        ranks: ``(T, n_ranks)`` per-rank iteration times (the job series plus measurement noise).
        events: Ground-truth events, fail-slows and sub-10 % degradations alike.
        scenario: The scenario that produced the job.
        failslow: Whether the job has at least one fail-slow (severity ≥ 1.1).
        warmup: Number of warm-up iterations.
        spike_period: Period of checkpoint/eval spikes (0 = none).
    """

    values: NDArray[np.float64]
    ranks: NDArray[np.float64]
    events: list[Event] = field(default_factory=list)
    scenario: str = "healthy"
    failslow: bool = False
    warmup: int = 0
    spike_period: int = 0

    @property
    def failslow_events(self) -> list[Event]:
        """Events that are real fail-slows (severity ≥ 1.1)."""
        return [e for e in self.events if e.severity >= 1.1]


def _duration(rng: np.random.Generator, mean_s: float, t0: float, n: int) -> int:
    its = int(rng.exponential(mean_s) / t0)
    return int(np.clip(its, 30, n // 3))


def generate_job(seed: int, scenario: str = "compute", n: int = 2000, n_ranks: int = 1) -> SyntheticJob:
    """Generate one job of ``n`` iterations for ``scenario`` from ``seed`` (same seed, same job)."""
    if scenario not in SCENARIOS:
        raise InputError(f"unknown scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
    if n < 200:
        raise InputError("n must be at least 200 iterations")
    if n_ranks < 1:
        raise InputError("n_ranks must be positive")
    rng = np.random.default_rng(seed)
    t0 = float(rng.uniform(0.5, 5.0))
    jitter = float(rng.uniform(0.005, 0.03))
    mult = np.ones(n)
    events: list[Event] = []
    lo = 60  # leave the warm-up and a baseline before any event

    def add(onset: int, dur: int, sev: float, kind: str) -> None:
        end = min(n, onset + dur)
        mult[onset:end] *= sev
        events.append(Event(onset, end, sev, kind))

    if scenario in ("compute", "comm"):
        dur = _duration(rng, 600.0 if scenario == "compute" else 1440.0, t0, n)
        add(int(rng.integers(lo, n - dur)), dur, float(rng.uniform(1.1, 3.0)), scenario)
    elif scenario == "compound":
        d1 = _duration(rng, 600.0, t0, n)
        o1 = int(rng.integers(lo, n - d1 - 40))
        add(o1, d1, float(rng.uniform(1.1, 3.0)), "compute")
        d2 = _duration(rng, 1440.0, t0, n)
        o2 = int(rng.integers(o1 + 20, n - 20))
        add(o2, max(20, min(d2, n - o2)), float(rng.uniform(1.1, 3.0)), "comm")
    elif scenario == "ladder":
        onset = int(rng.integers(lo, n // 2))
        step = int(rng.integers(40, 120))
        for k in range(3):
            add(onset + k * step, n - onset - k * step, float(rng.uniform(1.1, 1.4)), "compute")
    elif scenario == "flapping":
        sev = float(rng.uniform(1.2, 2.0))
        pos = int(rng.integers(lo, n // 3))
        while pos < n - 60:
            on = int(rng.integers(15, 40))
            add(pos, on, sev, "comm")
            pos += on + int(rng.integers(15, 40))
    elif scenario == "sub10":
        dur = _duration(rng, 600.0, t0, n)
        add(int(rng.integers(lo, n - dur)), dur, float(rng.uniform(1.01, 1.06)), "sub10")
    elif scenario == "drift":
        mult *= 1.0 + np.linspace(0.0, float(rng.uniform(0.02, 0.08)), n)

    warm = int(rng.integers(5, 31))
    amp = float(rng.uniform(0.5, 3.0))
    mult[:warm] *= 1.0 + amp * np.exp(-np.arange(warm) / max(1.0, warm / 3.0))
    period = int(rng.choice([50, 100, 200])) if rng.random() < 0.5 else 0
    if period:
        first = int(rng.integers(1, period))
        mult[first::period] *= rng.uniform(1.5, 4.0, size=len(mult[first::period]))
    noise = jitter * rng.standard_t(3, size=n)
    values = t0 * mult * np.maximum(1.0 + noise, 0.5)
    ranks = values[:, None] * np.maximum(1.0 + 0.002 * rng.standard_normal((n, n_ranks)), 0.5)
    if rng.random() < 0.2:
        miss = rng.random(n) < 0.01
        miss[:2] = False
        values = values.copy()
        values[miss] = np.nan
        ranks[miss, :] = np.nan
    return SyntheticJob(values=values, ranks=ranks, events=events, scenario=scenario,
                        failslow=scenario in POSITIVE, warmup=warm, spike_period=period)


def generate_suite(seed: int, n_jobs: int, n: int = 2000) -> list[SyntheticJob]:
    """Generate ``n_jobs`` jobs with scenarios drawn by :data:`SCENARIOS` weights, reproducibly."""
    if n_jobs < 1:
        raise InputError("n_jobs must be positive")
    rng = np.random.default_rng(seed)
    names = list(SCENARIOS)
    w = np.array([SCENARIOS[k] for k in names])
    picks = rng.choice(len(names), size=n_jobs, p=w / w.sum())
    seeds = rng.integers(0, 2**63 - 1, size=n_jobs)
    return [generate_job(int(s), names[int(k)], n=n) for s, k in zip(seeds, picks, strict=True)]

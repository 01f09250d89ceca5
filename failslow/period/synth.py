"""Seeded synthetic call streams with ground truth, for testing and benchmarking period inference.

Each generator returns a `SynthTrace`: the calls one rank would record (start time, op, communicator,
bytes) plus the truth — calls per iteration for every iteration and when each iteration began and
ended. The schedules imitate what real hybrid-parallel training issues (gradient-bucket all-reduces,
1F1B pipeline Send/Recv, tensor-parallel all-reduces per layer), with compute gaps between calls,
multiplicative log-normal jitter and optional pattern changes (micro-batch count changes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError
from failslow.record import Op

ALLREDUCE, SEND, RECV = int(Op.ALLREDUCE), int(Op.SEND), int(Op.RECV)


@dataclass(frozen=True)
class Step:
    """One call of an iteration template: compute gap before it, then the call itself."""

    gap_s: float
    op: int
    comm: int
    nbytes: int
    duration_s: float = 1e-4


@dataclass(frozen=True)
class SynthTrace:
    """A synthetic call stream and its ground truth.

    Attributes:
        t_start: Call start times, seconds.
        duration: Call durations, seconds.
        op, comm, nbytes: Per-call features.
        period: Calls per iteration of each iteration.
        iter_start: Time each iteration began (before the compute that precedes its first call).
        iter_end: Time each iteration ended (its last call finished, plus the trailing compute).
    """

    t_start: npt.NDArray[np.float64]
    duration: npt.NDArray[np.float64]
    op: npt.NDArray[np.int64]
    comm: npt.NDArray[np.int64]
    nbytes: npt.NDArray[np.int64]
    period: npt.NDArray[np.int64]
    iter_start: npt.NDArray[np.float64]
    iter_end: npt.NDArray[np.float64]

    @property
    def iteration_s(self) -> npt.NDArray[np.float64]:
        """True duration of every iteration."""
        return self.iter_end - self.iter_start


def dp_buckets(buckets: int = 4, *, identical: bool = False, fwd_s: float = 0.05, bwd_s: float = 0.08,
               opt_s: float = 0.01) -> tuple[list[Step], float]:
    """Data-parallel iteration: forward, backward overlapped with bucketed gradient all-reduces, optimizer.

    Returns the call template and the compute after the last call (optimizer step).
    """
    steps = []
    for b in range(buckets):
        gap = fwd_s + bwd_s / buckets if b == 0 else bwd_s / buckets
        size = 25 << 20 if identical else (25 << 20) - b * (1 << 20)
        steps.append(Step(gap, ALLREDUCE, 1, size, 2e-3))
    steps.append(Step(1e-4, ALLREDUCE, 1, 4, 1e-4))  # loss all-reduce for logging
    return (steps if not identical else steps[:-1]), opt_s


def pp_1f1b(stage: int, stages: int, micro_batches: int, *, fwd_s: float = 0.01, bwd_s: float = 0.02,
            opt_s: float = 0.015, dp_allreduce: bool = False, act_bytes: int = 1 << 20) -> tuple[list[Step], float]:
    """One pipeline stage under 1F1B: Recv/Send of activations and gradients around compute.

    With ``stage`` in the middle every call is a Send or Recv of the same size; on a two-stage
    pipeline with one neighbour every call of a stage can be identical in kind, comm and bytes.
    """
    if not 0 <= stage < stages or micro_batches < 1:
        raise InputError("pp_1f1b: need 0 <= stage < stages and micro_batches >= 1")
    first, last = stage == 0, stage == stages - 1
    warm = min(stages - stage - 1, micro_batches)
    steps: list[Step] = []
    pending = 0.0

    def call(op: int, comm: int) -> None:
        nonlocal pending
        steps.append(Step(pending, op, comm, act_bytes))
        pending = 0.0

    def forward() -> None:
        nonlocal pending
        if not first:
            call(RECV, 10)
        pending += fwd_s
        if not last:
            call(SEND, 11)

    def backward() -> None:
        nonlocal pending
        if not last:
            call(RECV, 11)
        pending += bwd_s
        if not first:
            call(SEND, 10)

    for _ in range(warm):
        forward()
    for _ in range(micro_batches - warm):
        forward()
        backward()
    for _ in range(warm):
        backward()
    if dp_allreduce:
        call(ALLREDUCE, 1)
    if not steps:
        raise InputError("pp_1f1b: a single-stage pipeline without DP issues no calls")
    return steps, pending + opt_s


def generate(
    templates: list[tuple[list[Step], float]],
    iterations: list[int],
    *,
    jitter: float = 0.03,
    seed: int = 0,
    t0: float = 1000.0,
) -> SynthTrace:
    """Play iteration templates back to back with multiplicative log-normal jitter on every gap.

    Args:
        templates: Iteration templates (calls, trailing compute), e.g. from `dp_buckets`/`pp_1f1b`.
        iterations: How many iterations of each template, in order (a pattern change between them).
        jitter: Sigma of the log-normal factor on each compute gap and call duration.
        seed: RNG seed; equal seeds give equal traces.
        t0: Time the first iteration begins.
    """
    if len(templates) != len(iterations) or not templates:
        raise InputError("generate: one iteration count per template")
    rng = np.random.default_rng(seed)
    t = t0
    ts: list[float] = []
    durs: list[float] = []
    ops: list[int] = []
    comms: list[int] = []
    nb: list[int] = []
    per: list[int] = []
    starts: list[float] = []
    ends: list[float] = []
    for (steps, tail), count in zip(templates, iterations, strict=True):
        gaps = np.array([s.gap_s for s in steps])
        cd = np.array([s.duration_s for s in steps])
        for _ in range(count):
            starts.append(t)
            f = rng.lognormal(0.0, jitter, size=(2, len(steps)))
            for i, s in enumerate(steps):
                t += gaps[i] * f[0, i]
                ts.append(t)
                d = cd[i] * f[1, i]
                durs.append(d)
                t += d
                ops.append(s.op)
                comms.append(s.comm)
                nb.append(s.nbytes)
            t += tail * rng.lognormal(0.0, jitter)
            ends.append(t)
            per.append(len(steps))
    return SynthTrace(
        t_start=np.array(ts), duration=np.array(durs), op=np.array(ops, dtype=np.int64),
        comm=np.array(comms, dtype=np.int64), nbytes=np.array(nb, dtype=np.int64),
        period=np.array(per, dtype=np.int64), iter_start=np.array(starts), iter_end=np.array(ends))

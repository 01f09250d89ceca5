"""Real NCCL on a real GPU: what the shim recorded of a training job on an NVIDIA H200, and the profiler
trace of the same job, as `failslow period` and the detector service read them.

Recorded with ``scripts/gpu_check.py`` (torch 2.11.0+cu130, NCCL 2.28.9, one H200; see docs/shim.md, "On a
real GPU"). The job: 8 bf16 4096x4096 layers, forward and backward, one NCCL all-reduce per layer's gradient
and one for the loss (9 calls per iteration), 20 ms of host time per step; iterations 0-599 healthy, then
slow in two runs: ``compute`` (the default) does twice the compute from iteration 600; ``contention``
(``--fault contention``) starts another process's bf16 matrix products on the same GPU at iteration 600,
which reach the GPU at iteration 716 (its start-up) and slow the job 1.76x. NCCL refuses two ranks on one
GPU, so the job runs at world size 1: the all-reduces launch no kernel, and the profiler trace's GPU
timeline holds the GEMMs and no NCCL kernel.

Fixtures (tests/period/data): ``gpu/h200[_contention]_shim_dump.jsonl.gz`` (`failslow shim-dump` of the
job's ring, 10,802 records), ``gpu/h200[_contention]_iterations.csv`` (the job's own step start and
synchronised duration, CLOCK_MONOTONIC like the shim's records), ``profiler/h200_nccl_one_rank.json.gz``
(torch.profiler, CPU and CUDA activity, six steps at iteration 60 of the compute run).
"""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import numpy as np
import pytest

from failslow.period import CONFIDENCE_MIN, infer_iterations
from failslow.period.io import parse_calls
from failslow.period.profiler_trace import compare_steps, read_profiler_trace
from tests.detector.engine_replay import opened

DATA = Path(__file__).parent / "data"
RUNS = {"compute": "h200", "contention": "h200_contention"}


def _truth(run: str) -> tuple[np.ndarray, np.ndarray, int]:
    """The job's step starts and durations, and its first slow iteration: 600 in the compute run; in the
    contention run the first at 1.3x the healthy median or more (the other process's start-up delays it)."""
    with (DATA / "gpu" / f"{RUNS[run]}_iterations.csv").open() as f:
        rows = list(csv.DictReader(f))
    it = np.array([int(r["iteration"]) for r in rows])
    t0 = np.array([float(r["t_monotonic_s"]) for r in rows])
    d = np.array([float(r["duration_s"]) for r in rows])
    assert (np.diff(it) == 1).all() and it[0] == 0
    slow_from = 600 if run == "compute" else 600 + int(np.flatnonzero(d[600:] > 1.3 * np.median(d[100:590]))[0])
    return t0, d, slow_from


def _inferred(run: str = "compute") -> tuple[np.ndarray, np.ndarray, int]:
    with gzip.open(DATA / "gpu" / f"{RUNS[run]}_shim_dump.jsonl.gz", "rt") as f:
        text = f.read()
    c = parse_calls(text)
    res = infer_iterations(c.t_start, c.op, c.comm, c.nbytes, c.peer)
    assert res.confidence >= CONFIDENCE_MIN, res.reason
    assert res.period is not None
    return res.iteration_s, res.iteration_end_t, res.period


@pytest.mark.parametrize(("run", "factor"), [("compute", 1.47), ("contention", 1.76)])
def test_the_real_nccl_call_stream_gives_the_jobs_iteration_times(run: str, factor: float) -> None:
    t0, _, slow_from = _truth(run)
    s, end, period = _inferred(run)
    assert period == 9
    truth = np.diff(t0)  # start to start: the job's iterations as a call stream sees them
    start = end - s
    for lo, hi in ((100, 590), (slow_from + 20, 1190)):
        inside = (start > t0[lo]) & (end < t0[hi])
        assert inside.sum() >= hi - lo - 5
        got, want = float(np.median(s[inside])), float(np.median(truth[lo:hi]))
        assert got == pytest.approx(want, rel=0.01)  # measured: within 0.1%
    assert float(np.median(truth[slow_from + 20:1190]) / np.median(truth[100:590])) == pytest.approx(factor, abs=0.05)


@pytest.mark.parametrize("run", sorted(RUNS))
def test_the_detector_opens_one_event_where_the_slow_phase_starts(run: str) -> None:
    """The service's engine, default settings, one poll per inferred iteration: no event in the healthy
    stretch (the profiled steps and the first iterations read up to 2x the pace), one at the slowdown."""
    t0, _, slow_from = _truth(run)
    s, end, _ = _inferred(run)
    onset = int(np.searchsorted(end, t0[slow_from]))
    events = opened(s)
    assert len(events) == 1, events
    assert abs(events[0][0] - onset) <= 2 and events[0][1] - onset <= 10, (events, onset)


def test_the_h200_profiler_trace_takes_the_collectives_not_the_gemm_kernels() -> None:
    tr = read_profiler_trace(DATA / "profiler" / "h200_nccl_one_rank.json.gz")
    assert tr.source == "c10d"  # the GPU timeline holds compute kernels and no NCCL kernel
    assert len(tr.calls.t_start) == 6 * 9 and len(tr.step_s) == 6
    c = tr.calls
    res = infer_iterations(c.t_start, c.op, c.comm, c.nbytes, c.peer)
    assert res.confidence >= CONFIDENCE_MIN and res.period == 9
    cmp = compare_steps(tr, res.iteration_s, res.iteration_end_t)
    assert cmp is not None and cmp.matched >= 4
    assert abs(cmp.step_error) < 0.02  # measured -0.3%


def test_the_profile_bit_gave_gpu_times_to_every_call_while_it_was_on() -> None:
    """The shim's CUDA-event path on a real GPU: the controller set PROFILE at iteration 300 and cleared it at
    400; every call in between carries GPU times (none GPU_FAILED), mapped onto CLOCK_MONOTONIC after the
    host enqueued it (the GPU ran 13-15 ms behind the host, queued behind the backward pass)."""
    import json

    from failslow.record.layout import Flag

    with gzip.open(DATA / "gpu" / "h200_shim_dump.jsonl.gz", "rt") as f:
        recs = [json.loads(ln) for ln in f]
    gpu = [r for r in recs if r["flags"] & Flag.GPU_TIMES]
    assert not any(r["flags"] & Flag.GPU_FAILED for r in recs)
    seqs = [r["seq"] for r in gpu]
    assert len(gpu) >= 9 * 90 and seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # one unbroken stretch
    for r in gpu:
        assert r["flags"] & Flag.HOST_TIMES and r["op"] == "AllReduce"
        lag = (r["t_start_ns"] - r["t_enqueue_ns"]) / 1e9
        assert 0.0 < lag < 0.1 and r["t_end_ns"] >= r["t_start_ns"]
    before = [r for r in recs if r["seq"] < seqs[0] and r["op"] == "AllReduce"]
    assert before and all(r["t_start_ns"] == 0 and r["flags"] == Flag.HOST_TIMES for r in before)

"""Profiles and trainer outputs built in code for the predict tests (no testbed needed)."""

from __future__ import annotations

import numpy as np

from failslow.predict.profile import LayerProfile, Profile


def make_profile(layers: int = 6, *, overlap: bool = False, latency: float = 0.002, jitter: float = 0.0,
                 seed: int = 0) -> Profile:
    """A small MLP-like profile: uneven layer sizes and times, 10 MB/s links."""
    lys = tuple(LayerProfile(f"l{i}", 100_000 * (i + 1), 0.01 * (i % 3 + 1), 0.02) for i in range(layers))
    p = Profile(layers=lys, batch_size=32, bandwidth_bytes_per_s=10e6, link_efficiency=0.95, latency_s=latency,
                update_s=0.005, accumulate_s=0.001, overlap=overlap)
    if jitter:
        rng = np.random.default_rng(seed)
        f = p.forward_s * rng.lognormal(0.0, jitter, size=(40, layers))
        b = p.backward_s * rng.lognormal(0.0, jitter, size=(40, layers))
        p = Profile(layers=lys, batch_size=32, bandwidth_bytes_per_s=10e6, link_efficiency=0.95,
                    latency_s=latency, update_s=0.005, accumulate_s=0.001, step_forward_s=f, step_backward_s=b,
                    overlap=overlap)
    return p


def job_doc(arch: str, k: int, ranks: dict) -> dict:
    """A finished microbenchmark job as the trainer writes it: its spec and per-rank timings."""
    return {"spec": {"arch": arch, "workers": k, "width": 4, "depth": 1, "classes": 2}, "ranks": ranks}


def raw_profile_job(walls: float) -> dict:
    """A finished ``profile`` job as the trainer writes it (two layers, three steps per phase)."""
    f = [[0.01, 0.02]] * 3
    b = [[0.03, 0.02]] * 3
    raw = {"forward_s": f, "backward_s": b, "step_wall_s": [walls] * 3, "update_s": [0.002] * 3,
           "accumulate_s": [0.0005] * 3, "compute_cpu_s": [0.01] * 3, "param_bytes": [4000, 40],
           "names": ["Linear+ReLU", "Linear"],
           "idle_forward_s": f, "idle_backward_s": b, "idle_step_wall_s": [walls * 0.9] * 3,
           "net_forward_s": f, "net_backward_s": b, "net_step_wall_s": [walls * 1.1] * 3,
           "ring_forward_s": f, "ring_backward_s": b, "ring_step_wall_s": [walls * 1.2] * 3,
           "calibration": {"4": [0.001] * 3, "400": [0.002] * 3, "4000": [0.004] * 3},
           "allreduce_calibration": {"400": [0.002] * 3, "4000": [0.005] * 3}}
    spec = {"rate": "200mbit", "batch_size": 512, "cpu_cap": 0.156, "cpu_period_us": 10000, "width": 256,
            "depth": 5, "classes": 10}
    return {"spec": spec, "ranks": {"0": raw}}

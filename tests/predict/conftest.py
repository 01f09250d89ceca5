"""Profiles built in code for the model tests (no testbed needed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from failslow.predict.profile import LayerProfile, Profile, profile_to_doc


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


@pytest.fixture
def profile() -> Profile:
    return make_profile()


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile_to_doc(make_profile(jitter=0.05))))
    return path

"""No slowdown alarm on healthy real training runs (tests/data/healthy_logs, see its SOURCES.md).

The per-iteration times of public large-model runs (warm-up, evaluation and checkpoint spikes included) go
through the detector service's own engine with the service's default settings, one poll per logged
iteration: it must not open a single slowdown event. The same series with a real slowdown added must open
one, where it starts, so the test cannot pass by detecting nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from detector.engine import Engine
from detector.settings import Settings

DATA = Path(__file__).resolve().parents[1] / "data" / "healthy_logs"
RUNS = sorted(DATA.glob("*.json"))


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _opened(seconds: np.ndarray) -> list[float]:
    """Onsets (sample index) of the job events the service's engine opens, default settings."""
    s = Settings()
    engine = Engine(s.method, s.threshold, s.quorum, s.dtype)
    onsets = []
    for t, v in enumerate(seconds):
        for change in engine.step(float(t), {("job", "0"): float(v)}, sample_ts=float(t)):
            if change.what == "opened":
                onsets.append(change.event.onset_ts)
    return onsets


def test_the_collection_is_what_the_manifest_lists() -> None:
    manifest = (DATA / "SOURCES.md").read_text()
    sources = set()
    assert len(RUNS) >= 5
    for path in RUNS:
        doc = _load(path)
        assert doc["name"] == path.stem and path.name in manifest
        assert len(doc["seconds"]) == len(doc["steps"]) >= 14
        assert all(v > 0 for v in doc["seconds"])
        assert doc["source"]["commit"] in manifest
        sources.add(doc["source"]["repo"])
    assert len(sources) >= 2


@pytest.mark.parametrize("path", RUNS, ids=[p.stem for p in RUNS])
def test_healthy_run_raises_no_slowdown(path: Path) -> None:
    x = np.array(_load(path)["seconds"])
    assert _opened(x) == []


@pytest.mark.parametrize("path", RUNS, ids=[p.stem for p in RUNS])
def test_the_same_run_with_a_slowdown_alarms_where_it_starts(path: Path) -> None:
    x = np.array(_load(path)["seconds"])
    start = max(8, int(0.6 * x.shape[0]))
    slow = x.copy()
    slow[start:] *= 1.5
    onsets = _opened(slow)
    assert len(onsets) == 1 and abs(onsets[0] - start) <= 2, (onsets, start)

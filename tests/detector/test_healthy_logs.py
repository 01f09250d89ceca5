"""No slowdown alarm on healthy real training runs (tests/data/healthy_logs, see its SOURCES.md).

The per-iteration times of public large-model runs (warm-up, evaluation and checkpoint spikes included) and
of one run with a batch-size ramp-up recorded here on a GPU (a Megatron-style log, read per sample since
its batch size changes, `failslow.detect.work`) go through the detector service's own engine with the
service's default settings, one poll per logged iteration: it must not open a single slowdown event. The
same series with a real slowdown added must open one, where it starts, so the test cannot pass by
detecting nothing.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from failslow.detect.work import parse_megatron_log
from tests.detector.engine_replay import opened

DATA = Path(__file__).resolve().parents[1] / "data" / "healthy_logs"
RUNS = sorted(DATA.glob("*.json"))
LOGS = sorted(DATA.glob("*.log.gz"))


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _series(path: Path) -> np.ndarray:
    """What the detector reads of a run: the logged seconds, or a log's seconds per sample when its batch
    size changes."""
    if path.suffix == ".json":
        return np.array(_load(path)["seconds"])
    with gzip.open(path, "rt") as f:
        return parse_megatron_log(f.read()).series()[1]


def _opened(seconds: np.ndarray) -> list[float]:
    """Onsets (sample index) of the job events the service's engine opens, default settings."""
    return [onset for onset, _ in opened(seconds)]


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
    for path in LOGS:
        assert path.name in manifest


@pytest.mark.parametrize("path", RUNS + LOGS, ids=[p.name.split(".")[0] for p in RUNS + LOGS])
def test_healthy_run_raises_no_slowdown(path: Path) -> None:
    assert _opened(_series(path)) == []


@pytest.mark.parametrize("path", RUNS + LOGS, ids=[p.name.split(".")[0] for p in RUNS + LOGS])
def test_the_same_run_with_a_slowdown_alarms_where_it_starts(path: Path) -> None:
    x = _series(path)
    start = max(8, int(0.6 * x.shape[0]))
    slow = x.copy()
    slow[start:] *= 1.5
    onsets = _opened(slow)
    assert len(onsets) == 1 and abs(onsets[0] - start) <= 2, (onsets, start)


def test_the_ramp_read_per_iteration_alarms_at_its_first_stair() -> None:
    """Why the ramp is read per sample: its iteration times alone open an event where the batch doubled
    (32 to 64 at iteration 109), and it never closes, since every later stair is longer still."""
    with gzip.open(DATA / "failslow_gpt_ramp_h200.log.gz", "rt") as f:
        log = parse_megatron_log(f.read())
    first_stair = int(np.flatnonzero(log.global_batch != log.global_batch[0])[0])
    assert int(log.steps[first_stair]) == 109
    assert _opened(log.seconds) == [float(first_stair)]
    assert log.series()[0] == "seconds_per_sample"


@pytest.mark.parametrize("start", [30, 80, 150, 200])
def test_a_slowdown_during_the_ramp_alarms_at_its_onset(start: int) -> None:
    """Read per sample, a 1.3x slowdown that starts on a stair (batch 32, 64, or 128 at 200) still opens one
    event where it starts."""
    with gzip.open(DATA / "failslow_gpt_ramp_h200.log.gz", "rt") as f:
        log = parse_megatron_log(f.read())
    slow = log.seconds.copy()
    slow[start:] *= 1.3
    onsets = _opened(slow / log.global_batch)
    assert len(onsets) == 1 and abs(onsets[0] - start) <= 2, (onsets, start)

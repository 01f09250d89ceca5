"""Fixtures of the what-if tests: the real whatif-ST trace (required: a missing copy fails the tests)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from failslow.whatif import read_trace
from failslow.whatif.trace import Trace

REPO = Path(__file__).resolve().parents[2]
ST_DIR = REPO.parent / "shared" / "data" / "whatif-ST"


@pytest.fixture(scope="session")
def st_dir() -> Path:
    """The directory of the real ByteDance whatif-ST trace and its published results."""
    needed = ["trace-ST.parquet", "trace-ST.csv.gz", "meta-ST.yaml", "result-ST.json", "ms-ST.json", "mw-ST.json"]
    missing = [n for n in needed if not (ST_DIR / n).is_file()]
    if missing:
        pytest.fail(f"real-data test needs {missing} in {ST_DIR} (the checkout's ../shared/data/whatif-ST)")
    return ST_DIR


DATA = Path(__file__).parent / "data"


def _recorded(name: str) -> tuple[dict, Trace]:
    return json.loads((DATA / f"{name}.json").read_text()), read_trace(DATA / f"trace-{name}.parquet")


@pytest.fixture(scope="session")
def recorded_run() -> Callable[[str], tuple[dict, Trace]]:
    """Loads a testbed validation run kept in tests/whatif/data by name: its document (report
    excerpts, which steps were faulty) and its trace."""
    return _recorded


def _measured(doc: dict) -> float:
    its = doc["iteration_time_s"]

    def mean(steps: list[int]) -> float:
        return float(np.mean([[its[r][str(s)] for s in steps] for r in its]))

    return mean(doc["measured_faulty_steps"]) / mean(doc["measured_healthy_steps"])


@pytest.fixture(scope="session")
def measured_slowdown() -> Callable[[dict], float]:
    """Faulty / healthy mean iteration time of a recorded run (testbed report), the first iteration of
    each stretch left out as in the bench (it carries the switch)."""
    return _measured

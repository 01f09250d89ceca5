"""Fixtures of the what-if tests: the real whatif-ST trace (required: a missing copy fails the tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

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

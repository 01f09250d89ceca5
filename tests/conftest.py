"""Shared test fixtures. Integration fixtures that start real processes live in tests/integration/."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture
def repo_root() -> Path:
    return REPO


@pytest.fixture
def failslow_cmd() -> list[str]:
    """The installed CLI as a subprocess argv prefix (tests the real entry point)."""
    exe = Path(sys.executable).parent / "failslow"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "failslow_cli"]


def is_root() -> bool:
    return os.geteuid() == 0


INTEGRATION_DIR = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test in tests/integration/ carries the `integration` marker, so `-m "not integration"` is the
    unit run; a test marked `integration` anywhere else is an error (it belongs in tests/integration/)."""
    misplaced = []
    for item in items:
        inside = INTEGRATION_DIR in Path(str(item.path)).resolve().parents
        if inside:
            item.add_marker(pytest.mark.integration)
        elif item.get_closest_marker("integration") is not None:
            misplaced.append(item.nodeid)
    if misplaced:
        raise pytest.UsageError("tests marked integration outside tests/integration/: " + ", ".join(misplaced))

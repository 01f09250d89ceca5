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

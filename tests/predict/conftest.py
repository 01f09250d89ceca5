"""Profiles built in code for the model tests (no testbed needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from failslow.predict.profile import Profile, profile_to_doc
from tests.predict.profiles import make_profile


@pytest.fixture
def profile() -> Profile:
    return make_profile()


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile_to_doc(make_profile(jitter=0.05))))
    return path

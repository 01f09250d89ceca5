"""`failslow predict` through the installed entry point."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest


def _run(cmd: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, "predict", *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("arch", ["ring", "ps-sync", "ps-async"])
@pytest.mark.parametrize("model", ["coarse", "fine"])
def test_predict_prints_documented_json(failslow_cmd: list[str], profile_file: Path, arch: str, model: str) -> None:
    r = _run(failslow_cmd, str(profile_file), "--workers", "1,2,4,8", "--arch", arch, "--model", model,
             "--steps", "20")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["arch"] == arch and doc["model"] == model
    assert list(doc["throughput"]) == ["1", "2", "4", "8"]
    x = [doc["throughput"][k] for k in ("1", "2", "4", "8")]
    assert all(v > 0 for v in x)
    assert x[1] > x[0]  # two workers beat one on this profile in every architecture


def test_bandwidth_option_changes_the_prediction(failslow_cmd: list[str], profile_file: Path) -> None:
    slow = json.loads(_run(failslow_cmd, str(profile_file), "--workers", "8", "--bandwidth", "10mbit").stdout)
    fast = json.loads(_run(failslow_cmd, str(profile_file), "--workers", "8", "--bandwidth", "1gbit").stdout)
    assert fast["throughput"]["8"] > 2 * slow["throughput"]["8"]
    # A per-flow cap below the link rate slows a lone worker's transfers in the simulation.
    base = json.loads(_run(failslow_cmd, str(profile_file), "--workers", "1", "--arch", "ps-sync", "--model", "fine",
                           "--steps", "20").stdout)
    capped = json.loads(_run(failslow_cmd, str(profile_file), "--workers", "1", "--arch", "ps-sync", "--model",
                             "fine", "--steps", "20", "--flow-cap", "20mbit").stdout)
    assert capped["throughput"]["1"] < 0.8 * base["throughput"]["1"]


@pytest.mark.parametrize(("args", "message"), [
    (["--workers", "0,2"], "must be >= 1"),
    (["--workers", "two"], "bad --workers"),
    (["--bandwidth", "fast"], "bad rate"),
    (["--slowdown", "x"], "bad --slowdown"),
    (["--model", "fine", "--link", "fair"], "link sharing"),
    (["--arch", "mesh"], "invalid choice"),
])
def test_bad_options_exit_2_with_a_message(failslow_cmd: list[str], profile_file: Path, args: list[str],
                                           message: str) -> None:
    r = _run(failslow_cmd, str(profile_file), *args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_profile_exits_2(failslow_cmd: list[str], tmp_path: Path) -> None:
    r = _run(failslow_cmd, str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "failslow predict:" in r.stderr and "does not exist" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "failslow-dp-profile/1", "layers": []}))
    r = _run(failslow_cmd, str(bad))
    assert r.returncode == 2 and "layers" in r.stderr

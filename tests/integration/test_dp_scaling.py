"""`failslow testbed dp-scaling` for real: a short K=2 run in namespaces with tbf and capped cgroups."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from failslow.predict import parse_profile, predict

pytestmark = [pytest.mark.integration, pytest.mark.testbed]


def _namespaces_of(pid: int) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.startswith(f"fsltb{pid}-")]


@pytest.mark.root
def test_dp_scaling_smoke_profiles_measures_and_cleans_up(failslow_cmd: list[str], tmp_path: Path) -> None:
    prof, out = tmp_path / "profile.json", tmp_path / "measured.json"
    proc = subprocess.Popen([*failslow_cmd, "testbed", "dp-scaling", "--arch", "ring,ps-async", "--workers", "2",
                             "--steps", "3", "--warmup", "1", "--profile-out", str(prof), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    summary = json.loads(stdout)
    measured = {arch: summary["throughput"][arch]["2"] for arch in ("ring", "ps-async")}
    assert all(x > 0 for x in measured.values())
    # Everything it created is gone: namespaces (and with them the tbf qdiscs) and cgroups.
    assert _namespaces_of(proc.pid) == []
    assert not list(Path("/sys/fs/cgroup/cpu").glob(f"fsltb{proc.pid}-*"))

    profile = parse_profile(json.loads(prof.read_text()))
    assert profile.n_layers == 6
    assert [ly.param_bytes for ly in profile.layers] == [263168] * 5 + [10280]  # 256×256+256 floats, 256×10+10
    assert profile.batch_size == 512
    assert profile.bandwidth_bytes_per_s == pytest.approx(25e6)  # 200mbit
    assert 0.5 < profile.link_efficiency <= 1.2  # tbf really shapes: payload rate near the set rate
    assert profile.forward_s.sum() > 0 and profile.backward_s.sum() > 0
    assert profile.step_forward_s.shape[1] == 6
    doc = json.loads(out.read_text())
    assert {(r["arch"], r["workers"]) for r in doc["runs"]} == {("ring", 2), ("ps-async", 2)}
    # The profile predicts the run it came from to within a loose band (3 steps on a busy shared box).
    for arch, x in measured.items():
        pred = predict(profile, [2], arch=arch).throughput[2]
        assert 0.5 < pred / x < 2.0, (arch, pred, x)

"""`failslow detect` end to end through the installed entry point: JSON shape, defaults, bad input."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from failslow.detect.synthetic import generate_job


def _run(cmd: list[str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, "detect", *args], input=stdin, capture_output=True, text=True, timeout=120)


def _csv(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


def test_iteration_times_with_missing_cells(tmp_path: Path, failslow_cmd: list[str]) -> None:
    job = generate_job(3, "compute", n=1000)
    ev = job.events[0]
    rows = ["" if np.isnan(v) else f"{v:.6f}" for v in job.values]
    rows[ev.onset - 3] = ""
    f = _csv(tmp_path / "it.csv", "step,value", [f"{k},{r}" for k, r in enumerate(rows)])
    p = _run(failslow_cmd, str(f))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["method"] == "bocd-v" and doc["n"] == 1000
    ups = [c for c in doc["change_points"] if c["ratio"] > 1]
    assert [c["index"] for c in ups] == [ev.onset]
    c = ups[0]
    assert set(c) == {"index", "probability", "mean_before", "mean_after", "ratio"}
    assert c["ratio"] == pytest.approx(ev.severity, rel=0.05)
    assert c["mean_after"] / c["mean_before"] == pytest.approx(c["ratio"])
    assert 0 < c["probability"] <= 1


def test_generic_series_from_stdin_every_method(failslow_cmd: list[str]) -> None:
    rng = np.random.default_rng(5)
    x = np.r_[rng.normal(0.0, 1.0, 200), rng.normal(8.0, 1.0, 200), rng.normal(-5.0, 1.0, 200)]
    text = "temperature\n" + "\n".join(f"{v:.5f}" for v in x)
    # The window baseline's relative threshold means nothing around zero: give it a series with a level.
    shifted = "temperature\n" + "\n".join(f"{v + 50:.5f}" for v in x)
    for method, tol in (("bocd-v", 0), ("bocd", 0), ("window", 3)):
        p = _run(failslow_cmd, "--method", method, "-", stdin=shifted if method == "window" else text)
        assert p.returncode == 0, p.stderr
        idx = [c["index"] for c in json.loads(p.stdout)["change_points"]]
        if method == "bocd":
            assert 200 in idx and 400 in idx  # plain BOCD finds them, among others
        else:
            assert len(idx) == 2 and abs(idx[0] - 200) <= tol and abs(idx[1] - 400) <= tol, (method, idx)


def test_all_columns_and_column_choice(tmp_path: Path, failslow_cmd: list[str]) -> None:
    rng = np.random.default_rng(6)
    a = np.r_[rng.normal(1, 0.01, 150), rng.normal(2, 0.01, 150)]
    b = rng.normal(5, 0.05, 300)
    f = _csv(tmp_path / "two.csv", "a,b,host", [f"{x:.5f},{y:.5f},n1" for x, y in zip(a, b, strict=True)])
    p = _run(failslow_cmd, "--all-columns", str(f))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert set(doc["series"]) == {"a", "b"}
    assert [c["index"] for c in doc["series"]["a"]["change_points"]] == [150]
    assert doc["series"]["b"]["change_points"] == []
    p = _run(failslow_cmd, "--column", "a", str(f))
    assert p.returncode == 0 and json.loads(p.stdout)["change_points"][0]["index"] == 150


@pytest.mark.parametrize(("content", "args", "needle"), [
    ("a,b\n1,2\n3,4\n", [], "several numeric columns"),
    ("value\n1\nx\n", [], "not a number"),
    ("", [], "empty input"),
    ("value\n", [], "no data rows"),
    ("value\n1\n2\n", ["--column", "nope"], "no column 'nope'"),
    ("name\nfoo\n", [], "no numeric column"),
    ("value,b\n1\n", [], "fields"),
    ("value\ninf\n", [], "infinite"),
    ("value\n1\n", ["--column", "value", "--all-columns"], "mutually exclusive"),
])
def test_bad_input_exits_2(tmp_path: Path, failslow_cmd: list[str], content: str, args: list[str],
                           needle: str) -> None:
    f = tmp_path / "bad.csv"
    f.write_text(content)
    p = _run(failslow_cmd, *args, str(f))
    assert p.returncode == 2
    assert p.stderr.startswith("failslow detect: ") and needle in p.stderr, p.stderr


def test_missing_file_and_bad_method_exit_2(failslow_cmd: list[str]) -> None:
    assert _run(failslow_cmd, "/nonexistent/x.csv").returncode == 2
    assert _run(failslow_cmd, "--method", "mcmc", "-", stdin="value\n1\n").returncode == 2

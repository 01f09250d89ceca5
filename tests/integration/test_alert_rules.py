"""Prometheus side of alerting as code: promtool checks, unit tests, and rules/tests/runbooks kept 1:1."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from failslow_cli.stack.processes import (
    PROMETHEUS_DIR,
    PROMTOOL,
    RUNBOOKS_DIR,
    alert_rules,
    recording_rules,
    require_binary,
)

TESTS_DIR = PROMETHEUS_DIR / "tests"
RUNBOOK_BASE = "https://github.com/failslow/failslow/blob/main/runbooks/"
NON_ALERT_TEST_FILES = {"recording"}
# Alerts about one rank must say which rank and where it sits in the DP x PP grid.
RANK_ALERTS = {"RankStraggler"}
# Up/down alerts have no measured quantity to report (the value is `up`, 0).
HEALTH_ALERTS = {"ExporterDown", "DetectorDown"}


def _seconds(d: str) -> float:
    """Prometheus duration ("1m30s", "10s", "2h") in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", d)
    if not parts or "".join(n + u for n, u in parts) != d:
        raise ValueError(f"not a duration: {d!r}")
    return sum(float(n) * units[u] for n, u in parts)


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_binary(PROMTOOL), *args], capture_output=True, text=True, timeout=60,
                          cwd=PROMETHEUS_DIR)


def _alert_tests() -> dict[str, dict[str, Any]]:
    return {f.stem: yaml.safe_load(f.read_text()) for f in sorted(TESTS_DIR.glob("*.yml"))
            if f.stem not in NON_ALERT_TEST_FILES}


ALERTS = {r["alert"]: r for r in alert_rules()}


def test_promtool_check_rules_clean() -> None:
    files = sorted(str(p) for p in (PROMETHEUS_DIR / "rules").glob("*.yml"))
    assert files, "no rule files"
    res = _promtool("check", "rules", *files)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "WARNING" not in res.stdout + res.stderr


def test_promtool_check_config_clean() -> None:
    res = _promtool("check", "config", str(PROMETHEUS_DIR / "prometheus.yml"))
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_unit_tests_pass() -> None:
    files = sorted(str(p) for p in TESTS_DIR.glob("*.yml"))
    res = _promtool("test", "rules", *files)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("SUCCESS") == len(files), res.stdout


def test_required_alerts_exist() -> None:
    required = {"FailSlowDetected", "FailSlowPersisting", "RankStraggler", "LinkCongestionSuspected",
                "GPUClockDegraded", "TrainingStalled", "ExporterDown", "DetectorDown", "ShimRecordsDropped",
                "RemediationFailing", "RemediatorDown"}
    assert required <= set(ALERTS), f"missing alerts: {sorted(required - set(ALERTS))}"
    assert any("Throttl" in a for a in ALERTS), "no thermal/power throttling alert"


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_alert_labels_and_annotations(name: str) -> None:
    rule = ALERTS[name]
    labels, ann = rule.get("labels", {}), rule.get("annotations", {})
    assert labels.get("severity") in {"critical", "warning"}, f"{name}: severity must be critical or warning"
    assert labels.get("remediate", "true") == "true", f"{name}: remediate is 'true' or absent"
    assert ann.get("summary"), f"{name}: summary"
    assert ann.get("description"), f"{name}: description"
    assert ann.get("runbook_url") == f"{RUNBOOK_BASE}{name}.md", f"{name}: runbook_url"
    desc = ann["description"]
    if name not in HEALTH_ALERTS:
        assert "$value" in desc or "query" in desc, f"{name}: description should state the measured value"
    if name in RANK_ALERTS:
        for coord in ("$labels.rank", "$labels.dp_rank", "$labels.pp_rank", "$labels.job"):
            assert coord in desc, f"{name}: description should name {coord}"


def test_remediable_alerts() -> None:
    remediable = {n for n, r in ALERTS.items() if r.get("labels", {}).get("remediate") == "true"}
    assert {"FailSlowDetected", "RankStraggler"} <= remediable
    # Paging alerts are for humans; the remediator must not act on a hang or on its own failure.
    assert "TrainingStalled" not in remediable and "FailSlowPersisting" not in remediable
    assert not {"RemediationFailing", "RemediatorDown"} & remediable


def test_alerts_tests_runbooks_one_to_one() -> None:
    tests = set(_alert_tests())
    runbooks = {p.stem for p in RUNBOOKS_DIR.glob("*.md") if p.stem != "README"}
    assert set(ALERTS) == tests, f"alerts without tests: {sorted(set(ALERTS) - tests)}; " \
                                 f"tests without alerts: {sorted(tests - set(ALERTS))}"
    assert set(ALERTS) == runbooks, f"alerts without runbooks: {sorted(set(ALERTS) - runbooks)}; " \
                                    f"runbooks without alerts: {sorted(runbooks - set(ALERTS))}"


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_each_alert_tested_both_ways(name: str) -> None:
    """Its test file checks only this alert, has a silent-only case, and shows `for:` holding it back."""
    spec = _alert_tests().get(name)
    assert spec is not None, f"prometheus/tests/{name}.yml missing"
    hold = _seconds(ALERTS[name].get("for", "0s"))
    fired_after_for = silent_group = False
    for group in spec["tests"]:
        cases = group.get("alert_rule_test", [])
        assert cases, f"{name}: group {group['name']!r} has no alert_rule_test"
        assert {c["alertname"] for c in cases} == {name}, f"{name}.yml must test only {name}"
        if all(not c.get("exp_alerts") for c in cases):
            silent_group = True
        quiet = [_seconds(c["eval_time"]) for c in cases if not c.get("exp_alerts")]
        for c in cases:
            if c.get("exp_alerts"):
                t = _seconds(c["eval_time"])
                # silent at some point within the `for:` window just before it fires
                if any(t - hold <= q < t for q in quiet):
                    fired_after_for = True
    assert silent_group, f"{name}: needs a case where it must stay silent (jitter, spikes, checkpoints)"
    assert fired_after_for, f"{name}: needs a case that is silent within `for:` before it fires"


@pytest.mark.parametrize("name", sorted(n for n, r in ALERTS.items() if _seconds(r.get("for", "0s")) > 0))
def test_unit_tests_catch_a_missing_for(name: str, tmp_path: Path) -> None:
    """Mutation check: the same unit tests fail when the alert loses its `for:` (the tests can fail)."""
    shutil.copytree(PROMETHEUS_DIR / "rules", tmp_path / "rules")
    shutil.copytree(TESTS_DIR, tmp_path / "tests")
    for f in (tmp_path / "rules").glob("*.yml"):
        doc = yaml.safe_load(f.read_text())
        for g in doc["groups"]:
            for r in g["rules"]:
                if r.get("alert") == name:
                    r.pop("for")
        f.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = subprocess.run([require_binary(PROMTOOL), "test", "rules", f"tests/{name}.yml"], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert res.returncode != 0, f"{name}: unit tests still pass without `for:`\n{res.stdout}"


def test_recording_rules_follow_naming_convention() -> None:
    names = [r["record"] for r in recording_rules()]
    assert names
    for n in names:
        assert re.fullmatch(r"[a-z_]+:[a-z_0-9]+:[a-z_0-9]+", n), f"{n}: not level:metric:operations"

"""Runbooks: one page per alert with Meaning, Impact, Diagnosis and Mitigation that say something concrete."""

from __future__ import annotations

import re

import pytest

from failslow_cli.stack.processes import RUNBOOKS_DIR, alert_rules

ALERTS = sorted(r["alert"] for r in alert_rules())
SECTIONS = ("Meaning", "Impact", "Diagnosis", "Mitigation")


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## +(.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


@pytest.mark.parametrize("name", ALERTS)
def test_runbook_structure(name: str) -> None:
    path = RUNBOOKS_DIR / f"{name}.md"
    assert path.exists(), f"runbooks/{name}.md missing"
    text = path.read_text()
    assert text.startswith(f"# {name}\n"), f"{path.name}: first line must be '# {name}'"
    secs = _sections(text)
    assert list(secs)[:4] == list(SECTIONS), f"{path.name}: sections {list(secs)} != {list(SECTIONS)}"
    for s in SECTIONS:
        assert len(secs[s].split()) >= 15, f"{path.name}: section {s} is too thin"
    diag, mitig = secs["Diagnosis"], secs["Mitigation"]
    assert "failslow — overview" in diag and "panel" in diag, f"{path.name}: Diagnosis must name a dashboard panel"
    assert "```promql" in diag, f"{path.name}: Diagnosis must give a PromQL query"
    assert "`" in diag.replace("```", ""), f"{path.name}: Diagnosis must give commands to run"
    assert "**Automatic:**" in mitig and "**Human:**" in mitig, f"{path.name}: Mitigation: automatic and human"


def test_runbook_index_lists_every_alert() -> None:
    index = (RUNBOOKS_DIR / "README.md").read_text()
    for name in ALERTS:
        assert f"[{name}]({name}.md)" in index, f"runbooks/README.md does not list {name}"

"""How deliveries change a job's event: pure, with literal alerts."""

from __future__ import annotations

import json
from typing import Any

from remediator.events import apply_alerts, suspect_of
from remediator.payload import Alert

T0 = "2026-11-25T10:00:00Z"
T1 = "2026-11-25T10:30:00Z"


def alert(fp: str, status: str = "firing", starts: str = T0, **labels: str) -> Alert:
    lab = {"alertname": "FailSlowDetected", "job": "llm", **labels}
    return Alert.model_validate_json(json.dumps({"status": status, "labels": lab, "startsAt": starts, "fingerprint": fp}))


def run(event: dict[str, Any] | None, alerts: list[Alert], seen: dict[str, Any] | None = None, now: float = 100.0):
    seen = dict(seen or {})
    ev, out, upd = apply_alerts(event, alerts, seen, now, "ev-new")
    seen.update(upd)
    return ev, out, seen


def test_first_firing_opens_an_event_with_its_suspect() -> None:
    ev, out, seen = run(None, [alert("a", kind="compute", rank="3", node="n1")])
    assert out == ["accepted"] and ev is not None
    assert ev["id"] == "ev-new" and ev["state"] == "open" and ev["firing"] and ev["job"] == "llm"
    assert ev["suspects"] == [{"kind": "compute", "rank": 3, "node": "n1"}]
    assert ev["labels"] == {"alertname": "FailSlowDetected", "job": "llm"}
    assert seen["a"]["status"] == "firing"


def test_suspects_of_a_group_merge_and_leave_one_by_one() -> None:
    ev, _, seen = run(None, [alert("a", kind="compute", rank="3"), alert("b", kind="link", node="n2")])
    assert [s["kind"] for s in ev["suspects"]] == ["compute", "link"]
    ev, out, seen = run(ev, [alert("b", "resolved", kind="link", node="n2")], seen)
    assert out == ["accepted"] and ev["firing"] and ev["suspects"] == [{"kind": "compute", "rank": 3, "node": ""}]
    ev, out, seen = run(ev, [alert("a", "resolved", kind="compute", rank="3")], seen, now=200.0)
    assert not ev["firing"] and ev["resolved_at"] == 200.0
    assert ev["suspects"] == [{"kind": "compute", "rank": 3, "node": ""}]  # kept for the record
    assert ev["state"] == "open"  # closing is the planner's call, once the pace is back


def test_a_firing_alert_that_names_nobody_leaves_the_named_suspects_standing() -> None:
    # the detector's suspect alert resolved (its event closed), then a new slowdown opened while its culprit
    # analysis waited (the split had just changed): the no-suspect alert fires in the same remediator event
    ev, _, seen = run(None, [alert("a", kind="compute", rank="1", node="1")])
    ev, _, seen = run(ev, [alert("a", "resolved", kind="compute", rank="1", node="1")], seen)
    ev, out, seen = run(ev, [alert("b")], seen, now=150.0)
    assert out == ["accepted"] and ev["firing"] and ev["state"] == "open"
    assert ev["suspects"] == [{"kind": "compute", "rank": 1, "node": "1"}]
    # a suspect named again replaces them; an event opened by a no-suspect alert has none
    ev, _, seen = run(ev, [alert("c", kind="link", node="2")], seen, now=160.0)
    assert ev["suspects"] == [{"kind": "link", "rank": None, "node": "2"}]
    ev2, _, _ = run(None, [alert("z")])
    assert ev2 is not None and ev2["suspects"] == []


def test_a_late_firing_after_its_resolved_is_stale_and_reopens_nothing() -> None:
    ev, _, seen = run(None, [alert("a", rank="1")])
    ev, _, seen = run(ev, [alert("a", "resolved", rank="1")], seen)
    ev2, out, _ = run(ev, [alert("a", rank="1")], seen)  # Alertmanager's firing, delivered after
    assert out == ["stale"] and ev2 is not None and not ev2["firing"]


def test_resolved_before_firing_then_the_firing_is_stale() -> None:
    ev, out, seen = run(None, [alert("a", "resolved")])
    assert ev is None and out == ["accepted"] and seen["a"]["status"] == "resolved"
    ev, out, _ = run(None, [alert("a")], seen)
    assert ev is None and out == ["stale"]


def test_a_new_instance_of_the_same_alert_opens_a_new_event_after_close() -> None:
    ev, _, seen = run(None, [alert("a")])
    closed = {**ev, "state": "closed"}
    ev2, out, _ = run(closed, [alert("a", starts=T1)], seen)
    assert out == ["accepted"] and ev2["id"] == "ev-new" and ev2["state"] == "open" and ev2 is not closed
    # an older instance is stale
    _, out, _ = run(None, [alert("a", starts="2026-11-25T09:00:00Z")], {"a": {"starts_at": 1e12, "status": "firing"}})
    assert out == ["stale"]


def test_rank_straggler_names_a_compute_suspect_and_job_wide_names_none() -> None:
    assert suspect_of({"alertname": "RankStraggler", "rank": "5", "node": "n2"}) == {"kind": "compute", "rank": 5, "node": "n2"}
    assert suspect_of({"alertname": "FailSlowDetected"}) is None
    assert suspect_of({"kind": "gpu"}) is None
    assert suspect_of({"kind": "link", "node": "n4", "rank": ""}) == {"kind": "link", "rank": None, "node": "n4"}

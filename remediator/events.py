"""How deliveries change a job's event (pure: documents in, documents out; tested with literals).

An event is one fail-slow episode of one job: it opens on the first firing remediable alert of the job and
collects the suspects of every alert of the episode. Its suspects are those the firing alerts name; when the
firing alerts name none, the ones named before stand: the detector exports no suspect while its culprit
analysis waits (the split or placement changed in the last 30 s, as the remediator's own actions do) and
keeps its own suspects then, and its no-suspect alert must not leave the event without the culprit it
named minutes before. Once nothing fires, the last suspects stay for the record.

Alertmanager delivers at least once, repeats while an alert fires, may deliver a group's firing notification
after its resolved one, and an HA pair delivers everything twice; the store has already dropped exact
repeats (same fingerprint|startsAt|status) before :func:`apply_alerts` runs. What is left to decide here is
order: each fingerprint's latest known instance (its startsAt and status) is kept, and an alert older than
that is stale — in particular a firing that arrives after the resolved of the same instance never reopens
anything.

A resolved notification only marks the event not firing; closing it is the planner's call, once the job's
pace is confirmed back.
"""

from __future__ import annotations

from typing import Any

from remediator.payload import Alert

EVENT_FIELDS_FROM_ALERTS = ("alerts", "suspects", "firing", "resolved_at", "labels", "last_delivery_at")


def suspect_of(labels: dict[str, str]) -> dict[str, Any] | None:
    """The suspect an alert names (FailSlowDetected: kind/rank/node; RankStraggler: rank/node), if any."""
    kind = labels.get("kind", "")
    rank = labels.get("rank", "")
    node = labels.get("node", "")
    if not kind:
        if not rank:
            return None  # job-wide: the slowdown has no named culprit (yet)
        kind = "compute"
    if kind not in ("compute", "link"):
        return None
    return {"kind": kind, "rank": int(rank) if rank.isdigit() else None, "node": node}


def new_event(event_id: str, job: str, alert: Alert, now: float) -> dict[str, Any]:
    """A fresh open event for `job`, opened by `alert` at `now`."""
    labels = {k: v for k, v in alert.labels.items() if k not in ("kind", "rank", "node", "dp_rank", "pp_rank",
                                                                   "tp_rank")}
    return {
        "id": event_id, "job": job, "state": "open", "opened_at": now, "onset": alert.starts_at_s,
        "onset_source": "alert", "first_delivery_at": now, "last_delivery_at": now, "firing": True,
        "resolved_at": None, "closed_at": None, "close_reason": None, "alerts": {}, "suspects": [],
        "labels": labels, "manual": False, "level": 1, "lost_s": 0.0, "spent_s": 0.0, "last_tick": None,
        "pace_s": None, "healthy_s": None, "ratio": None, "validated": None, "actions": [],
        "last_decision": None, "info": None, "adapter": None,
    }


def _suspects(alerts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for a in alerts.values():  # in the order the alerts first arrived
        if a["status"] != "firing":
            continue
        s = suspect_of(a["labels"])
        if s is not None and s not in out:
            out.append(s)
    return out


def apply_alerts(event: dict[str, Any] | None, alerts: list[Alert], seen: dict[str, dict[str, Any]],
                 now: float, new_id: str) -> tuple[dict[str, Any] | None, list[str], dict[str, dict[str, Any]]]:
    """Apply new (not yet seen) alerts of one job to its open event.

    Args:
        event: The job's open event, or None.
        alerts: Alerts of one delivery for this job whose fingerprint|startsAt|status was not seen before.
        seen: Latest known instance per fingerprint: ``{"starts_at": float, "status": str}``.
        now: Receipt time.
        new_id: The id to give an event this delivery opens.

    Returns:
        (the event to store or None when nothing changed and there is none, one outcome per alert —
        ``accepted`` or ``stale`` —, the updated ``seen`` entries to store).
    """
    outcomes: list[str] = []
    updates: dict[str, dict[str, Any]] = {}
    ev = None if event is None else {**event, "alerts": dict(event.get("alerts") or {})}
    for a in alerts:
        last = updates.get(a.fingerprint) or seen.get(a.fingerprint)
        t = a.starts_at_s
        if last is not None and (last["starts_at"] > t or (last["starts_at"] == t and last["status"] == "resolved")):
            outcomes.append("stale")
            continue
        updates[a.fingerprint] = {"starts_at": t, "status": a.status}
        if a.status == "firing":
            if ev is None or ev.get("state") != "open":
                ev = new_event(new_id, a.labels.get("job", ""), a, now)
            ev["alerts"][a.fingerprint] = {"status": "firing", "starts_at": t, "labels": dict(a.labels),
                                           "alertname": a.labels.get("alertname", "")}
            ev["onset"] = min(float(ev["onset"]), t) if ev.get("onset_source") == "alert" else ev["onset"]
            ev["firing"], ev["resolved_at"] = True, None
        elif ev is not None:
            cur = ev["alerts"].get(a.fingerprint)
            if cur is not None and cur["starts_at"] == t:
                ev["alerts"][a.fingerprint] = {**cur, "status": "resolved"}
            if ev["alerts"] and all(x["status"] == "resolved" for x in ev["alerts"].values()) and ev["firing"]:
                ev["firing"], ev["resolved_at"] = False, now
        outcomes.append("accepted")
    if ev is not None:
        ev["last_delivery_at"] = now
        firing = _suspects(ev["alerts"])
        if firing:
            ev["suspects"] = firing  # firing alerts that name nobody leave the named ones standing
    return ev, outcomes, updates

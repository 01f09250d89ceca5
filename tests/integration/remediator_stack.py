"""Alertmanager payloads for the remediator tests (the synthetic jobs' Prometheus is in failslow_cli.stack)."""

from __future__ import annotations

import json
from typing import Any

from failslow_cli.stack.fake_cluster import JobSeries, fake_cluster_prometheus, wait_for_series

__all__ = ["JobSeries", "body", "fake_cluster_prometheus", "get_json", "notification", "wait_for_series"]


def notification(job: str, alerts: list[dict[str, Any]], status: str | None = None) -> dict[str, Any]:
    """An Alertmanager v4 payload for `alerts` ({fp, status, starts, labels})."""
    out = []
    for a in alerts:
        out.append({"status": a.get("status", "firing"),
                    "labels": {"alertname": "FailSlowDetected", "job": job, "severity": "warning", "remediate": "true",
                               **a.get("labels", {})},
                    "annotations": {"summary": "slow"}, "startsAt": a.get("starts", "2026-11-25T10:00:00Z"),
                    "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prom/graph", "fingerprint": a["fp"]})
    st = status or ("firing" if any(a["status"] == "firing" for a in out) else "resolved")
    return {"version": "4", "groupKey": f'{{}}/{{remediate="true"}}:{{alertname="FailSlowDetected", job="{job}"}}',
            "truncatedAlerts": 0, "status": st, "receiver": "remediator",
            "groupLabels": {"alertname": "FailSlowDetected", "job": job},
            "commonLabels": {"alertname": "FailSlowDetected", "job": job}, "commonAnnotations": {},
            "externalURL": "http://am:9093", "alerts": out}


def body(job: str, alerts: list[dict[str, Any]]) -> bytes:
    """The payload as bytes."""
    return json.dumps(notification(job, alerts)).encode()


def get_json(url: str, path: str, token: str) -> Any:
    """GET `url + path` from a remediator with the bearer token; the decoded JSON."""
    import requests

    return requests.get(url + path, headers={"Authorization": f"Bearer {token}"}, timeout=10).json()


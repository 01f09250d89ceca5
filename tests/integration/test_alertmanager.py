"""Alertmanager as code: amtool checks, route tests, and the real binary routing, inhibiting and authenticating."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from failslow_cli.stack.processes import (
    ALERTMANAGER_DIR,
    AMTOOL,
    alertmanager,
    free_port,
    render_alertmanager,
    require_binary,
)

CONFIG = ALERTMANAGER_DIR / "alertmanager.yml"


def _amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_binary(AMTOOL), *args], capture_output=True, text=True, timeout=60)


def test_amtool_check_config_clean() -> None:
    res = _amtool("check-config", str(CONFIG))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


ROUTES = [
    # (labels, receivers in order)
    ({"alertname": "FailSlowDetected", "job": "llm", "severity": "warning", "remediate": "true"},
     "remediator,ticket"),
    ({"alertname": "RankStraggler", "job": "llm", "severity": "warning", "remediate": "true", "rank": "3"},
     "remediator,ticket"),
    ({"alertname": "FailSlowPersisting", "job": "llm", "severity": "critical"}, "pager"),
    ({"alertname": "TrainingStalled", "job": "llm", "severity": "critical"}, "pager"),
    ({"alertname": "GPUClockDegraded", "node": "n1", "gpu": "0", "severity": "warning"}, "ticket"),
    ({"alertname": "ExporterDown", "job": "failslow-exporter", "severity": "warning"}, "ticket"),
    # a hypothetical critical remediable alert reaches both the remediator and the pager
    ({"alertname": "X", "job": "llm", "severity": "critical", "remediate": "true"}, "remediator,pager"),
    # unlabelled alerts fall through to the default receiver
    ({"alertname": "Unknown"}, "ticket"),
]


@pytest.mark.parametrize(("labels", "receivers"), ROUTES, ids=[r[0]["alertname"] for r in ROUTES])
def test_amtool_routes(labels: dict[str, str], receivers: str) -> None:
    args = [f"{k}={v}" for k, v in labels.items()]
    res = _amtool("config", "routes", "test", f"--config.file={CONFIG}", f"--verify.receivers={receivers}", *args)
    assert res.returncode == 0, f"{labels} -> {res.stdout.strip()} (want {receivers})\n{res.stderr}"
    # and the check is not vacuous: a wrong expectation fails
    bad = _amtool("config", "routes", "test", f"--config.file={CONFIG}", "--verify.receivers=nobody", *args)
    assert bad.returncode != 0


class _Receiver:
    """A real HTTP server standing in for the remediator: records every webhook POST."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, str | None, dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.posts.append((self.path, self.headers.get("Authorization"), json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    r = _Receiver()
    yield r
    r.close()


def _alert(labels: dict[str, str], *, ends_in_s: float = 600) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {"labels": labels, "annotations": {"summary": "test"},
            "startsAt": (now - timedelta(seconds=1)).isoformat(),
            "endsAt": (now + timedelta(seconds=ends_in_s)).isoformat()}


def test_real_alertmanager_routes_inhibits_and_authenticates(tmp_path: Path, receiver: _Receiver) -> None:
    """The shipped config in a real Alertmanager: webhook gets remediable alerts with the bearer token;
    TrainingStalled mutes the slowdown alerts of its job; FailSlowDetected mutes RankStraggler of its job."""
    token = "s3cret-token"
    cfg = render_alertmanager(tmp_path, remediator_url=f"http://127.0.0.1:{receiver.port}/api/v1/alerts",
                              token=token)
    with alertmanager(cfg, free_port()) as am:
        alerts = [
            # job a: the detector's verdict and the rule-based fallback -> only FailSlowDetected delivered
            {"alertname": "FailSlowDetected", "job": "a", "severity": "warning", "remediate": "true",
             "kind": "compute", "rank": "3"},
            {"alertname": "RankStraggler", "job": "a", "severity": "warning", "remediate": "true", "rank": "3"},
            # job b: no detector verdict -> RankStraggler delivered
            {"alertname": "RankStraggler", "job": "b", "severity": "warning", "remediate": "true", "rank": "1"},
            # job c: hung -> its FailSlowDetected and RankStraggler are muted, TrainingStalled pages
            {"alertname": "TrainingStalled", "job": "c", "severity": "critical"},
            {"alertname": "FailSlowDetected", "job": "c", "severity": "warning", "remediate": "true"},
            {"alertname": "RankStraggler", "job": "c", "severity": "warning", "remediate": "true", "rank": "0"},
        ]
        r = requests.post(f"{am.url}/api/v2/alerts", json=[_alert(a) for a in alerts], timeout=5)
        assert r.status_code == 200, r.text

        def delivered() -> set[tuple[str, str]]:
            return {(a["labels"]["alertname"], a["labels"]["job"]) for _p, _a, b in receiver.posts
                    for a in b["alerts"]}

        want = {("FailSlowDetected", "a"), ("RankStraggler", "b")}
        deadline = time.monotonic() + 60  # remediator route group_wait is 5s (more only under heavy load)
        while time.monotonic() < deadline and not want <= delivered():
            time.sleep(0.2)
        time.sleep(1.0)  # anything inhibited would have arrived in the same flush
        assert delivered() == want

        for path, auth, body in receiver.posts:
            assert path == "/api/v1/alerts"
            assert auth == f"Bearer {token}"
            assert body["receiver"] == "remediator"
            assert body["status"] == "firing"
            assert set(body["groupLabels"]) == {"alertname", "job"}

        state = requests.get(f"{am.url}/api/v2/alerts", timeout=5).json()
        inhibited = {(a["labels"]["alertname"], a["labels"]["job"]) for a in state if a["status"]["inhibitedBy"]}
        assert inhibited == {("RankStraggler", "a"), ("FailSlowDetected", "c"), ("RankStraggler", "c")}
        receivers = {(a["labels"]["alertname"], a["labels"]["job"]): sorted(x["name"] for x in a["receivers"])
                     for a in state}
        assert receivers[("TrainingStalled", "c")] == ["pager"]
        assert receivers[("FailSlowDetected", "a")] == ["remediator", "ticket"]

"""The remediator's HTTP API against a real Redis (and, for planning, a real Prometheus): auth, a fuzz corpus of
malformed payloads refused with nothing stored, dedupe across replicas, the manual trigger, approvals,
Redis going away, and the planner acting through the fake adapter.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from failslow_cli.stack.processes import free_port, redis_server
from remediator.app import TokenFile, create_app
from remediator.config import parse_config
from remediator.service import build_service
from remediator.settings import Settings
from tests.integration.polling import wait_for
from tests.integration.remediator_stack import (
    JobSeries,
    body,
    fake_cluster_prometheus,
    notification,
    wait_for_series,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FIRING = [{"fp": "f1", "status": "firing", "labels": {"kind": "compute", "rank": "2", "node": "n2"}}]


class Env:
    """A Redis, a token file and a way to make remediator apps (replicas) on them."""

    def __init__(self, tmp: Path, redis_url: str, prom_url: str = "http://127.0.0.1:9") -> None:
        self.tmp, self.redis_url, self.prom_url = tmp, redis_url, prom_url
        self.token = tmp / "token"
        self.token.write_text(TOKEN)
        self.record = tmp / "executed.jsonl"
        self.r = redis.Redis.from_url(redis_url)

    def settings(self, *, mode: str = "auto", replica: str = "r1", **kw: Any) -> Settings:
        return Settings(redis_url=self.redis_url, token_file=str(self.token), prometheus_url=self.prom_url,
                        mode=mode, tick_s=0.3, replica=replica, lock_lease_s=3.0, **kw)

    def app(self, *, mode: str = "auto", replica: str = "r1", config: dict[str, Any] | None = None,
            **kw: Any) -> TestClient:
        s = self.settings(mode=mode, replica=replica, **kw)
        cfg = parse_config(config or {"jobs": [{"match": "llm.*", "adapter": "fake",
                                                "options": {"record": str(self.record)}}]})
        return TestClient(create_app(build_service(s, cfg), s, TokenFile(self.token)))

    def stored(self) -> tuple[int, int]:
        """(keys in Redis, audit entries)."""
        return int(self.r.dbsize()), int(self.r.xlen("failslow:remediator:audit") or 0)

    def executed(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.record.read_text().splitlines()] if self.record.exists() else []


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    with redis_server(tmp_path / "redis", free_port(), persist=True) as r:
        yield Env(tmp_path, r.url)


def test_every_post_needs_the_token_and_reads_are_closed_by_default(env: Env) -> None:
    with env.app() as c:
        for path in ("/api/v1/alerts", "/remediate", "/actions/act-x/approve", "/actions/act-x/reject"):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic " + TOKEN}):
                r = c.post(path, content=body("llm1", FIRING), headers=headers)
                assert r.status_code == 401, (path, headers, r.text)
                assert r.headers["www-authenticate"] == "Bearer"
        for path in ("/events", "/actions", "/audit", "/events/x", "/actions/x"):
            assert c.get(path).status_code == 401
        assert c.get("/").status_code == 401 and "token" in c.get("/").text
        assert c.get("/healthz").status_code == 200 and c.get("/metrics").status_code == 200
        assert c.get("/events", headers=AUTH).json() == []
        assert env.stored()[0] == 0  # nothing stored by any of it
        metrics = c.get("/metrics").text
        assert 'failslow_remediator_deliveries_total{outcome="unauthorized"} 3.0' in metrics
    with env.app(open_reads=True) as c:
        assert c.get("/events").status_code == 200 and c.get("/").status_code == 200
        assert c.post("/api/v1/alerts", content=body("llm1", FIRING)).status_code == 401


def test_the_token_file_is_reread_when_rotated(env: Env) -> None:
    with env.app() as c:
        assert c.post("/api/v1/alerts", content=body("llm1", FIRING), headers=AUTH).status_code == 200
        time.sleep(0.02)
        env.token.write_text("rotated")
        import os
        os.utime(env.token, (time.time() + 5, time.time() + 5))  # a new mtime even on coarse clocks
        assert c.post("/api/v1/alerts", content=body("llm1", FIRING), headers=AUTH).status_code == 401
        assert c.post("/api/v1/alerts", content=body("llm1", FIRING),
                      headers={"Authorization": "Bearer rotated"}).status_code == 200


def _good() -> dict[str, Any]:
    return notification("llm1", FIRING)


def _with(path: list[Any], value: Any) -> bytes:
    doc: Any = _good()
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    if value is KeyError:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return json.dumps(doc).encode()


CORPUS: list[tuple[str, bytes]] = [
    ("empty", b""),
    ("not json", b"hello"),
    ("truncated", json.dumps(_good()).encode()[:57]),
    ("null", b"null"),
    ("array", b"[]"),
    ("number", b"4"),
    ("nested garbage", b'{"version": "4", "alerts": [[[[[[[[[[[]]]]]]]]]]]}'),
    ("version 5", _with(["version"], "5")),
    ("version int", _with(["version"], 4)),
    ("no version", _with(["version"], KeyError)),
    ("bad status", _with(["status"], "exploded")),
    ("alerts missing", _with(["alerts"], KeyError)),
    ("alerts empty", _with(["alerts"], [])),
    ("alerts dict", _with(["alerts"], {"a": 1})),
    ("alert not object", _with(["alerts", 0], "firing")),
    ("labels list", _with(["alerts", 0, "labels"], ["job"])),
    ("label value int", _with(["alerts", 0, "labels", "rank"], 2)),
    ("label value null", _with(["alerts", 0, "labels", "job"], None)),
    ("no fingerprint", _with(["alerts", 0, "fingerprint"], KeyError)),
    ("empty fingerprint", _with(["alerts", 0, "fingerprint"], "")),
    ("fingerprint int", _with(["alerts", 0, "fingerprint"], 123)),
    ("startsAt garbage", _with(["alerts", 0, "startsAt"], "yesterday")),
    ("startsAt number", _with(["alerts", 0, "startsAt"], 1700000000)),
    ("alert status", _with(["alerts", 0, "status"], "pending")),
    ("truncatedAlerts negative", _with(["truncatedAlerts"], -1)),
    ("truncatedAlerts string", _with(["truncatedAlerts"], "0")),
    ("groupLabels list", _with(["groupLabels"], [])),
    ("huge label", _with(["alerts", 0, "labels", "x"], "y" * 20000)),
    ("too many alerts", json.dumps({**_good(), "alerts": _good()["alerts"] * 1001}).encode()),
    ("invalid utf-8", b'{"version": "4", "status": "firing", "alerts": "\xff\xfe"}'),
]


@pytest.mark.parametrize("name, raw", CORPUS, ids=[n for n, _ in CORPUS])
def test_malformed_payloads_get_a_4xx_and_nothing_is_stored(env: Env, name: str, raw: bytes) -> None:
    with env.app() as c:
        before = env.stored()
        r = c.post("/api/v1/alerts", content=raw, headers={**AUTH, "Content-Type": "application/json"})
        assert 400 <= r.status_code < 500, (name, r.status_code, r.text[:300])
        assert env.stored() == before, name


def test_huge_bodies_are_refused_before_they_are_read(env: Env) -> None:
    with env.app(max_body_bytes=64 * 1024) as c:
        before = env.stored()
        big = json.dumps({**_good(), "pad": "x" * 200_000}).encode()
        assert c.post("/api/v1/alerts", content=big, headers=AUTH).status_code == 413

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted while streaming
            for _ in range(100):
                yield b" " * 4096

        assert c.post("/api/v1/alerts", content=chunks(), headers=AUTH).status_code == 413
        assert env.stored() == before
        assert c.post("/api/v1/alerts", json={**_good(), "newField": {"from": "a later Alertmanager"}},
                      headers=AUTH).status_code == 200  # unknown fields are ignored, not refused


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
                    max_leaves=20))
def test_random_json_is_never_a_server_error(env: Env, doc: Any) -> None:
    with env.app(mode="dry-run") as c:
        r = c.post("/api/v1/alerts", content=json.dumps(doc).encode(), headers=AUTH)
        assert r.status_code in (200, 422), r.text[:300]


def test_deliveries_dedupe_across_repeats_replicas_and_order(env: Env) -> None:
    with env.app(mode="dry-run", replica="a") as a, env.app(mode="dry-run", replica="b") as b:
        r1 = a.post("/api/v1/alerts", content=body("llm1", FIRING), headers=AUTH).json()
        assert r1["outcome"] == "accepted" and len(r1["events"]) == 1
        # the HA twin delivers the same notification to the other replica; a repeat_interval later, again
        assert b.post("/api/v1/alerts", content=body("llm1", FIRING), headers=AUTH).json()["outcome"] == "duplicate"
        assert a.post("/api/v1/alerts", content=body("llm1", FIRING), headers=AUTH).json()["outcome"] == "duplicate"
        # a new suspect joins the group: accepted into the same event
        more = [*FIRING, {"fp": "f2", "status": "firing", "labels": {"kind": "compute", "rank": "3"}}]
        r2 = b.post("/api/v1/alerts", content=body("llm1", more), headers=AUTH).json()
        assert r2["alerts"] == ["duplicate", "accepted"] and r2["events"] == r1["events"]
        ev = a.get(f"/events/{r1['events'][0]}", headers=AUTH).json()
        assert [s["rank"] for s in ev["suspects"]] == [2, 3] and ev["state"] == "open"
        # resolved before firing (another job): the late firing is stale and opens nothing
        late = [{"fp": "g1", "status": "resolved", "labels": {"kind": "compute", "rank": "1"}}]
        assert a.post("/api/v1/alerts", content=body("llm2", late), headers=AUTH).json()["outcome"] == "accepted"
        again = [{"fp": "g1", "status": "firing", "labels": {"kind": "compute", "rank": "1"}}]
        assert b.post("/api/v1/alerts", content=body("llm2", again), headers=AUTH).json()["outcome"] == "stale"
        events = a.get("/events", headers=AUTH).json()
        assert [e["job"] for e in events] == ["llm1"]
        for e in events:  # the contract's fields
            assert {"id", "job", "state", "onset", "suspects", "level"} <= set(e)
        audit = a.get("/audit", headers=AUTH, params={"job": "llm1"}).json()
        kinds = [x["kind"] for x in audit]
        assert kinds.count("delivery") == 4  # every delivery, duplicates included, is in the audit
        assert {x["replica"] for x in audit if x["kind"] == "delivery"} == {"a", "b"}


def test_the_audit_stream_is_trimmed_to_about_its_cap(env: Env) -> None:
    with env.app(mode="dry-run", audit_max_entries=100) as a:
        for i in range(600):  # repeats take the one-round-trip path, new alerts the transaction; both trim
            fp = f"f{i // 3}"
            a.post("/api/v1/alerts", content=body("llm1", [{"fp": fp, "status": "firing"}]), headers=AUTH)
        n = env.stored()[1]
        # approximate trimming (MAXLEN ~) drops whole stream nodes: at most one node (100 entries) over the cap
        assert 100 <= n <= 200, n
        newest = a.get("/audit", headers=AUTH, params={"limit": 1}).json()[0]
        assert newest["kind"] == "delivery" and newest["data"]["alerts"][0]["fingerprint"] == "f199"


def test_redis_away_is_a_503_and_the_retry_is_stored(tmp_path: Path) -> None:
    port = free_port()
    rdir = tmp_path / "redis"
    with redis_server(rdir, port, persist=True) as r:
        env = Env(tmp_path, r.url)
        c = env.app(mode="dry-run")
        c.__enter__()
        assert c.post("/api/v1/alerts", content=body("llm1", FIRING), headers=AUTH).status_code == 200
    try:
        # Redis is down now
        resp = c.post("/api/v1/alerts", content=body("llm1", [{**FIRING[0], "fp": "f9"}]), headers=AUTH)
        assert resp.status_code == 503 and resp.headers["retry-after"]
        assert c.get("/healthz").status_code == 503
        assert 'failslow_remediator_redis_up 0.0' in c.get("/metrics").text
        assert 'outcome="unavailable"} 1.0' in c.get("/metrics").text
        with redis_server(rdir, port, persist=True):
            # Alertmanager retries: now it is stored, and what was stored before the restart is still there
            resp = c.post("/api/v1/alerts", content=body("llm1", [{**FIRING[0], "fp": "f9"}]), headers=AUTH)
            assert resp.status_code == 200 and resp.json()["outcome"] == "accepted"
            assert c.get("/healthz").status_code == 200
            evs = c.get("/events", headers=AUTH).json()
            assert len(evs) == 1 and len(evs[0]["suspects"]) == 1
            assert c.post("/api/v1/alerts", content=body("llm1", FIRING), headers=AUTH).json()["outcome"] == "duplicate"
    finally:
        c.__exit__(None, None, None)


def test_the_webhook_is_served_before_fastapi_and_everything_else_by_it(env: Env, monkeypatch) -> None:
    # POST /api/v1/alerts goes straight to its handler (the hot path); other methods and paths are FastAPI's,
    # which still documents the route; a handler that fails answers 500 (Alertmanager retries) and says so
    s = env.settings(mode="dry-run")
    svc = build_service(s, parse_config({"jobs": []}))
    with TestClient(create_app(svc, s, TokenFile(env.token))) as c:
        assert c.post("/api/v1/alerts", content=body("llm1", FIRING), headers=AUTH).json()["outcome"] == "accepted"
        assert c.get("/api/v1/alerts", headers=AUTH).status_code == 405
        assert c.post("/api/v1/alerts/", content=body("llm1", FIRING), headers=AUTH,
                      follow_redirects=False).status_code == 307
        assert "/api/v1/alerts" in c.get("/openapi.json").json()["paths"]
        assert c.get("/healthz").status_code == 200

        async def broken(note: Any) -> dict[str, Any]:
            raise RuntimeError("boom")

        monkeypatch.setattr(svc, "ingest", broken)
        resp = c.post("/api/v1/alerts", content=body("llm1", FIRING), headers=AUTH)
        assert resp.status_code == 500 and resp.json() == {"detail": "internal error"}


def test_manual_remediate_plans_acts_once_and_retries_safely(env: Env) -> None:
    with env.app(mode="auto", config={"jobs": [{"match": "llm.*", "adapter": "fake",
                                                "options": {"record": str(env.record), "delay_s": 2.0}}],
                                       "policy": {"approval": []}}) as c:
        req = {"job": "llm7", "suspects": [{"kind": "compute", "rank": 1, "node": "node1"}], "action": "restart",
               "reason": "node1 throttles"}
        r = c.post("/remediate", json=req, headers={**AUTH, "Idempotency-Key": "k1"})
        assert r.status_code == 202, r.text
        doc = r.json()
        action = doc["action"]
        assert action["strategy"] == "restart" and action["params"]["exclude_nodes"] == ["node1"]
        assert action["state"] == "running" and doc["plan"]["strategy"] == "restart"
        # a double-click while it runs: 409 with the running action's id
        r2 = c.post("/remediate", json=req, headers=AUTH)
        assert r2.status_code == 409 and r2.json()["action_id"] == action["id"]
        # a retrying script with the same key gets the same action back
        r3 = c.post("/remediate", json=req, headers={**AUTH, "Idempotency-Key": "k1"})
        assert r3.status_code == 202 and r3.json()["action"]["id"] == action["id"]
        done = wait_for(lambda: (c.get(f"/actions/{action['id']}", headers=AUTH).json()["state"] == "succeeded"),
                        20, "the action to finish", every=0.1)
        assert done
        assert [e["id"] for e in env.executed()] == [action["id"]]  # executed once
        acts = c.get("/actions", headers=AUTH).json()
        for a in acts:
            assert {"id", "event_id", "job", "strategy", "state", "created_at", "predicted", "measured"} <= set(a)
        # bad input: 422 (pydantic), an unknown job's adapter: 422 with the plan
        assert c.post("/remediate", json={"job": "llm7", "action": "reboot"}, headers=AUTH).status_code == 422
        assert c.post("/remediate", json={"jobs": "llm7"}, headers=AUTH).status_code == 422
        r4 = c.post("/remediate", json={"job": "other", "action": "restart",
                                        "suspects": [{"kind": "link", "node": "n1"}]}, headers=AUTH)
        assert r4.status_code == 422 and "no adapter" in r4.json()["detail"]
        assert c.post("/remediate", json=req, headers={**AUTH, "Idempotency-Key": ""}).status_code == 400


def test_restart_waits_for_approval_reject_and_approve(env: Env) -> None:
    with env.app(mode="auto") as c:
        req = {"job": "llm8", "suspects": [{"kind": "link", "node": "node0"}], "action": "restart"}
        a1 = c.post("/remediate", json=req, headers=AUTH).json()["action"]
        assert a1["state"] == "pending_approval" and a1["needs_approval"]
        assert c.post("/remediate", json=req, headers=AUTH).status_code == 409  # pending counts as in flight
        assert c.post(f"/actions/{a1['id']}/reject", headers=AUTH).json()["state"] == "rejected"
        assert c.post(f"/actions/{a1['id']}/approve", headers=AUTH).status_code == 409
        assert c.post("/actions/act-nope/approve", headers=AUTH).status_code == 404
        a2 = c.post("/remediate", json=req, headers=AUTH).json()["action"]
        assert a2["id"] != a1["id"] and a2["state"] == "pending_approval"
        # the status page has the buttons; its form post approves and comes back to the page
        c.cookies.set("failslow_remediator_token", TOKEN)
        page = c.get("/").text
        assert f'/actions/{a2["id"]}/approve' in page and "Pending approvals (1)" in page
        r = c.post(f"/actions/{a2['id']}/approve", headers={"Content-Type": "application/x-www-form-urlencoded"},
                   follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/"
        c.cookies.clear()
        wait_for(lambda: c.get(f"/actions/{a2['id']}", headers=AUTH).json()["state"] == "succeeded", 10,
                 "approved run", every=0.1)
        assert [e["id"] for e in env.executed()] == [a2["id"]]
        got = c.get(f"/actions/{a2['id']}", headers=AUTH).json()
        assert got["approval"]["approved"] and got["approval"]["by"] == "status page"
        # a manual request may carry its own approval
        req2 = {**req, "job": "llm9", "approve": True}
        assert c.post("/remediate", json=req2, headers=AUTH).json()["action"]["state"] in ("running", "succeeded")


@contextlib.contextmanager
def two_slow_jobs(tmp_path: Path) -> Iterator[Env]:
    """A Redis and a real Prometheus scraping jobs llm1 and llm2, each with DP replica 1's first stage 3x slower."""
    with redis_server(tmp_path / "redis", free_port(), persist=True) as r, \
            fake_cluster_prometheus(tmp_path / "prom") as (prom_url, cluster):
        slow = JobSeries({(0, 0): 0.10, (0, 1): 0.10, (1, 0): 0.30, (1, 1): 0.10}, [4, 4],
                         onset_ts=time.time() - 300, healthy_s=0.55)
        for job in ("llm1", "llm2"):
            cluster.set(job, slow)
        wait_for_series(prom_url, "llm2")
        yield Env(tmp_path, r.url, prom_url)


def test_an_adapters_expected_cost_sits_between_the_defaults_and_the_config(tmp_path: Path) -> None:
    with two_slow_jobs(tmp_path) as env:
        rule = {"match": "llm.*", "adapter": "fake",
                "options": {"record": str(env.record), "expected_costs": {"rebalance": 0.5, "restart": 1.0}}}
        for job, config, cost in (("llm1", {"jobs": [rule]}, 0.5),  # the adapter's, over the default 2 s
                                  ("llm2", {"jobs": [rule], "costs": {"rebalance": 1.5}}, 1.5)):  # the config's
            with env.app(mode="dry-run", config=config, replica=job) as c:
                c.post("/api/v1/alerts", content=body(job, [{**FIRING[0], "fp": f"f-{job}"}]), headers=AUTH)
                plan = wait_for(lambda c=c, job=job: [a for a in c.get("/actions", headers=AUTH).json()
                                                      if a["job"] == job], 30, "a dry-run plan", every=0.1)[0]
                assert plan["strategy"] == "rebalance" and plan["predicted"]["cost_s"] == cost
                ev = c.get(f"/events/{plan['event_id']}", headers=AUTH).json()
                assert ev["info"]["costs"] == {"rebalance": 0.5, "restart": 1.0}
        assert env.executed() == []


def test_the_planner_rebalances_a_slow_replica_from_real_prometheus_data(tmp_path: Path) -> None:
    with two_slow_jobs(tmp_path) as env:
        cfg = {"jobs": [{"match": "llm.*", "adapter": "fake", "options": {"record": str(env.record)}}],
               "costs": {"rebalance": 2.0}}
        # dry-run: the plan is made and audited, nothing is executed
        with env.app(mode="dry-run", config=cfg, replica="dry") as c:
            c.post("/api/v1/alerts", content=body("llm2", [{**FIRING[0], "fp": "f-llm2"}]), headers=AUTH)
            plan = wait_for(lambda: [a for a in c.get("/actions", headers=AUTH).json() if a["job"] == "llm2"], 30,
                            "a dry-run plan", every=0.1)[0]
            assert plan["dry_run"] and plan["state"] == "planned" and plan["strategy"] == "rebalance"
            assert env.executed() == []
        with env.app(mode="auto", config=cfg, replica="auto") as c:
            t0 = time.time()
            c.post("/api/v1/alerts", content=body("llm1", FIRING), headers=AUTH)
            try:
                act = wait_for(lambda: [a for a in c.get("/actions", headers=AUTH).json()
                                        if a["job"] == "llm1" and a["state"] == "succeeded"], 30, "the rebalance",
                               every=0.1)[0]
            except AssertionError:
                raise AssertionError(json.dumps([c.get("/events", headers=AUTH).json(),
                                                 c.get("/actions", headers=AUTH).json()], indent=1)) from None
            assert act["strategy"] == "rebalance" and act["params"]["counts"] == [6, 2]
            assert act["predicted"]["pace_s"] < act["predicted"]["pace_before_s"]
            assert act["decision_latency_s"] is not None and act["started_at"] - t0 < 10
            assert [e["id"] for e in env.executed() if e["job"] == "llm1"] == [act["id"]]
            audit = c.get("/audit", headers=AUTH, params={"job": "llm1"}).json()
            assert any(x["kind"] == "decision" and x["data"]["strategy"] == "rebalance" for x in audit)
            ev = c.get(f"/events/{act['event_id']}", headers=AUTH).json()
            assert ev["level"] == 2 and ev["healthy_s"] and ev["lost_s"] > 0
            # llm1's split and, switched to auto, the one planned dry for llm2
            wait_for(lambda: len([e for e in env.executed() if e["strategy"] == "rebalance"]) == 2, 20,
                     "llm2's split", every=0.1)
            metrics = c.get("/metrics").text
            assert 'failslow_remediator_actions_total{result="succeeded",strategy="rebalance"} 2.0' in metrics
            assert 'failslow_remediator_decision_latency_seconds_count{strategy="rebalance"} 2.0' in metrics


def test_an_action_is_judged_once_the_exporters_window_holds_iterations_after_it(tmp_path: Path) -> None:
    # Readings are means over the exporters' last `exporter_window_iterations` iterations (4 here, so 5 with
    # the one the split applied in); the job runs 1.35 s iterations and the cooldown is 0.5 s. The split is
    # judged only once the ranks' iteration counters moved 5 past their first scrape after it: >= 5.4 s
    # (4 whole iterations) after it ended, not at the cooldown; the planner says why it waits meanwhile.
    with two_slow_jobs(tmp_path) as env:
        cfg = {"jobs": [{"match": "llm.*", "adapter": "fake", "options": {"record": str(env.record)}}],
               "policy": {"cooldown_s": 0.5}}
        with env.app(mode="auto", config=cfg, exporter_window_iterations=4) as c:
            c.post("/api/v1/alerts", content=body("llm1", FIRING), headers=AUTH)
            judged = wait_for(lambda: [a for a in c.get("/actions", headers=AUTH).json() if a["job"] == "llm1"
                                       and (a.get("measured") or {}).get("judged_at")], 60, "the judgement",
                              every=0.1)[0]
            assert judged["strategy"] == "rebalance" and judged["params"]["counts"] == [6, 2]
            waited = judged["measured"]["judged_at"] - judged["ended_at"]
            assert 4 * 1.35 <= waited <= 6 * 1.35 + 4.0, waited
            audit = c.get("/audit", headers=AUTH, params={"job": "llm1"}).json()
            why = [x["data"]["reason"] for x in audit if x["kind"] == "decision"
                   and str(x["data"].get("reason", "")).startswith("settling: ")]
            assert why and why[0].endswith("of 5 iterations reported since the last action"), why


def _first_action(tmp: Path, redis_url: str, prom_url: str, counts: list[int], **settings: Any
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Alert on llm1 to an auto remediator (the fake adapter, job split `counts`); its first succeeded action
    and the event. `exporter_window_iterations=0` in `settings`: the fake cluster's readings are per iteration,
    clean at once after a change."""
    env = Env(tmp, redis_url, prom_url)
    cfg = {"jobs": [{"match": "llm.*", "adapter": "fake",
                     "options": {"record": str(env.record), "microbatches": counts}}]}
    with env.app(mode="auto", config=cfg, **settings) as c:
        c.post("/api/v1/alerts", content=body("llm1", FIRING), headers=AUTH)
        act = wait_for(lambda: [a for a in c.get("/actions", headers=AUTH).json()
                                if a["job"] == "llm1" and a["state"] == "succeeded"], 30, "the first action",
                       every=0.1)[0]
        return act, c.get(f"/events/{act['event_id']}", headers=AUTH).json()


def test_replicas_left_waiting_by_the_straggler_are_priced_at_their_healthy_speed(tmp_path: Path) -> None:
    # healthy: both replicas 0.10 s per micro-batch (8 each, F 0.05 s); the fault: replica 1 2x slower and
    # replica 0, waiting for it, reading 10% faster than healthy (as the testbed's quota devices and a shared
    # host do). The split is priced with replica 0 at 0.10 s, the healthy stage time read from Prometheus just
    # before the onset: [11, 5] takes 0.05 + 11 * 0.10 s, not 0.05 + 5 * 0.20 s as the waiting replica suggests.
    with redis_server(tmp_path / "redis", free_port(), persist=True) as r, \
            fake_cluster_prometheus(tmp_path / "prom") as (prom_url, cluster):
        cluster.set("llm1", JobSeries({(0, 0): 0.10, (1, 0): 0.10}, [8, 8], healthy_s=0.85))
        wait_for_series(prom_url, "llm1")
        time.sleep(8.0)  # a healthy stretch longer than the 5 s before the onset the calibration reads
        onset = time.time()
        cluster.set("llm1", JobSeries({(0, 0): 0.09, (1, 0): 0.20}, [8, 8], onset_ts=onset, healthy_s=0.85))
        time.sleep(3.0)  # the fault scraped
        act, _ev = _first_action(tmp_path, r.url, prom_url, [8, 8])
        assert act["strategy"] == "rebalance" and act["params"]["counts"] == [11, 5]
        assert act["predicted"]["pace_s"] == pytest.approx(0.05 + 11 * 0.10)
        assert act["predicted"]["pace_before_s"] == pytest.approx(0.05 + 8 * 0.20)
        # the action keeps the cells it was priced on: replica 0 floored at its healthy 0.10 s
        assert act["predicted"]["model_per_mb_s"] == [[pytest.approx(0.10)], [pytest.approx(0.20)]]
        assert act["predicted"]["model_overhead_s"] == pytest.approx(0.05)
        assert act["predicted"]["model_counts"] == [8, 8]


def test_the_healthy_calibration_is_not_moved_by_the_exporters_first_readings(tmp_path: Path) -> None:
    # The first readings of a job can be unlike the rest (an exporter once read part of the iteration for 20
    # of them). Here: 3 s of readings an eighth of the healthy job's (0.10 s per micro-batch, 8 each, F
    # 0.05 s), then 12 s healthy, then replica 1 2x slower. The calibration window holds all of them: each
    # rank's median there is the healthy 0.10 s, so F stays 0.05 s and [11, 5] is priced 0.05 + 11 * 0.10 s
    # (their mean, 0.068 s, left F at 0.30 s).
    with redis_server(tmp_path / "redis", free_port(), persist=True) as r, \
            fake_cluster_prometheus(tmp_path / "prom") as (prom_url, cluster):
        cluster.set("llm1", JobSeries({(0, 0): 0.10 / 8, (1, 0): 0.10 / 8}, [8, 8], healthy_s=0.85))
        wait_for_series(prom_url, "llm1")
        time.sleep(3.0)
        cluster.set("llm1", JobSeries({(0, 0): 0.10, (1, 0): 0.10}, [8, 8], healthy_s=0.85))
        time.sleep(12.0)
        onset = time.time()
        cluster.set("llm1", JobSeries({(0, 0): 0.10, (1, 0): 0.20}, [8, 8], onset_ts=onset, healthy_s=0.85))
        time.sleep(3.0)  # the fault scraped
        act, ev = _first_action(tmp_path, r.url, prom_url, [8, 8])
        assert ev["healthy_stage_s"] == [pytest.approx(0.10)]
        assert ev["overhead_s"] == pytest.approx(0.05)
        assert act["strategy"] == "rebalance" and act["params"]["counts"] == [11, 5]
        assert act["predicted"]["pace_s"] == pytest.approx(0.05 + 11 * 0.10)


def test_the_work_outside_the_pipeline_stays_with_its_replica_whatever_its_split(tmp_path: Path) -> None:
    # DP2xPP2, 4 micro-batches a replica at 0.10 s each and a 0.05 s optimizer step on every rank, exposed as
    # the compute outside the pipeline (a first stage's with one micro-batch in it). The fault slows replica
    # 1's first stage 2.5x, its step 2x. The model takes the steps out of the cells and the split [6, 2] is
    # priced with replica 1's 0.10 s step whole: 0.05 + 6 * 0.10 + 0.10 + 0.05 s (spread over micro-batches
    # as in the compute gauge alone, the cells read 0.1125 and 0.275 s and the same split 0.825 s).
    cells = {(0, 0): 0.10, (0, 1): 0.10, (1, 0): 0.10, (1, 1): 0.10}
    steps = dict.fromkeys(cells, 0.05)
    with redis_server(tmp_path / "redis", free_port(), persist=True) as r, \
            fake_cluster_prometheus(tmp_path / "prom") as (prom_url, cluster):
        cluster.set("llm1", JobSeries(cells, [4, 4], healthy_s=0.60, step=steps))
        wait_for_series(prom_url, "llm1")
        time.sleep(8.0)  # a healthy stretch longer than the 5 s before the onset the calibration reads
        onset = time.time()
        cluster.set("llm1", JobSeries({**cells, (1, 0): 0.25}, [4, 4], onset_ts=onset, healthy_s=0.60,
                                      step={**steps, (1, 0): 0.10}))
        time.sleep(3.0)  # the fault scraped
        act, ev = _first_action(tmp_path, r.url, prom_url, [4, 4])
        assert act["strategy"] == "rebalance" and act["params"]["counts"] == [6, 2]
        assert act["predicted"]["model_per_mb_s"] == [[pytest.approx(0.10)] * 2, [pytest.approx(0.25),
                                                                                  pytest.approx(0.10)]]
        assert act["predicted"]["model_step_s"] == [[pytest.approx(0.05)] * 2, [pytest.approx(0.10),
                                                                                pytest.approx(0.05)]]
        assert act["predicted"]["pace_before_s"] == pytest.approx(0.05 + 3 * 0.25 + 0.35 + 0.10)
        assert act["predicted"]["pace_s"] == pytest.approx(0.05 + 6 * 0.10 + 0.10 + 0.05)
        assert ev["healthy_step_s"] == pytest.approx(0.05) and ev["overhead_s"] == pytest.approx(0.05)


def _replicas(cluster: Any, per_mb: list[float], counts: list[int], onset: float | None = None) -> None:
    """llm1 as a DP job of one stage: replica d at per_mb[d] s per micro-batch (healthy 0.85 s)."""
    cluster.set("llm1", JobSeries({(d, 0): t for d, t in enumerate(per_mb)}, counts, onset_ts=onset, healthy_s=0.85))


def test_the_overhead_is_calibrated_on_the_healthy_replicas_when_the_onset_trails_the_fault(tmp_path: Path) -> None:
    # healthy: three replicas at 0.10 s per micro-batch, F 0.05 s; replica 1 turns 2x slower 6 s before the
    # onset the detector reports, so the readings 5 s before the onset already hold it. F from the slowest
    # replica there would be 0 (0.85 - 1.60 s) and every split priced 0.05 s too fast; the median replica
    # leaves F at 0.05 s: the best split takes 0.05 + 1.00 s (10 * 0.10 s against 5 * 0.20 s, or 4 * 0.20 s).
    act, ev = _first_action_after(tmp_path, [([0.10, 0.20, 0.10], 9.0)], healthy_s=10.0, onset_delay_s=6.0)
    assert act["strategy"] == "rebalance" and sum(act["params"]["counts"]) == 24
    assert ev["overhead_s"] == pytest.approx(0.05)
    assert act["predicted"]["pace_s"] == pytest.approx(0.05 + 1.00)


def _first_action_after(tmp: Path, steps: list[tuple[list[float], float]], healthy_s: float = 8.0,
                        onset_delay_s: float = 0.0) -> tuple[dict[str, Any], dict[str, Any]]:
    """llm1 as three replicas of 8 micro-batches at 0.10 s each, healthy for `healthy_s`, then each step's
    speeds for its seconds, the detector's onset `onset_delay_s` after the first step; the first action of an
    auto remediator alerted after the last step, and its event."""
    with redis_server(tmp / "redis", free_port(), persist=True) as r, \
            fake_cluster_prometheus(tmp / "prom") as (prom_url, cluster):
        even = [8, 8, 8]
        _replicas(cluster, [0.10, 0.10, 0.10], even)
        wait_for_series(prom_url, "llm1")
        time.sleep(healthy_s)
        onset = time.time() + onset_delay_s
        for per_mb, seconds in steps:
            _replicas(cluster, per_mb, even, onset)
            time.sleep(seconds)
        return _first_action(tmp, r.url, prom_url, even, exporter_window_iterations=0)


def test_a_momentary_dip_in_one_straggler_reading_does_not_set_the_split(tmp_path: Path) -> None:
    # healthy: three replicas at 0.10 s per micro-batch; the fault: replicas 0 and 1 at 0.20 s for 15 s, then
    # replica 0's newest readings dip to 0.14 s just before the alert (a swing the next iterations do not keep;
    # replica 1 still paces the job). Priced on the newest readings alone the split is [8, 5, 11] (checked with
    # compute_average_s=0), which takes 0.05 + 8 * 0.20 s once replica 0 is back at 0.20 s: no faster than
    # before the split. Averaged over the event (about 0.19 s) the two slowed replicas are split alike.
    # (2.5 s: two or three scrapes of the dip)
    act, _ev = _first_action_after(tmp_path, [([0.20, 0.20, 0.10], 15.0), ([0.14, 0.20, 0.10], 2.5)])
    assert act["strategy"] == "rebalance" and act["params"]["counts"] == [6, 6, 12]
    assert act["predicted"]["pace_s"] == pytest.approx(0.05 + 6 * 0.20)
    assert act["predicted"]["compute_window_s"] >= 15.0  # onset to the alert: 17.5 s


def test_a_straggler_that_recovered_inside_the_window_is_priced_at_its_newest_speed(tmp_path: Path) -> None:
    # healthy: three replicas at 0.10 s per micro-batch; replica 1 at 0.30 s for 14 s, then at 0.15 s for 12 s
    # before the alert. Its mean over the event (about 0.24 s) prices the split [10, 4, 10], which takes
    # 0.05 + 1.00 s at 0.15 s (checked with compute_shift=10); its last 10 s, half of its earlier mean, stand
    # for it: [9, 6, 9] takes 0.05 + 0.90 s.
    act, _ev = _first_action_after(tmp_path, [([0.10, 0.30, 0.10], 14.0), ([0.10, 0.15, 0.10], 12.0)])
    assert act["strategy"] == "rebalance" and act["params"]["counts"] == [9, 6, 9]
    assert act["predicted"]["pace_s"] == pytest.approx(0.05 + 0.90)
    assert act["predicted"]["compute_changed_ranks"] == [1]


def test_a_resolved_alert_with_the_straggler_back_restores_the_jobs_own_split(tmp_path: Path) -> None:
    # healthy: two replicas of 8 micro-batches at 0.10 s (0.85 s); replica 1 turns 3x slower and the split
    # [12, 4] takes 1.25 s. The straggler recovers as the split lands and the alert resolves: at even speeds
    # [12, 4] still takes 1.25 s, 1.47x healthy, so the pace is never confirmed back while the split stays.
    # The remediator goes back to [8, 8] without waiting for the confirmation to time out (120 s here).
    with redis_server(tmp_path / "redis", free_port(), persist=True) as r, \
            fake_cluster_prometheus(tmp_path / "prom") as (prom_url, cluster):
        _replicas(cluster, [0.10, 0.10], [8, 8])
        wait_for_series(prom_url, "llm1")
        time.sleep(8.0)
        _replicas(cluster, [0.10, 0.30], [8, 8], time.time())
        time.sleep(3.0)
        env = Env(tmp_path, r.url, prom_url)
        cfg = {"jobs": [{"match": "llm.*", "adapter": "fake", "options": {"record": str(env.record),
                                                                        "microbatches": [8, 8]}}],
               "policy": {"cooldown_s": 5}}
        # two iterations of exporter lag: the readings scraped before the series below follow the split are
        # left out of the compute average
        with env.app(mode="auto", config=cfg, exporter_window_iterations=2, confirm_timeout_s=120) as c:
            c.post("/api/v1/alerts", content=body("llm1", FIRING), headers=AUTH)

            def succeeded() -> list[dict[str, Any]]:
                return sorted((a for a in c.get("/actions", headers=AUTH).json() if a["state"] == "succeeded"),
                              key=lambda a: a["created_at"])

            first = wait_for(succeeded, 30, "the split", every=0.1)[0]
            assert first["params"]["counts"] == [12, 4]
            _replicas(cluster, [0.10, 0.10], [12, 4])
            resolved = [{**FIRING[0], "status": "resolved"}]
            assert c.post("/api/v1/alerts", content=body("llm1", resolved), headers=AUTH).status_code == 200
            back = wait_for(lambda: succeeded()[1:], 40, "the way back to the job's own split")[0]
            assert back["params"] == {"counts": [8, 8], "from": [12, 4], "restore": True}
            assert "alert resolved" in back["reason"] and back["predicted"]["pace_s"] == pytest.approx(0.85)
            _replicas(cluster, [0.10, 0.10], [8, 8])
            ev = wait_for(lambda: (e := c.get(f"/events/{first['event_id']}", headers=AUTH).json())["state"]
                          == "closed" and e, 30, "the event to close")
            assert "confirmed back" in ev["close_reason"]
            assert [e["params"]["counts"] for e in env.executed()] == [[12, 4], [8, 8]]

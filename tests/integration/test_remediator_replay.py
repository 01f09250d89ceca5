"""At-least-once delivery against two real remediator replicas: 1,000 deliveries (repeats, reorderings, both
members of an Alertmanager HA pair, resolved before firing) and zero double actions; then a replica killed
with SIGKILL in the middle of an action and Redis restarted mid-event: nothing lost, nothing repeated.

Everything is real: two `failslow remediator` processes on one Redis (append-only file), a Prometheus
scraping the jobs' series, the fake adapter recording every execution to a file shared by both processes
(the evidence of what was done).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from failslow_cli.stack.processes import free_port, redis_server, start_remediator, stop_process
from tests.integration.polling import wait_for
from tests.integration.remediator_stack import (
    JobSeries,
    fake_cluster_prometheus,
    get_json,
    notification,
    wait_for_series,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

TOKEN = "replay-token"
JOBS = [f"llm{i}" for i in range(8)]
DELIVERIES = 1000
T0, T1 = "2026-11-25T10:00:00Z", "2026-11-25T10:05:00Z"


def _deliveries(rng: random.Random) -> list[dict[str, Any]]:
    """DELIVERIES notifications: each job's main suspect keeps firing; side suspects fire and resolve, some of
    them resolved before their firing arrives; every notification is later sent by both HA members, and many
    are repeats (repeat_interval)."""
    notes: list[dict[str, Any]] = []
    while len(notes) < DELIVERIES:
        job = rng.choice(JOBS)
        alerts = [{"fp": f"{job}-main", "status": "firing", "labels": {"kind": "compute", "rank": "2", "node": "n2"}}]
        for k in range(rng.randint(0, 3)):
            fp = f"{job}-side{k}"
            if k == 2:  # this one's resolved is delivered before its firing, and a later instance fires again
                alerts.append({"fp": fp, "status": rng.choice(["resolved", "firing"]), "starts": T0,
                               "labels": {"kind": "compute", "rank": "3"}})
                if rng.random() < 0.3:
                    alerts.append({"fp": fp + "b", "status": "firing", "starts": T1, "labels": {"kind": "compute",
                                                                                             "rank": "3"}})
            else:
                alerts.append({"fp": fp, "status": rng.choice(["firing", "resolved"]), "starts": T0,
                               "labels": {"kind": "compute", "rank": str(k)}})
        notes.append(notification(job, alerts))
    return notes


def _post(url: str, doc: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    for _ in range(50):  # Alertmanager's retry on 5xx
        r = requests.post(f"{url}/api/v1/alerts", json=doc, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        if r.status_code < 500:
            return r.status_code, r.json()
        time.sleep(0.2)
    return r.status_code, {}


def _executed(record: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in record.read_text().splitlines()] if record.exists() else []


def _get(url: str, path: str) -> Any:
    return get_json(url, path, TOKEN)


def test_replayed_deliveries_kill_and_redis_restart(tmp_path: Path) -> None:
    rport, pa, pb = free_port(), free_port(), free_port()
    record = tmp_path / "executed.jsonl"
    cfg = {"jobs": [{"match": "llm.*", "adapter": "fake", "options": {"record": str(record), "delay_s": 0.2}},
                    {"match": "slow.*", "adapter": "fake", "options": {"record": str(record), "delay_s": 12.0}}],
           "policy": {"cooldown_s": 3600, "approval": []}}
    env = {"FAILSLOW_REMEDIATOR_TICK_S": "0.5", "FAILSLOW_REMEDIATOR_LOCK_LEASE_S": "3"}
    rdir = tmp_path / "redis"
    procs: list[Any] = []
    with fake_cluster_prometheus(tmp_path / "prom") as (prom_url, cluster):
        for job in [*JOBS, "slow0"]:
            cluster.set(job, JobSeries({(0, 0): 0.1, (0, 1): 0.1, (1, 0): 0.3, (1, 1): 0.1}, [4, 4],
                                       onset_ts=time.time() - 600, healthy_s=0.55))
        wait_for_series(prom_url, "slow0")
        redis_cm = redis_server(rdir, rport, persist=True)
        redis = redis_cm.__enter__()
        try:
            a = start_remediator(tmp_path / "a", pa, redis_url=redis.url, prometheus_url=prom_url, token=TOKEN,
                                 config=cfg, mode="auto", replica="a", env=env)
            b = start_remediator(tmp_path / "b", pb, redis_url=redis.url, prometheus_url=prom_url, token=TOKEN,
                                 config=cfg, mode="auto", replica="b", env=env)
            procs += [a.proc, b.proc]

            # --- 1,000 deliveries, each sent by both HA members, in a shuffled order, concurrently
            rng = random.Random(20261125)
            notes = _deliveries(rng)
            sends = [(u, n) for n in notes for u in (a.url, b.url)]
            rng.shuffle(sends)
            with ThreadPoolExecutor(8) as pool:
                results = list(pool.map(lambda s: _post(*s), sends))
            assert all(code == 200 for code, _ in results), Counter(code for code, _ in results)
            per_alert = Counter(o for _, doc in results for o in doc["alerts"])
            sent_keys = {(al["fingerprint"], al["startsAt"], al["status"]) for n in notes for al in n["alerts"]}
            # every distinct delivery key stored once (accepted or, out of order, stale), all else duplicates
            assert per_alert["accepted"] + per_alert["stale"] == len(sent_keys), per_alert
            assert per_alert["duplicate"] == sum(len(n["alerts"]) for n in notes) * 2 - len(sent_keys)

            # --- each job gets exactly one rebalance, executed once, whichever replica plans it
            def all_rebalanced() -> bool:
                done = [x for x in _get(a.url, "/actions?limit=1000") if x["state"] == "succeeded"]
                return {x["job"] for x in done} >= set(JOBS)

            wait_for(all_rebalanced, 90, "a rebalance for every job", every=0.3)
            time.sleep(3)  # ticks of both replicas after it: nothing more may happen
            execs = _executed(record)
            assert Counter(e["job"] for e in execs) == Counter({j: 1 for j in JOBS}), execs
            assert len({e["id"] for e in execs}) == len(execs)
            assert all(e["strategy"] == "rebalance" and e["params"]["counts"] == [6, 2] for e in execs)
            events = _get(a.url, "/events?limit=1000")
            assert sorted(e["job"] for e in events) == sorted(JOBS)  # one event per job, all open
            assert all(e["state"] == "open" and e["firing"] for e in events)
            audit = _get(a.url, "/audit?limit=10000")
            assert sum(1 for x in audit if x["kind"] == "delivery") == len(sends)  # every delivery audited
            planners = {x["replica"] for x in audit if x["kind"] == "action" and x["data"].get("what") == "created"}
            assert planners <= {"a", "b"}

            # --- kill -9 the replica running an action; the other recovers it after the lease, never reruns it
            r = requests.post(f"{a.url}/remediate", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30,
                              json={"job": "slow0", "action": "restart", "approve": True,
                                    "suspects": [{"kind": "compute", "rank": 2, "node": "node0"}]})
            assert r.status_code == 202, r.text
            slow = r.json()["action"]
            assert slow["state"] == "running"
            wait_for(lambda: any(e["id"] == slow["id"] for e in _executed(record)), 10, "the slow action to start",
                     every=0.3)
            stop_process(a.proc, kill=True)
            done = wait_for(lambda: (x := _get(b.url, f"/actions/{slow['id']}"))["state"] != "running" and x, 60,
                            "the killed replica's action to be recovered", every=0.3)
            assert done["state"] == "succeeded" and done["recovered_by"] == "b", done
            assert "recovered" in done["outcome"]["detail"]
            assert [e["id"] for e in _executed(record)].count(slow["id"]) == 1

            # --- Redis restarts mid-event: nothing lost; while it is away deliveries get 503, then succeed
            before = (_get(b.url, "/events?limit=1000"), _get(b.url, "/actions?limit=1000"),
                      len(_get(b.url, "/audit?limit=10000")))
            redis_cm.__exit__(None, None, None)
            redis_cm = None
            r = requests.post(f"{b.url}/api/v1/alerts", json=notes[0], headers={"Authorization": f"Bearer {TOKEN}"},
                              timeout=30)
            assert r.status_code == 503
            redis_cm = redis_server(rdir, rport, persist=True)
            redis_cm.__enter__()
            after = wait_for(lambda: (_get(b.url, "/events?limit=1000"), _get(b.url, "/actions?limit=1000"),
                                      len(_get(b.url, "/audit?limit=10000"))), 30, "the API back", every=0.3,
                             ignore=(requests.RequestException, ValueError, TypeError))
            assert after[0] == before[0] or _same_ids(after[0], before[0])
            assert _same_ids(after[1], before[1]) and after[2] >= before[2]
            # a replay of everything after the restart: all duplicates, no action
            again = [_post(b.url, n) for n in notes[:100]]
            assert all(o in ("duplicate", "stale") for _, doc in again for o in doc["alerts"]), again[:3]

            # --- the killed replica comes back: it repeats nothing
            a2 = start_remediator(tmp_path / "a", pa, redis_url=redis.url, prometheus_url=prom_url, token=TOKEN,
                                  config=cfg, mode="auto", replica="a", env=env)
            procs.append(a2.proc)
            time.sleep(4)
            execs = _executed(record)
            assert len(execs) == len(JOBS) + 1 and len({e["id"] for e in execs}) == len(execs), execs
        finally:
            for p in procs:
                stop_process(p)
            if redis_cm is not None:
                redis_cm.__exit__(None, None, None)


def _same_ids(x: list[dict[str, Any]], y: list[dict[str, Any]]) -> bool:
    return sorted(d["id"] for d in x) == sorted(d["id"] for d in y)

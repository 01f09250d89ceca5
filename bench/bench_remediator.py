"""Remediator: webhook handling under load against a bare FastAPI echo, and the decision latency of the loop.

1. Webhook handling (issue target: <= 5 ms median at 1,000 deliveries/s on one core). The remediator runs as
   a process pinned to CPU 0 (`taskset -c 0`), dry-run, on a real Redis; an open-loop load generator on the
   other CPU sends Alertmanager v4 notifications at a fixed rate over keep-alive connections and times each
   from the moment it was due (so queueing behind a slow server counts, no coordinated omission). The mix is
   what a remediator sees: mostly repeats (Alertmanager's repeat_interval, the HA twin), a steady trickle
   of new alerts and resolutions that open and change events, which wakes the planner (it queries a real
   Prometheus serving the jobs' series). Every delivery is parsed, deduped in its Redis transaction and
   audited; nothing is acted on. Peer, same machine, same run, same load: a bare FastAPI endpoint under
   the same uvicorn, pinned the same, that parses the JSON and echoes it back.
2. Decision latency (reported, no target): one real closed loop (failslow_cli/stack/loop.py: testbed job,
   CPU fault, exporter, Prometheus, detector, Alertmanager, remediator in auto mode): from the delivery that
   opened the event to the adapter call, with the fault -> alert time, the action's duration, and the
   prediction beside the measured iteration time.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import requests

TITLE = "Remediator: webhook handling under load, decision latency of the loop"
RATE = 1000.0  # deliveries per second
DURATION_S = 15.0
WARMUP_S = 3.0
JOBS = 50
NEW_SHARE = 0.02  # share of deliveries that carry a new alert instance (a new event, a resolution)
CONNECTIONS = 64
TOKEN = "bench-token"

ECHO_APP = """
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
app = FastAPI()
@app.post("/api/v1/alerts")
async def alerts(request: Request):
    return JSONResponse(await request.json())
"""


def _payloads(rng: random.Random, n: int) -> list[bytes]:
    """n notifications: repeats of JOBS firing groups, with NEW_SHARE new instances and resolutions."""
    out: list[bytes] = []
    gen = dict.fromkeys(range(JOBS), 0)
    for _ in range(n):
        j = rng.randrange(JOBS)
        status = "firing"
        if rng.random() < NEW_SHARE:
            if rng.random() < 0.5:
                gen[j] += 1  # a new instance of the job's alert: a new event once the old one is resolved
            else:
                status = "resolved"
        starts = f"2026-11-25T10:{gen[j] % 60:02d}:00Z"
        alerts = [{"status": status,
                   "labels": {"alertname": "FailSlowDetected", "job": f"bench{j}", "kind": "compute",
                              "rank": str(j % 4), "node": f"n{j % 4}", "severity": "warning", "remediate": "true"},
                   "annotations": {"summary": "slow", "description": "x" * 200},
                   "startsAt": starts, "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prom",
                   "fingerprint": f"{j:04x}{gen[j]:04x}"}]
        out.append(json.dumps({"version": "4", "groupKey": f"{{}}:{{job=\"bench{j}\"}}", "truncatedAlerts": 0,
                               "status": status, "receiver": "remediator",
                               "groupLabels": {"alertname": "FailSlowDetected", "job": f"bench{j}"},
                               "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://am",
                               "alerts": alerts}).encode())
    return out


async def _load(port: int, bodies: list[bytes], rate: float, duration_s: float) -> list[tuple[float, float, int]]:
    """Open-loop load: request i is due at t0 + i / rate; returns (due time, latency, status) per request."""
    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
    results: list[tuple[float, float, int]] = []

    async def worker() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while True:
            item = await queue.get()
            if item is None:
                break
            due, body = item
            writer.write(b"POST /api/v1/alerts HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                         b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
            status = int((await reader.readline()).split()[1])
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            results.append((due, time.perf_counter() - due, status))
        writer.close()

    workers = [asyncio.create_task(worker()) for _ in range(CONNECTIONS)]
    t0 = time.perf_counter() + 0.2
    n = int(rate * duration_s)
    for i in range(n):
        due = t0 + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        queue.put_nowait((due, bodies[i % len(bodies)]))
    for _ in workers:
        queue.put_nowait(None)
    await asyncio.gather(*workers)
    return [(d - t0, lat, st) for d, lat, st in results]


def _serve(argv: list[str], port: int, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    from failslow_cli.stack.processes import start_process, wait_http

    proc = start_process(["taskset", "-c", "0", *argv], log, env)
    wait_http(f"http://127.0.0.1:{port}/docs", proc, log, 60)
    return proc


def _measure(port: int, bodies: list[bytes]) -> dict[str, float]:
    res = asyncio.run(_load(port, bodies, RATE, DURATION_S))
    lat = sorted(x[1] * 1000 for x in res if x[0] >= WARMUP_S)
    ok = sum(1 for x in res if x[2] == 200)
    span = max(x[0] for x in res) - min(x[0] for x in res)
    q = statistics.quantiles(lat, n=100)
    return {"n": len(res), "ok": ok, "p50": q[49], "p90": q[89], "p99": q[98], "max": lat[-1],
            "rate": len(res) / span if span else 0.0}


def _webhook(tmp: Path) -> tuple[dict[str, float], dict[str, float], dict[str, Any]]:
    from failslow_cli.stack.fake_cluster import JobSeries, fake_cluster_prometheus
    from failslow_cli.stack.processes import free_port, redis_server, stop_process

    os.sched_setaffinity(0, {1})  # the load generator (and Redis, Prometheus it starts) on the other CPU
    rng = random.Random(7)
    bodies = _payloads(rng, int(RATE * DURATION_S))
    token = tmp / "token"
    token.write_text(TOKEN)
    with redis_server(tmp / "redis", free_port(), persist=True) as redis, \
            fake_cluster_prometheus(tmp / "prom") as (prom_url, cluster):
        for j in range(JOBS):
            cluster.set(f"bench{j}", JobSeries({(0, 0): 0.1, (0, 1): 0.1, (1, 0): 0.3, (1, 1): 0.1}, [4, 4],
                                               onset_ts=time.time() - 300, healthy_s=0.55))
        port = free_port()
        cfg = tmp / "remediator.yml"
        cfg.write_text("jobs: []\n")
        rem = _serve([sys.executable, "-m", "remediator"], port, tmp / "remediator.log", env={
            "FAILSLOW_REMEDIATOR_PORT": str(port), "FAILSLOW_REMEDIATOR_REDIS_URL": redis.url,
            "FAILSLOW_REMEDIATOR_PROMETHEUS_URL": prom_url, "FAILSLOW_REMEDIATOR_TOKEN_FILE": str(token),
            "FAILSLOW_REMEDIATOR_CONFIG": str(cfg), "FAILSLOW_REMEDIATOR_MODE": "dry-run"})
        try:
            ours = _measure(port, bodies)
            metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            outcomes = {line.split('"')[1]: float(line.split()[-1]) for line in metrics.splitlines()
                        if line.startswith("failslow_remediator_deliveries_total{")}
            events = len(requests.get(f"http://127.0.0.1:{port}/events?limit=10000",
                                      headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30).json())
        finally:
            stop_process(rem)
        app = tmp / "echo_app.py"
        app.write_text(ECHO_APP)
        eport = free_port()
        echo = _serve([sys.executable, "-m", "uvicorn", "--app-dir", str(tmp), "echo_app:app", "--port", str(eport),
                       "--log-level", "warning", "--no-access-log"], eport, tmp / "echo.log")
        try:
            peer = _measure(eport, bodies)
        finally:
            stop_process(echo)
    return ours, peer, {"outcomes": outcomes, "events": events}


def _loop(tmp: Path) -> dict[str, Any]:
    from failslow_cli.stack.loop import run_loop

    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    res = run_loop(tmp, fault_s=110.0, max_s=420.0)
    s = res.state
    acts = sorted((a for a in s.actions if a["job"] == s.job and not a.get("dry_run")), key=lambda a: a["created_at"])
    first = acts[0] if acts else {}
    out: dict[str, Any] = {"summary": res.summary(), "times": res.times(), "actions": acts}
    if first:
        out["healthy"] = s.pace(s.t0 + 15.0, s.fault_start or time.time())
        out["slow"] = s.pace((s.fault_start or 0) + 20.0, float(first["started_at"]))
        out["mitigated"] = s.pace(float(first["ended_at"]) + 25.0, s.fault_end or time.time())
    return out


def run() -> str:
    """Measure; return the Markdown section."""
    with TemporaryDirectory(prefix="bench-remediator-") as d:
        ours, peer, seen = _webhook(Path(d))
    with TemporaryDirectory(prefix="bench-remediator-loop-") as d:
        loop = _loop(Path(d))

    def row(name: str, m: dict[str, float]) -> str:
        return (f"| {name} | {m['n']:,} | {m['ok']:,} | {m['rate']:.0f}/s | {m['p50']:.2f} ms | {m['p90']:.2f} ms | "
                f"{m['p99']:.2f} ms | {m['max']:.1f} ms |")

    oc = seen["outcomes"]
    lines = [
        "Command: `.venv/bin/python -m bench remediator`.",
        "",
        f"**Webhook handling** — {RATE:.0f} deliveries/s for {DURATION_S:.0f} s (first {WARMUP_S:.0f} s not "
        f"counted), open loop over {CONNECTIONS} keep-alive connections, each server pinned to CPU 0 "
        f"(`taskset -c 0`), load generator, Redis (append-only, fsync always) and Prometheus on CPU 1. Mix: "
        f"{JOBS} jobs' FailSlowDetected groups, {NEW_SHARE:.0%} of deliveries a new alert instance or a "
        f"resolution. The remediator ran dry-run with no job mapped to an adapter: every delivery parsed, "
        f"deduped on fingerprint|startsAt|status (a repeat in one scripted Redis round trip, anything new in "
        f"one transaction with its event), audited; new or changed "
        f"events wake the planner, which reads the job's pace from Prometheus. Outcomes: "
        f"{oc.get('accepted', 0):.0f} accepted, {oc.get('duplicate', 0):.0f} duplicate, {oc.get('stale', 0):.0f} "
        f"stale; {seen['events']} events. Peer: a bare FastAPI endpoint (parse the JSON, echo it) under the same "
        f"uvicorn, same pinning, same load.",
        "",
        "| server | requests | 200 | rate | p50 | p90 | p99 | max |",
        "|---|---|---|---|---|---|---|---|",
        row("remediator `POST /api/v1/alerts`", ours),
        row("peer: bare FastAPI echo", peer),
        "",
        f"Median ratio remediator / echo: **{ours['p50'] / peer['p50']:.2f}x**; p90 ratio "
        f"{ours['p90'] / peer['p90']:.2f}x. Target: median <= 5 ms at 1,000/s on one core "
        f"({'met' if ours['p50'] <= 5.0 else 'not met'}: {ours['p50']:.2f} ms).",
        "",
    ]
    t = loop.get("times") or {}
    first = (loop.get("actions") or [{}])[0]
    pred = first.get("predicted") or {}

    def f(x: Any, unit: str = " s", d: int = 2) -> str:
        return "n/a" if x is None else f"{float(x):.{d}f}{unit}"

    lines += [
        "**Decision latency in the real loop** — `run_loop` (DP2xPP2 testbed job, every rank a device of speed "
        "0.4, `cpu:rank=1,quota=0.12` after 40 s for 110 s, shipped configs, remediator in auto mode with the "
        "testbed adapter):",
        "",
        "| measurement | value |",
        "|---|---|",
        f"| fault → event opened at the remediator (detector + rules + Alertmanager) | {f(t.get('alert'), d=1)} |",
        f"| delivery that opened the event → adapter call (decision latency) | "
        f"{f(first.get('decision_latency_s'), d=3)} |",
        f"| adapter call → answer (the split applied from a near iteration) | "
        f"{f((first.get('measured') or {}).get('duration_s'), d=3)} |",
        f"| first action | {first.get('strategy', 'none')} {first.get('params', {}).get('counts', '')} "
        f"from {first.get('params', {}).get('from', '')} |",
        f"| iteration time healthy / with the fault / after the action (trainer's own) | "
        f"{f(loop.get('healthy'), d=3)} / {f(loop.get('slow'), d=3)} / {f(loop.get('mitigated'), d=3)} |",
        f"| predicted after the action (pace model) / error vs measured | {f(pred.get('pace_s'), d=3)} / "
        + (f"{(float(pred['pace_s']) - loop['mitigated']) / loop['mitigated']:+.1%}"
           if pred.get("pace_s") and loop.get("mitigated") else "n/a") + " |",
        "| slowdown reduced | " + (f"{(loop['slow'] - loop['mitigated']) / (loop['slow'] - loop['healthy']):.0%}"
                                    if loop.get("slow") and loop.get("mitigated") and loop.get("healthy") else "n/a")
        + " |",
        f"| fault removed → event closed (restore, resolve, pace confirmed) | "
        f"{f((t.get('event_closed') or 0) - (t.get('fault_end') or 0) if t.get('event_closed') else None, d=0)} |",
        f"| actions in the event | {', '.join(a['strategy'] + str(a['params'].get('counts', '')) for a in loop.get('actions') or [])} |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run())

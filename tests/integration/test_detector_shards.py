"""Two detector replicas share one Prometheus and one Redis: every job watched exactly once, and a restart resumes.

Real Prometheus, run from the shipped prometheus.yml and rules with both replicas in its detector target
file, scrapes a prometheus-client endpoint playing six DP2 x PP2 jobs (names with regex metacharacters, so
the replicas' job-regex queries must escape them) and both replicas, started as `failslow detector
--shards 2 --shard i` processes. A `hashmod` metric relabel rule added to the detector scrape job makes
Prometheus itself label each verdict with the shard of its job, which must be the replica that exported it.
A slowdown is injected on one job of each shard; then replica 0 is killed (SIGKILL) and started again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis as redis_lib
import requests
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from detector.engine import Engine
from detector.metrics import DetectorMetrics
from detector.prom import PromClient
from detector.service import Detector
from detector.settings import Settings
from detector.shard import hashmod
from detector.store import RedisStore, snapshot_name
from failslow.detect import JobEvent
from failslow_cli.stack import processes
from failslow_cli.stack.processes import Service, failslow_cli, free_port
from tests.integration.detector_stack import Endpoint, FakeJob, detector_service, redis_service
from tests.integration.polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SCRAPE = 0.1
PREFIX = "failslow:detector"
# hashmod(job, 2): 0 for the first three, 1 for the others (asserted below: the test depends on it).
JOBS = {0: ["llm-a", "vision(c)", 'q"f\\g'], 1: ["llm.b+1", "rl|d", "t5*"]}
SLOW = {0: "vision(c)", 1: "rl|d"}

Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]
# What the waits below poll may not answer yet (a replica starting, Prometheus busy): "not yet", not a failure.
UNANSWERED = (requests.RequestException,)


def scrape(port: int) -> Metrics:
    """Every sample a replica's /metrics serves, keyed by (name, sorted labels)."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.get((name, tuple(sorted(labels.items()))))


def jobs_exported(m: Metrics) -> set[str]:
    return {dict(lab)["job"] for (name, lab) in m if name == "failslow_detector_failslow"}


def watching(r: Replica, series: float = 12.0) -> Metrics | None:
    """The replica's metrics once it tracks ``series`` rank series, else None."""
    m = r.metrics()
    return m if value(m, "failslow_detector_series") == series else None


def verdict(r: Replica, job: str) -> float | None:
    return value(r.metrics(), "failslow_detector_failslow", job=job)


@dataclass
class Replica:
    """One `failslow detector --shards 2 --shard <index>` process on a fixed port (restartable)."""

    index: int
    port: int
    svc: Service

    def metrics(self) -> Metrics:
        return scrape(self.port)


def replica(index: int, tmp: Path, port: int, prom_url: str, redis_url: str) -> Replica:
    argv = [*failslow_cli(), "detector", "--shards", "2", "--shard", str(index)]
    return Replica(index, port, detector_service(
        tmp, port, prometheus_url=prom_url, redis_url=redis_url, poll_s=SCRAPE, argv=argv, name=f"detector-{index}",
        env={"FAILSLOW_DETECTOR_SNAPSHOT_EVERY": "5", "FAILSLOW_DETECTOR_QUERY_TIMEOUT_S": "2"}))


Stack = tuple[dict[str, FakeJob], str, Service, list[Replica]]


def shipped_prometheus(tmp: Path, exporter: str, detectors: list[str]) -> tuple[Path, int]:
    """The shipped config and rules, the replicas as detector targets, plus a hashmod label on their series."""
    port = free_port()
    cfg_path = processes.render_prometheus(tmp / "prom", prometheus=f"127.0.0.1:{port}", exporters=[exporter],
                                           detector=detectors, scrape_interval=f"{int(SCRAPE * 1000)}ms",
                                           evaluation_interval="1s")
    cfg = yaml.safe_load(cfg_path.read_text())
    (job,) = [j for j in cfg["scrape_configs"] if j["job_name"] == "failslow-detector"]
    job["metric_relabel_configs"] = [{"source_labels": ["job"], "modulus": 2, "target_label": "prom_shard",
                                      "action": "hashmod"}]
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return cfg_path, port


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[Stack]:
    jobs = {name: FakeJob(job=name, comm_metrics=False) for names in JOBS.values() for name in names}
    ep = Endpoint(list(jobs.values()), period=SCRAPE)
    red = redis_service(tmp_path)
    ports = [free_port() for _ in range(2)]
    cfg, port = shipped_prometheus(tmp_path, ep.target, [f"127.0.0.1:{p}" for p in ports])
    prom = processes.prometheus(cfg, port)
    replicas = [replica(i, tmp_path, p, prom.url, red.url) for i, p in enumerate(ports)]
    try:
        with red, prom, replicas[0].svc, replicas[1].svc:
            yield jobs, prom.url, red, replicas
    finally:
        ep.close()


def prom_query(prom: str, expr: str) -> list[dict[str, Any]]:
    doc = requests.post(f"{prom}/api/v1/query", data={"query": expr}, timeout=5).json()
    assert doc["status"] == "success", doc
    return list(doc["data"]["result"])


def test_two_replicas_watch_each_job_once_and_a_restart_resumes(shards: Stack) -> None:
    jobs, prom, red, (r0, r1) = shards
    assert {i: [hashmod(j, 2) for j in names] for i, names in JOBS.items()} == {0: [0, 0, 0], 1: [1, 1, 1]}

    # Each replica watches exactly its own three jobs (4 ranks each), and nothing of the other's.
    for r in (r0, r1):
        m = wait_for(partial(watching, r), 60, f"replica {r.index} to watch its jobs",
                     every=0.1, ignore=UNANSWERED)
        assert jobs_exported(m) == set(JOBS[r.index])
        assert value(m, "failslow_detector_jobs") == 3.0
        assert value(m, "failslow_detector_shard") == float(r.index)
        assert value(m, "failslow_detector_shards") == 2.0
    time.sleep(30 * SCRAPE)  # a healthy history on every rank before the fault

    for name in SLOW.values():
        jobs[name].slow_rank = 3
    for r in (r0, r1):
        wait_for(partial(lambda r, job: verdict(r, job) == 1.0, r, SLOW[r.index]), 60,
                 f"replica {r.index} to detect {SLOW[r.index]}", every=0.1, ignore=UNANSWERED)
    m0, m1 = r0.metrics(), r1.metrics()
    onset = {0: value(m0, "failslow_detector_onset_timestamp_seconds", job=SLOW[0]),
             1: value(m1, "failslow_detector_onset_timestamp_seconds", job=SLOW[1])}
    for r, m in ((r0, m0), (r1, m1)):
        assert jobs_exported(m) == set(JOBS[r.index])  # the other replica's slow job is not seen here
        assert value(m, "failslow_detector_events_total", job=SLOW[r.index]) == 1.0
        assert all(value(m, "failslow_detector_failslow", job=j) == 0.0 for j in JOBS[r.index] if j != SLOW[r.index])

    # What the alert rules read: one failslow_detector_failslow series per job, from the replica that owns it,
    # and that owner is the shard a real Prometheus's hashmod relabel rule gives the job.
    port_of = {f"127.0.0.1:{r.port}": r.index for r in (r0, r1)}

    def verdicts() -> list[dict[str, Any]] | None:
        got = prom_query(prom, "failslow_detector_failslow")
        slow = sorted(s["metric"]["job"] for s in got if float(s["value"][1]) == 1.0)
        return got if sorted(s["metric"]["job"] for s in got) == sorted(jobs) and slow == sorted(SLOW.values()) \
            else None

    for s in wait_for(verdicts, 60, "Prometheus to hold every job's verdict once, the slow ones at 1",
                      every=0.1, ignore=UNANSWERED):
        lab = s["metric"]
        assert port_of[lab["instance"]] == int(lab["prom_shard"]) == hashmod(lab["job"], 2), lab
    # The shipped FailSlowDetected rule, evaluated by Prometheus: one alert per slow job (pending for its `for`).
    alerts = wait_for(lambda: (got := prom_query(prom, 'ALERTS{alertname="FailSlowDetected"}')) and len(got) >= 2
                      and got, 60, "FailSlowDetected for both slow jobs", every=0.1, ignore=UNANSWERED)
    assert sorted(a["metric"]["job"] for a in alerts) == sorted(SLOW.values())

    # Replicas never overwrite each other in Redis: a snapshot each, holding only its own jobs; one
    # event hash with both slow jobs' open events.
    rc: Any = redis_lib.Redis.from_url(red.url)
    for i in (0, 1):
        meta = wait_for(partial(rc.get, f"{PREFIX}:shard:{i}:snapshot:meta"), 60, f"snapshot of shard {i}",
                        every=0.1, ignore=UNANSWERED)
        assert sorted({k[0] for k in json.loads(meta)["keys"]}) == sorted(JOBS[i])
    assert rc.get(f"{PREFIX}:snapshot") is None

    def events() -> dict[str, Any] | None:
        got = {k.decode(): json.loads(v) for k, v in rc.hgetall(f"{PREFIX}:events").items()}
        return got if all(SLOW[i] in got for i in (0, 1)) else None

    # (the replicas store an event within the poll that opened it; the verdict was exported a moment before)
    stored = wait_for(events, 10, "both slow jobs' events in Redis", every=0.1)
    assert all(stored[SLOW[i]]["open"] and stored[SLOW[i]]["events"] == 1 for i in (0, 1)), stored

    # Replica 0 dies without saving, from a snapshot taken well into its open event (a restored state with
    # only a few slow samples after the onset would test the core's handling of short slowdowns, not this).
    def snapshot_step() -> int | None:
        meta = json.loads(rc.get(f"{PREFIX}:shard:0:snapshot:meta"))
        return int(meta["t"]) if meta["jobs"][SLOW[0]]["open"] else None

    t_open = wait_for(snapshot_step, 60, "a snapshot of replica 0 with the open event",
                      every=0.1, ignore=UNANSWERED)
    wait_for(lambda: (snapshot_step() or 0) >= t_open + 10, 60, "a later snapshot of replica 0",
             every=0.1, ignore=UNANSWERED)
    # Replica 1 goes on alone and does not take over replica 0's jobs.
    pid1 = r1.svc.proc.pid
    assert prom_query(prom, 'ALERTS{alertname=~"DetectorShard.*"}') == []
    r0.svc.stop(kill=True)
    # The shipped DetectorShardMissing rule sees shard 0 gone (pending for its `for`); nothing is doubled.
    missing = wait_for(lambda: prom_query(prom, 'ALERTS{alertname="DetectorShardMissing"}'), 60,
                       "DetectorShardMissing pending", every=0.1, ignore=UNANSWERED)
    assert [a["metric"]["alertstate"] for a in missing] == ["pending"]
    assert prom_query(prom, 'ALERTS{alertname="DetectorShardDoubled"}') == []
    time.sleep(10 * SCRAPE)
    m1 = r1.metrics()
    assert jobs_exported(m1) == set(JOBS[1]) and value(m1, "failslow_detector_series") == 12.0
    # Replica 0 comes back: its open event is neither forgotten nor fired again, and it watches its jobs.
    r0.svc.start()
    m0 = wait_for(partial(watching, r0), 60, "replica 0 to resume its share", every=0.1, ignore=UNANSWERED)
    assert jobs_exported(m0) == set(JOBS[0])
    assert value(m0, "failslow_detector_failslow", job=SLOW[0]) == 1.0
    assert value(m0, "failslow_detector_onset_timestamp_seconds", job=SLOW[0]) == pytest.approx(onset[0])
    assert value(m0, "failslow_detector_events_total", job=SLOW[0]) is None  # nothing opened anew
    assert json.loads(rc.hget(f"{PREFIX}:events", SLOW[0]))["events"] == 1
    assert "state loaded (shard 0 of 2): 12 series, 3 jobs, 1 open events" in r0.svc.log.read_text()
    wait_for(lambda: prom_query(prom, 'ALERTS{alertname="DetectorShardMissing"}') == [], 60,
             "DetectorShardMissing gone", every=0.1, ignore=UNANSWERED)

    # The other replica was not disturbed: same process, same jobs, its event still open and counted once.
    m1 = r1.metrics()
    assert r1.svc.proc.pid == pid1 and r1.svc.proc.poll() is None
    assert jobs_exported(m1) == set(JOBS[1])
    assert value(m1, "failslow_detector_failslow", job=SLOW[1]) == 1.0
    assert value(m1, "failslow_detector_onset_timestamp_seconds", job=SLOW[1]) == pytest.approx(onset[1])
    assert value(m1, "failslow_detector_events_total", job=SLOW[1]) == 1.0

    # The restarted replica is detecting, not replaying: the fault ends and it closes the event.
    jobs[SLOW[0]].slow_rank = None
    wait_for(lambda: verdict(r0, SLOW[0]) == 0.0, 60, "replica 0 to see the recovery",
             every=0.1, ignore=UNANSWERED)
    assert json.loads(rc.hget(f"{PREFIX}:events", SLOW[0]))["open"] is False
    assert value(r1.metrics(), "failslow_detector_failslow", job=SLOW[1]) == 1.0
    assert len(prom_query(prom, "failslow_detector_failslow")) == len(jobs)


def test_a_replica_loads_only_the_state_of_its_own_jobs(tmp_path: Path) -> None:
    """Stored state of jobs that are another replica's (the shard count changed) is left to that replica."""
    jobs = [f"job-{i}" for i in range(8)]
    mine = [j for j in jobs if hashmod(j, 2) == 0]
    assert 0 < len(mine) < len(jobs)
    with redis_service(tmp_path) as red:
        # Replica 0 when it watched every job (another shard count): its snapshot, and the shared event hash.
        old = Engine()
        rng = np.random.default_rng(0)
        for t in range(20):
            old.step(float(t), {(j, str(r)): 1.0 + 0.01 * rng.standard_normal() for j in jobs for r in range(2)})
        store = RedisStore(red.url, "fs", snapshot_key=snapshot_name("fs", 0, 2))
        store.save_snapshot(*old.snapshot())
        store.save_events({j: JobEvent(job=j, open=True, onset_ts=5.0, ratio=1.5, events=1).to_json() for j in jobs})

        settings = Settings(redis_url=red.url, redis_prefix="fs", shards=2, shard=0, port=0)
        det = Detector(settings, PromClient("http://127.0.0.1:9"), store, DetectorMetrics(CollectorRegistry()))
        assert det.load_state()
        assert sorted({k[0] for k in det.engine.keys}) == mine
        assert sorted(det.engine.jobs) == mine and all(e.open for e in det.engine.jobs.values())
        text = det.metrics.registry.get_sample_value
        assert all(text("failslow_detector_failslow", {"job": j}) == (1.0 if j in mine else None) for j in jobs)
        # Its writes leave the other replica's events alone.
        det.save_now()
        assert sorted(store.load_events()) == jobs

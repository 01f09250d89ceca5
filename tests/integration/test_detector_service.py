"""The detector service against a REAL Prometheus and a REAL Redis, including restarts of both.

Prometheus, run from the shipped prometheus.yml and rules, scrapes a prometheus-client endpoint (listed in
its exporter target file) that plays a DP2 x PP2 job's node agents; the test injects a slow rank or a slow node link there and drives the detector poll by poll.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_lib
import requests
from prometheus_client import CollectorRegistry, generate_latest

from detector.culprit import settled_window
from detector.metrics import DetectorMetrics
from detector.prom import PromClient
from detector.service import Detector, build
from detector.settings import Settings
from failslow.detect.jobs import JobEvent
from failslow_cli.stack.processes import Service
from tests.integration.detector_stack import (
    Endpoint,
    FakeJob,
    detector_service,
    free_port,
    prometheus_service,
    redis_service,
)
from tests.integration.polling import wait_for

SCRAPE = 0.1


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[FakeJob, Endpoint, Service, Service]]:
    """A DP2 x PP2 job's endpoint, the shipped Prometheus scraping it every SCRAPE, and Redis (both restartable)."""
    job = FakeJob()
    ep = Endpoint([job], period=SCRAPE)
    prom = prometheus_service(tmp_path, [ep.target], interval=f"{int(SCRAPE * 1000)}ms")
    red = redis_service(tmp_path)
    try:
        red.start()
        prom.start()
        yield job, ep, prom, red
    finally:
        prom.stop()
        red.stop()
        ep.close()


def _settings(prom: Service, red: Service, **kw: object) -> Settings:
    base = {"prometheus_url": prom.url, "redis_url": red.url, "poll_interval_s": SCRAPE, "query_timeout_s": 2.0,
            "snapshot_every": 5, "culprit_every": 5, "port": 0, "address": "127.0.0.1"}
    base.update(kw)
    return Settings(**base)  # type: ignore[arg-type]


def _value(det: Detector, name: str, **labels: str) -> float | None:
    v = det.metrics.registry.get_sample_value(name, labels)
    return None if v is None else float(v)


def _poll(det: Detector, n: int, until: object = None) -> int:
    """Poll up to n times, one scrape apart; stop early when until(det) holds. Returns polls made."""
    for k in range(n):
        time.sleep(SCRAPE * 1.1)
        det.poll_once()
        if until is not None and until(det):  # type: ignore[operator]
            return k + 1
    return n


def _wait_for_samples(det: Detector) -> None:
    for _ in range(100):
        if det.poll_once() and det.engine.n_series == 4:
            return
        time.sleep(SCRAPE)
    raise AssertionError("the detector never saw the job's 4 ranks through Prometheus")


def test_compute_fault_detected_named_persisted_and_survives_restarts(stack) -> None:
    job, _ep, prom, red = stack
    settings = _settings(prom, red)
    det = build(settings, CollectorRegistry())
    _wait_for_samples(det)
    _poll(det, 15)
    assert _value(det, "failslow_detector_failslow", job="train") == 0.0
    assert _value(det, "failslow_detector_prometheus_up") == 1.0
    assert _value(det, "failslow_detector_redis_up") == 1.0
    assert _value(det, "failslow_detector_series") == 4.0

    t_fault = time.time()
    job.slow_rank = 3
    polls = _poll(det, 40, lambda d: _value(d, "failslow_detector_failslow", job="train") == 1.0)
    t_detected = time.time()
    assert _value(det, "failslow_detector_failslow", job="train") == 1.0, f"not detected in {polls} polls"
    onset = _value(det, "failslow_detector_onset_timestamp_seconds", job="train")
    # The onset is the scrape time of the first slow sample: after the fault (one scrape interval of
    # slack for the endpoint's ticker) and before the detection. No bound on how long that took: a
    # loaded machine delays scrapes.
    assert onset is not None and t_fault - 2 * SCRAPE <= onset <= t_detected
    assert _value(det, "failslow_detector_slowdown_ratio", job="train") == pytest.approx(1.4, rel=0.05)
    # the level the ratio is measured against: the healthy iteration time (1.0 s, jitter ±1 %)
    baseline = _value(det, "failslow_detector_baseline_seconds", job="train")
    assert baseline == pytest.approx(1.0, rel=0.02)
    assert _value(det, "failslow_detector_events_total", job="train") == 1.0
    # The culprit is the slow rank, not its DP peer that waits for it, and no link is blamed. The first
    # analysis may run on a rate window still holding healthy scrapes (a loaded machine delays them);
    # it is re-run every culprit_every polls, so wait for the verdict, then check nothing else is named.
    _poll(det, 60, lambda d: bool(d.engine.jobs["train"].suspects) and
          d.engine.jobs["train"].suspects[0]["rank"] == "3")
    ev = det.engine.jobs["train"]
    assert [(s["kind"], s["rank"]) for s in ev.suspects] == [("compute", "3")], ev.suspects
    assert ev.named == [["compute", "3", "node3"]], ev.named
    assert _value(det, "failslow_detector_suspect", job="train", kind="compute", rank="3", node="node3") > 0.5
    stored = json.loads(redis_lib.Redis.from_url(red.url).hget(f"{settings.redis_prefix}:events", "train"))
    assert stored["open"] is True and stored["onset_ts"] == pytest.approx(onset)

    # Redis goes away: the detector keeps detecting and says so; it comes back: state is written again.
    red.stop()
    assert _poll(det, 2) == 2
    assert _value(det, "failslow_detector_redis_up") == 0.0
    assert _value(det, "failslow_detector_last_poll_success") == 1.0
    red.start()
    _poll(det, 5)
    assert _value(det, "failslow_detector_redis_up") == 1.0

    # The detector restarts: the open event comes back from Redis with its onset, and does not fire again.
    det.save_now()
    det2 = build(settings, CollectorRegistry())
    _poll(det2, 10)
    assert _value(det2, "failslow_detector_failslow", job="train") == 1.0
    assert _value(det2, "failslow_detector_onset_timestamp_seconds", job="train") == pytest.approx(onset)
    assert _value(det2, "failslow_detector_baseline_seconds", job="train") == pytest.approx(baseline)
    assert _value(det2, "failslow_detector_events_total", job="train") is None  # nothing opened anew
    assert det2.engine.jobs["train"].named == [["compute", "3", "node3"]]  # what the zeroed suspects come from
    assert det2.engine.jobs["train"].events == 1

    # Prometheus restarts: polls fail and say so, then resume on the same data.
    steps = det2.engine.t
    fresh_polls = 0

    def _fresh(d: Detector) -> None:
        nonlocal fresh_polls
        fresh_polls += bool(d._new)

    prom.stop()
    assert not det2.poll_once()
    assert _value(det2, "failslow_detector_prometheus_up") == 0.0
    assert _value(det2, "failslow_detector_last_poll_success") == 0.0
    restarted = time.time()
    prom.start()
    _poll(det2, 30, lambda d: _fresh(d) or _value(d, "failslow_detector_prometheus_up") == 1.0)
    assert _value(det2, "failslow_detector_last_poll_success") == 1.0
    # Until the restarted Prometheus scrapes again it answers nothing or the old samples: no step (a step
    # would age the verification history by a missing sample; CI once saw 31 of them hide the recovery).
    _poll(det2, 100, lambda d: _fresh(d) or min(d._last_ts.values()) > restarted)
    assert det2.engine.t - steps == fresh_polls

    # The fault ends: the event closes, the suspects go, and a recovery is stored.
    job.slow_rank = None
    _poll(det2, 40, lambda d: _value(d, "failslow_detector_failslow", job="train") == 0.0)
    assert _value(det2, "failslow_detector_failslow", job="train") == 0.0
    assert _value(det2, "failslow_detector_slowdown_ratio", job="train") == 1.0
    assert "failslow_detector_suspect{" not in generate_latest(det2.metrics.registry).decode()
    stored = json.loads(redis_lib.Redis.from_url(red.url).hget(f"{settings.redis_prefix}:events", "train"))
    assert stored["open"] is False and stored["closed_ts"] > onset


def test_an_opened_event_is_stored_before_its_culprit_analysis_runs(stack, monkeypatch) -> None:
    """The verdict is exported in the poll that opens the event, and the culprit analysis after it runs a few
    Prometheus queries (seconds when Prometheus is slow): a replica killed meanwhile must find the event in
    Redis when it comes back, not open it a second time."""
    import detector.service as service

    job, _ep, prom, red = stack
    settings = _settings(prom, red)
    det = build(settings, CollectorRegistry())
    _wait_for_samples(det)
    _poll(det, 15)

    def killed(*_a: object, **_k: object) -> None:
        raise KeyboardInterrupt  # the replica dies inside the analysis

    monkeypatch.setattr(service, "analyse_job", killed)
    job.slow_rank = 3
    with pytest.raises(KeyboardInterrupt):
        _poll(det, 40)
    assert _value(det, "failslow_detector_failslow", job="train") == 1.0
    stored = json.loads(redis_lib.Redis.from_url(red.url).hget(f"{settings.redis_prefix}:events", "train"))
    assert stored["open"] is True and stored["onset_ts"] == pytest.approx(det.engine.jobs["train"].onset_ts)


def test_link_fault_names_the_node_not_the_ranks(stack) -> None:
    job, _ep, prom, red = stack
    det = build(_settings(prom, red), CollectorRegistry())
    _wait_for_samples(det)
    _poll(det, 15)
    job.slow_node = 1
    _poll(det, 40, lambda d: _value(d, "failslow_detector_failslow", job="train") == 1.0)
    assert _value(det, "failslow_detector_failslow", job="train") == 1.0
    _poll(det, 60, lambda d: any(s["node"] == "node1" for s in d.engine.jobs["train"].suspects))
    sus = det.engine.jobs["train"].suspects
    assert [(s["kind"], s["node"]) for s in sus] == [("link", "node1")], sus
    assert _value(det, "failslow_detector_suspect", job="train", kind="link", rank="", node="node1") > 0.5


def test_stage_fault_names_every_rank_of_the_stage(stack) -> None:
    """Both DP ranks of stage 1 slow alike: no rank stands out among its DP peers, the stage does."""
    job, _ep, prom, red = stack
    det = build(_settings(prom, red), CollectorRegistry())
    _wait_for_samples(det)
    _poll(det, 15)
    job.slow_stage = 1
    _poll(det, 40, lambda d: _value(d, "failslow_detector_failslow", job="train") == 1.0)
    assert _value(det, "failslow_detector_failslow", job="train") == 1.0
    want = [("compute", "2", "node2"), ("compute", "3", "node3")]
    _poll(det, 60, lambda d: sorted((s["kind"], s["rank"], s["node"]) for s in d.engine.jobs["train"].suspects) == want)
    sus = det.engine.jobs["train"].suspects
    assert sorted((s["kind"], s["rank"], s["node"]) for s in sus) == want, sus
    assert all(s["evidence"]["stage"] == 1 for s in sus)
    assert _value(det, "failslow_detector_suspect", job="train", kind="compute", rank="2", node="node2") > 0.5


def test_after_a_rebalance_or_a_move_the_slow_device_alone_is_named(stack) -> None:
    """Rank 3 (replica 1, stage 1) computes twice as long; then a rebalance gives replica 1 3 micro-batches of
    16. Read raw, rank 3 now computes less than its DP peer rank 2 (13 micro-batches: 1.24 s against 0.73 s);
    per micro-batch, told by their pipeline sends and outside-pipeline compute, it is still the slow one.
    Then a move puts rank 2 on the slow device: a window across the move named both ranks.

    The exporter re-finds periods as on the testbed: at the onset the waiting replica's iteration counters
    stop for 4 polls and catch up; after the split the first stages' periods change 3 polls late, the last
    stages' 9 (a ratio of short rates of sends and iterations then jumps: the analysis waited the whole event
    through on the testbed, and the alert carried no suspect)."""
    job, _ep, prom, red = stack
    job.microbatches, job.factor = (8, 8), 2.0
    det = build(_settings(prom, red), CollectorRegistry())
    _wait_for_samples(det)
    _poll(det, 15)
    job.slow_rank = 3
    job.relock((0, 2), 4)
    _poll(det, 40, lambda d: _value(d, "failslow_detector_failslow", job="train") == 1.0)
    # named by the analysis the event's opening runs, so the alert's first notification carries it
    assert [(s["kind"], s["rank"]) for s in det.engine.jobs["train"].suspects] == [("compute", "3")]
    job.microbatches = (13, 3)
    job.relock((0, 1), 3)
    job.relock((2, 3), 9)
    named: list[list[str]] = []
    for _ in range(40):  # 8 analyses over windows holding ever more of the split
        _poll(det, 1)
        named.append([s["rank"] for s in det.engine.jobs["train"].suspects])
    assert all(n == ["3"] for n in named), named
    ev = det.engine.jobs["train"].suspects[0]["evidence"]
    # the window holds the new split alone (cut down while the change was in it): the fault's own factor
    assert ev["outside_calls_ratio"] == pytest.approx(2.0, rel=0.05), ev
    assert ev["microbatch_share"] == pytest.approx(3 / 8, rel=0.03), ev
    # A restart swaps ranks 2 and 3 between their nodes (an S3 move): the slow device, node3, now holds rank 2.
    # Until a window holds the new placement alone the suspects stand, then rank 2 is named on node3.
    job.nodes, job.slow_rank = {2: "node3", 3: "node2"}, 2
    moved: list[list[tuple[str, str]]] = []
    for _ in range(40):
        _poll(det, 1)
        moved.append([(s["rank"], s["node"]) for s in det.engine.jobs["train"].suspects])
    assert all(m in ([("3", "node3")], [("2", "node3")]) for m in moved), moved
    assert moved[-1] == [("2", "node3")], moved


def test_a_period_change_cuts_the_culprit_window_only_where_pipeline_sends_tell_the_split(stack) -> None:
    """On real Prometheus: a job without a pipeline whose calls per iteration change (a new bucket layout)
    keeps its culprit window; once the ranks send through a pipeline, a change of their period cuts it, and
    so does a change the exporter hid (unsure of the period for longer than the window, then the new one)."""
    job, _ep, prom, _red = stack
    client = PromClient(prom.url)
    sel, window = 'job="train"', 5.0
    job.period_calls = 9.0
    wait_for(lambda: client.query(f"failslow_iteration_period_calls{{{sel}}}"), 20, "the period series", every=0.1)
    time.sleep(1.0)
    job.period_calls = 10.0
    wait_for(lambda: client.query(f"changes(failslow_iteration_period_calls{{{sel}}}[5s]) > 0"), 20,
             "the period change", every=0.1)
    assert settled_window(client, sel, window, SCRAPE) == window
    job.microbatches = (8, 8)  # pipeline sends now, and 17 calls per iteration
    wait_for(lambda: client.query(f'failslow_comm_calls_total{{{sel},op="Send"}}'), 20, "the sends", every=0.1)
    time.sleep(1.0)
    cut = settled_window(client, sel, window, SCRAPE)
    assert cut is not None and cut < window, cut
    job.confidence = 0.97
    wait_for(lambda: settled_window(client, sel, window, SCRAPE) == window, 30, "a settled window", every=0.2)
    job.confidence, job.microbatches = 0.1, (10, 6)  # hidden while the exporter finds the new period
    time.sleep(window + 1.0)
    job.confidence = 0.97
    wait_for(lambda: client.query(f'failslow_iteration_period_calls{{{sel},rank="0"}} == 21'), 20, "the new period",
             every=0.1)
    assert not client.query(f"changes(failslow_iteration_period_calls{{{sel}}}[5s]) > 0")  # no two samples differ
    cut = settled_window(client, sel, window, SCRAPE)
    assert cut is None or cut < window, cut


def test_a_job_that_stops_is_dropped_with_its_series_and_state(tmp_path: Path) -> None:
    """A job that ends (its series vanish) loses its detector rows, exported series and Redis event."""
    live, gone = FakeJob(job="live"), FakeJob(job="gone")
    ep = Endpoint([live, gone], period=SCRAPE)
    prom = prometheus_service(tmp_path, [ep.target], interval=f"{int(SCRAPE * 1000)}ms")
    red = redis_service(tmp_path)
    try:
        red.start()
        prom.start()
        settings = _settings(prom, red, stale_after_s=2.0)
        det = build(settings, CollectorRegistry())
        for _ in range(100):
            if det.poll_once() and det.engine.n_series == 8:
                break
            time.sleep(SCRAPE)
        assert det.engine.n_series == 8
        _poll(det, 15)
        gone.slow_rank = 1
        _poll(det, 60, lambda d: bool(d.engine.jobs["gone"].suspects))
        assert _value(det, "failslow_detector_failslow", job="gone") == 1.0
        r = redis_lib.Redis.from_url(red.url)
        assert r.hexists(f"{settings.redis_prefix}:events", "gone")

        ep.remove(gone)
        _poll(det, 300, lambda d: "gone" not in d.engine.jobs)
        assert "gone" not in det.engine.jobs
        assert sorted(k for k in det.engine.keys) == [("live", str(i)) for i in range(4)]
        assert _value(det, "failslow_detector_series") == 4.0
        text = generate_latest(det.metrics.registry).decode()
        assert 'job="gone"' not in text and 'job="live"' in text
        assert not r.hexists(f"{settings.redis_prefix}:events", "gone")
        meta = json.loads(r.get(f"{settings.redis_prefix}:snapshot:meta"))
        assert sorted(map(tuple, meta["keys"])) == [("live", str(i)) for i in range(4)]
        assert "gone" not in meta["jobs"]
        # The live job is still watched: a fault on it is still detected.
        live.slow_rank = 2
        _poll(det, 60, lambda d: _value(d, "failslow_detector_failslow", job="live") == 1.0)
        assert _value(det, "failslow_detector_failslow", job="live") == 1.0
        # A restart does not bring the dropped job back from Redis.
        det.save_now()
        det2 = build(settings, CollectorRegistry())
        _poll(det2, 3)
        assert "gone" not in det2.engine.jobs and 'job="gone"' not in generate_latest(det2.metrics.registry).decode()
    finally:
        prom.stop()
        red.stop()
        ep.close()


def test_waits_for_redis_before_detecting(tmp_path: Path) -> None:
    """Redis away at start: no detection (it could re-fire a stored event), metrics say why."""
    job = FakeJob()
    ep = Endpoint([job], period=SCRAPE)
    prom = prometheus_service(tmp_path, [ep.target])
    red = redis_service(tmp_path)
    try:
        prom.start()
        det = build(_settings(prom, red), CollectorRegistry())
        assert not det.poll_once()
        assert _value(det, "failslow_detector_redis_up") == 0.0
        assert _value(det, "failslow_detector_last_poll_success") == 0.0
        assert det.engine.n_series == 0
        red.start()
        assert det.poll_once()
        assert _value(det, "failslow_detector_redis_up") == 1.0
    finally:
        prom.stop()
        red.stop()
        ep.close()


def test_service_process_serves_metrics_and_saves_on_sigterm(stack, tmp_path: Path) -> None:
    _job, _ep, prom, red = stack
    port = free_port()
    svc = detector_service(tmp_path, port, prometheus_url=prom.url, redis_url=red.url, poll_s=SCRAPE,
                           argv=[sys.executable, "-m", "detector"])
    try:
        p = svc.start().proc
        text = ""
        for _ in range(100):
            time.sleep(0.2)
            try:
                text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=1).text
            except requests.RequestException:
                continue
            if "failslow_detector_series 4.0" in text:
                break
        assert "failslow_detector_up 1.0" in text
        assert "failslow_detector_prometheus_up 1.0" in text
        assert 'failslow_detector_failslow{job="train"} 0.0' in text
        red.stop()
        for _ in range(150):  # until the service's next write finds Redis gone (a busy machine is slow)
            time.sleep(0.2)
            text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            if "failslow_detector_redis_up 0.0" in text:
                break
        assert "failslow_detector_redis_up 0.0" in text and p.poll() is None
        red.start()
        for _ in range(150):
            time.sleep(0.2)
            text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            if "failslow_detector_redis_up 1.0" in text:
                break
        assert "failslow_detector_redis_up 1.0" in text
        p.terminate()
        assert p.wait(20) == 0
    finally:
        svc.stop(kill=True)
    snap = redis_lib.Redis.from_url(red.url).get("failslow:detector:snapshot:meta")
    assert snap is not None and sorted(json.loads(snap)["keys"]) == [["train", str(r)] for r in range(4)]


def test_cli_rejects_bad_settings(failslow_cmd: list[str]) -> None:
    p = subprocess.run([*failslow_cmd, "detector", "--poll-interval", "-1"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("failslow detector: ")
    p = subprocess.run([*failslow_cmd, "detector", "--stale-after", "0"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "stale_after_s" in p.stderr


def test_metrics_bounded_suspect_series() -> None:
    m = DetectorMetrics(CollectorRegistry())
    sus = [{"kind": "compute", "rank": str(r), "node": "n", "confidence": 0.9} for r in range(3)]
    m.show_job("j", True, 1.5, 100.0, 0.4, sus)
    m.show_job("j", True, 1.5, 100.0, 0.4, sus[:1])
    out = generate_latest(m.registry).decode()
    # the two no longer named read 0 while the event is open (not removed: see DetectorMetrics.show_job)
    assert out.count("failslow_detector_suspect{") == 3
    assert 'failslow_detector_suspect{job="j",kind="compute",node="n",rank="0"} 0.9' in out
    assert 'failslow_detector_suspect{job="j",kind="compute",node="n",rank="1"} 0.0' in out
    m.show_job("j", True, 1.5, 100.0, 0.4, sus[1:2])  # named again
    out = generate_latest(m.registry).decode()
    assert 'failslow_detector_suspect{job="j",kind="compute",node="n",rank="1"} 0.9' in out
    assert 'failslow_detector_suspect{job="j",kind="compute",node="n",rank="0"} 0.0' in out
    # A restarted detector has only the stored event: what it named earlier (JobEvent.named) reads 0 again.
    ev = JobEvent.from_json(json.loads(json.dumps(JobEvent("j", open=True, suspects=sus[1:2], named=[
        ["compute", str(r), "n"] for r in range(3)]).to_json())))
    fresh = DetectorMetrics(CollectorRegistry())
    fresh.show_job("j", True, 1.5, 100.0, 0.4, ev.suspects, ev.named)
    out = generate_latest(fresh.registry).decode()
    assert out.count("failslow_detector_suspect{") == 3, out
    for r, v in (("0", "0.0"), ("1", "0.9"), ("2", "0.0")):
        assert f'failslow_detector_suspect{{job="j",kind="compute",node="n",rank="{r}"}} {v}' in out, out
    assert 'failslow_detector_baseline_seconds{job="j"} 0.4' in out
    m.show_job("j", False, 1.0, 0.0, 0.0, [])
    out = generate_latest(m.registry).decode()
    assert "failslow_detector_suspect{" not in out and "failslow_detector_onset_timestamp_seconds{" not in out
    assert "failslow_detector_baseline_seconds{" not in out


def test_a_slow_stage_is_exported_rank_by_rank_within_the_limit() -> None:
    from detector.culprit import suspects
    from failslow.culprit import Analysis, Culprit

    stage = Culprit(kind="compute", rank=None, node=None, ranks=(4, 5, 6), confidence=0.9, stage=2,
                    evidence={"stage": 2, "stage_compute_ratio": 1.8})
    link = Culprit(kind="link", rank=None, node=0, ranks=(0, 1), confidence=0.6)
    a = Analysis(culprits=[stage, link], groups=[], ranks=[])
    nodes = {4: "n4", 5: "n5", 6: "n6"}
    out = suspects(a, {0: "n0"}, 4, nodes)
    assert [(s["kind"], s["rank"], s["node"]) for s in out] == [("compute", "4", "n4"), ("compute", "5", "n5"),
                                                                ("compute", "6", "n6"), ("link", "", "n0")]
    assert all(s["evidence"]["stage"] == 2 for s in out[:3])
    assert len(suspects(a, {0: "n0"}, 2, nodes)) == 2


def test_a_batch_size_stair_is_no_slowdown_when_the_job_publishes_its_samples(stack) -> None:
    """A stair of a batch-size ramp-up: the job's iterations take twice as long for twice the samples. A
    detector that reads the job's ``failslow_iteration_samples`` (the default) sees seconds per sample and
    opens nothing; one told to ignore it (``samples_metric=""``), on the same Prometheus, opens an event at
    the stair. The first keeps the job's last value while the gauge is away, and a slow rank afterwards is
    still a slowdown for it."""
    job, _ep, prom, red = stack
    job.samples = 32
    per_sample = build(_settings(prom, red, redis_prefix="t:samples"), CollectorRegistry())
    per_iter = build(_settings(prom, red, redis_prefix="t:iter", samples_metric=""), CollectorRegistry())

    def poll_both(n: int) -> None:
        for _ in range(n):
            time.sleep(SCRAPE * 1.1)
            per_sample.poll_once()
            per_iter.poll_once()

    _wait_for_samples(per_sample)
    _wait_for_samples(per_iter)
    poll_both(15)
    job.samples, job.work = 64, 2.0  # one scrape: the gauge and the iteration time change together
    poll_both(40)
    assert _value(per_iter, "failslow_detector_failslow", job="train") == 1.0  # the stair alone alarms
    assert _value(per_sample, "failslow_detector_failslow", job="train") == 0.0
    assert _value(per_sample, "failslow_detector_events_total", job="train") in (None, 0.0)
    job.samples = None  # the gauge goes away (a textfile that stopped parsing): the last value stands
    poll_both(15)
    assert _value(per_sample, "failslow_detector_failslow", job="train") == 0.0
    job.slow_rank = 3
    polls = _poll(per_sample, 40, lambda d: _value(d, "failslow_detector_failslow", job="train") == 1.0)
    assert _value(per_sample, "failslow_detector_failslow", job="train") == 1.0, f"not detected in {polls} polls"

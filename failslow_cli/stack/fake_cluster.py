"""A real Prometheus scraping synthetic training jobs: the remediator's planner queries it for real.

The series are what the exporter and the detector would expose for a DP×PP job (per-rank iteration and
compute time with their coordinates, the last-iteration timestamp, the iteration counter, the detector's
onset and ratio), with values the caller sets (tests, and bench/bench_remediator.py), served by a
prometheus-client endpoint that the shipped Prometheus config scrapes every second.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path

import requests
from prometheus_client import CollectorRegistry, MetricsHandler
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from failslow_cli.stack.processes import free_port, prometheus, render_prometheus

RANK_LABELS = ["job", "rank", "dp_rank", "pp_rank", "tp_rank", "node"]


@dataclass
class JobSeries:
    """One job's series: per-micro-batch compute time of each (dp, pp) cell and the micro-batch split."""

    per_mb: dict[tuple[int, int], float]
    counts: list[int]
    overhead_s: float = 0.05
    onset_ts: float | None = None
    healthy_s: float = 0.5
    # the detector's verdict while onset_ts is set: failslow 1 and these suspects (kind, rank, node)
    suspects: list[tuple[str, str, str]] = field(default_factory=list)
    # once-per-iteration work of each cell (optimizer step), exposed as its compute outside the pipeline
    # (a first stage's stretch holding one micro-batch too); none: no such series
    step: dict[tuple[int, int], float] = field(default_factory=dict)

    @property
    def stages(self) -> int:
        return 1 + max(p for _d, p in self.per_mb)

    def iteration_s(self) -> float:
        rep = []
        for d in range(len(self.counts)):
            cells = [self.per_mb[d, p] for p in range(self.stages)]
            work = max((self.step.get((d, p), 0.0) for p in range(self.stages)), default=0.0)
            rep.append((self.counts[d] - 1) * max(cells) + sum(cells) + work)
        return self.overhead_s + max(rep)


@dataclass(eq=False)
class FakeCluster:
    """The series of every job, served to Prometheus."""

    jobs: dict[str, JobSeries] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # each job's iterations so far and when they were counted (its ranks' failslow_iterations_total, at the
    # pace of the job's series as it changes)
    counted: dict[str, tuple[float, float]] = field(default_factory=dict)

    def collect(self, part: str = "all") -> Iterable[Metric]:
        """The families of `part`: "exporter" (per-rank series), "detector" (its verdict) or "all"."""
        now = time.time()
        it = GaugeMetricFamily("failslow_iteration_duration_seconds", "iteration", labels=RANK_LABELS)
        comp = GaugeMetricFamily("failslow_iteration_compute_seconds", "compute", labels=RANK_LABELS)
        outside = GaugeMetricFamily("failslow_iteration_outside_pipeline_compute_seconds", "outside",
                                    labels=RANK_LABELS)
        last = GaugeMetricFamily("failslow_last_iteration_timestamp_seconds", "last", labels=RANK_LABELS)
        total = CounterMetricFamily("failslow_iterations", "iterations", labels=RANK_LABELS)
        onset = GaugeMetricFamily("failslow_detector_onset_timestamp_seconds", "onset", labels=["job"])
        ratio = GaugeMetricFamily("failslow_detector_slowdown_ratio", "ratio", labels=["job"])
        base = GaugeMetricFamily("failslow_detector_baseline_seconds", "baseline", labels=["job"])
        flag = GaugeMetricFamily("failslow_detector_failslow", "open event", labels=["job"])
        susp = GaugeMetricFamily("failslow_detector_suspect", "suspect", labels=["job", "kind", "rank", "node"])
        with self.lock:
            for job, s in self.jobs.items():
                T = s.iteration_s()
                n, at = self.counted.get(job, (0.0, now))
                n += max(0.0, now - at) / T
                self.counted[job] = (n, now)
                for r, ((d, p), t) in enumerate(sorted(s.per_mb.items(), key=lambda kv: (kv[0][1], kv[0][0]))):
                    lab = [job, str(r), str(d), str(p), "0", f"n{r}"]
                    it.add_metric(lab, T)
                    w = s.step.get((d, p))
                    comp.add_metric(lab, t * s.counts[d] + (w or 0.0))
                    if w is not None:
                        outside.add_metric(lab, w + (t if p == 0 and s.stages > 1 else 0.0))
                    last.add_metric(lab, now - 0.2)
                    total.add_metric(lab, float(int(n)))
                flag.add_metric([job], 0.0 if s.onset_ts is None else 1.0)
                if s.onset_ts is not None:
                    onset.add_metric([job], s.onset_ts)
                    ratio.add_metric([job], T / s.healthy_s)
                    base.add_metric([job], s.healthy_s)
                    for kind, rank, node in s.suspects:
                        susp.add_metric([job, kind, rank, node], 0.9)
                else:
                    ratio.add_metric([job], 1.0)
        if part in ("exporter", "all"):
            yield from (it, comp, outside, last, total)
        if part in ("detector", "all"):
            yield from (onset, ratio, base, flag, susp)

    def set(self, job: str, series: JobSeries) -> None:
        with self.lock:
            self.jobs[job] = series


@dataclass(eq=False)
class _Part:
    cluster: FakeCluster
    part: str

    def collect(self) -> Iterable[Metric]:
        return self.cluster.collect(self.part)


@contextmanager
def fake_cluster_prometheus(tmp: Path, alertmanagers: list[str] | None = None) -> Iterator[tuple[str, FakeCluster]]:
    """A real Prometheus (shipped config and rules, 1 s scrapes and evaluation) scraping the fake cluster's
    series, sending alerts to `alertmanagers` (host:port); yields (url, cluster)."""
    cluster = FakeCluster()
    servers = []
    for part in ("exporter", "detector"):  # two endpoints, as the two services would be
        reg = CollectorRegistry()
        reg.register(_Part(cluster, part))  # type: ignore[arg-type]
        server = ThreadingHTTPServer(("127.0.0.1", 0), MetricsHandler.factory(reg))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    port = free_port()
    exp, det = (f"127.0.0.1:{srv.server_address[1]}" for srv in servers)
    cfg = render_prometheus(tmp, prometheus=f"127.0.0.1:{port}", exporters=[exp], detector=[det],
                            alertmanager=alertmanagers, scrape_interval="1s", evaluation_interval="1s")
    try:
        with prometheus(cfg, port) as svc:
            yield svc.url, cluster
    finally:
        for srv in servers:
            srv.shutdown()
            srv.server_close()


def wait_for_series(prom_url: str, job: str, timeout: float = 30.0) -> None:
    """Until Prometheus has scraped the job's compute series."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = requests.get(f"{prom_url}/api/v1/query",
                         params={"query": f'count(failslow_iteration_compute_seconds{{job="{job}"}})'}, timeout=5).json()
        if r["data"]["result"]:
            return
        time.sleep(0.3)
    raise RuntimeError(f"Prometheus has no series of {job} after {timeout} s")

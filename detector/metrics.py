"""The detector's own metrics, built from the catalogue entries whose source is "detector"."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from failslow.catalogue import by_name


class DetectorMetrics:
    """Gauges and counters of the detector in their own registry (passed in, no global state)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        cat = by_name()

        def gauge(name: str) -> Gauge:
            m = cat[name]
            return Gauge(name, m.help, list(m.labels), registry=self.registry)

        self.failslow = gauge("failslow_detector_failslow")
        self.ratio = gauge("failslow_detector_slowdown_ratio")
        self.onset = gauge("failslow_detector_onset_timestamp_seconds")
        self.baseline = gauge("failslow_detector_baseline_seconds")
        self.suspect = gauge("failslow_detector_suspect")
        ev = cat["failslow_detector_events_total"]
        self.events = Counter(ev.name.removesuffix("_total"), ev.help, list(ev.labels), registry=self.registry)
        self.up = gauge("failslow_detector_up")
        self.poll_ok = gauge("failslow_detector_last_poll_success")
        self.poll_ts = gauge("failslow_detector_last_poll_timestamp_seconds")
        self.poll_s = gauge("failslow_detector_poll_duration_seconds")
        self.prom_up = gauge("failslow_detector_prometheus_up")
        self.redis_up = gauge("failslow_detector_redis_up")
        self.series = gauge("failslow_detector_series")
        self.jobs = gauge("failslow_detector_jobs")
        self.shard = gauge("failslow_detector_shard")
        self.shards = gauge("failslow_detector_shards")
        self.shards.set(1)
        self.up.set(1)
        self._suspects: dict[str, set[tuple[str, str, str]]] = {}

    def show_job(self, job: str, is_open: bool, ratio: float, onset_ts: float, baseline: float,
                 suspects: list[dict[str, Any]], named: Sequence[Sequence[str]] = ()) -> None:
        """Export one job's event state; suspect series of a closed event are removed (bounded).

        `named`: every ``(kind, rank, node)`` named earlier in the open event (``JobEvent.named``, which
        survives a restart of the detector); those not in `suspects` now read 0.
        """
        self.failslow.labels(job).set(1 if is_open else 0)
        self.ratio.labels(job).set(ratio if is_open else 1.0)
        if is_open:
            self.onset.labels(job).set(onset_ts)
            if baseline > 0:
                self.baseline.labels(job).set(baseline)
        else:
            for g in (self.onset, self.baseline):
                with contextlib.suppress(KeyError):
                    g.remove(job)
        want = {(s["kind"], s["rank"], s["node"]): float(s["confidence"]) for s in suspects} if is_open else {}
        before = self._suspects.get(job, set()) | ({(k, r, n) for k, r, n in named} if is_open else set())
        if is_open:
            # One no longer named reads 0 until the event closes rather than vanishing: the alert rules read the
            # last sample of each series over a minute (riding out a failed scrape of this process), and a
            # removed series' last sample would name it for that minute more.
            for key in before - set(want):
                self.suspect.labels(job, *key).set(0.0)
        else:
            for key in before:
                with contextlib.suppress(KeyError):
                    self.suspect.remove(job, *key)
        for key, conf in want.items():
            self.suspect.labels(job, *key).set(conf)
        self._suspects[job] = (before | set(want)) if is_open else set()

    def drop_job(self, job: str) -> None:
        """Remove every series of a job that is gone (fail-slow, ratio, onset, baseline, suspects, events)."""
        for g in (self.failslow, self.ratio, self.onset, self.baseline, self.events):
            with contextlib.suppress(KeyError):
                g.remove(job)
        for key in self._suspects.pop(job, set()):
            with contextlib.suppress(KeyError):
                self.suspect.remove(job, *key)

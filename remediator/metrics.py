"""The remediator's own metrics, built from the catalogue entries whose source is "remediator"."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from failslow.catalogue import by_name
from failslow.plan.policy import DECISIONS, STRATEGIES

OUTCOMES = ("accepted", "duplicate", "stale", "unauthorized", "malformed", "unavailable")
RESULTS = ("succeeded", "failed", "rejected", "dry_run")
# Actions take from well under a second (a micro-batch split) to many minutes (a requeue).
DURATION_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class RemediatorMetrics:
    """Counters, gauges and histograms of one remediator replica, in their own registry (passed in)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        cat = by_name()

        def counter(name: str) -> Counter:
            m = cat[name]
            return Counter(name.removesuffix("_total"), m.help, list(m.labels), registry=self.registry)

        def gauge(name: str) -> Gauge:
            m = cat[name]
            return Gauge(name, m.help, list(m.labels), registry=self.registry)

        def histogram(name: str, buckets: tuple[float, ...]) -> Histogram:
            m = cat[name]
            return Histogram(name, m.help, list(m.labels), buckets=buckets, registry=self.registry)

        self.deliveries = counter("failslow_remediator_deliveries_total")
        self.decisions = counter("failslow_remediator_decisions_total")
        self.actions = counter("failslow_remediator_actions_total")
        self.duration = histogram("failslow_remediator_action_duration_seconds", DURATION_BUCKETS)
        self.latency = histogram("failslow_remediator_decision_latency_seconds", LATENCY_BUCKETS)
        self.in_flight = gauge("failslow_remediator_actions_in_flight")
        self.open_events = gauge("failslow_remediator_open_events")
        self.auto = gauge("failslow_remediator_auto_mode")
        self.redis_up = gauge("failslow_remediator_redis_up")
        self.prom_up = gauge("failslow_remediator_prometheus_up")
        # Every label value exists from the start, so rate() and alert rules see 0 rather than nothing.
        for o in OUTCOMES:
            self.deliveries.labels(o)
        for d in DECISIONS:
            self.decisions.labels(d)
        for s in STRATEGIES:
            for r in RESULTS:
                self.actions.labels(s, r)
            self.duration.labels(s)
            self.latency.labels(s)

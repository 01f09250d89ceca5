"""The collector contract and the runner that gives every collector its own self-metrics.

A collector is anything with ``collect() -> Iterable[prometheus_client Metric]`` (one method, like a
node_exporter collector). `CollectorSet` is what is registered with the Prometheus registry: on each
scrape it runs every collector, times it, and adds ``failslow_exporter_collector_success`` and
``failslow_exporter_collector_duration_seconds`` for it. A collector that raises yields nothing that
scrape and reports success 0; the others are unaffected.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)

from failslow.catalogue import by_name

log = logging.getLogger("failslow.exporter")

_CATALOGUE = by_name()


class PartialFailure(Exception):
    """Raised by a collector that could serve only part of its data: the families are still exposed."""

    def __init__(self, families: list[Metric], message: str) -> None:
        """Carry the families that could be produced and what went wrong."""
        super().__init__(message)
        self.families = families


class Collector(Protocol):
    """One source of metrics (rings, NVML, textfiles)."""

    def collect(self) -> Iterable[Metric]:
        """Produce the metric families of one scrape; raise when the source is unavailable."""
        ...


def family(name: str) -> GaugeMetricFamily | CounterMetricFamily | SummaryMetricFamily:
    """An empty metric family with the catalogue's type, help and label names for ``name``.

    Raises:
        KeyError: ``name`` is not in the catalogue (every exposed metric must be).
    """
    m = _CATALOGUE[name]
    labels = list(m.labels)
    if m.type == "counter":
        return CounterMetricFamily(name, m.help, labels=labels)
    if m.type == "summary":
        return SummaryMetricFamily(name, m.help, labels=labels)
    return GaugeMetricFamily(name, m.help, labels=labels)


class CollectorSet:
    """Runs named collectors on each scrape and reports their success and duration."""

    def __init__(self, collectors: Sequence[tuple[str, Collector]],
                 clock: Callable[[], float] = time.perf_counter) -> None:
        """Wrap ``collectors`` (name, collector) in scrape order."""
        self.collectors = list(collectors)
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        """Every collector's families, then the self-metrics of all of them."""
        ok = family("failslow_exporter_collector_success")
        dur = family("failslow_exporter_collector_duration_seconds")
        for name, c in self.collectors:
            t0 = self._clock()
            try:
                fams = list(c.collect())
                success = 1.0
            except PartialFailure as exc:
                log.warning("collector %s: %s", name, exc)
                fams, success = exc.families, 0.0
            except Exception as exc:  # a failing source must not take the scrape down
                log.warning("collector %s failed: %s", name, exc)
                fams, success = [], 0.0
            ok.add_metric([name], success)
            dur.add_metric([name], self._clock() - t0)
            yield from fams
        yield ok
        yield dur

    def describe(self) -> list[Metric]:
        """Nothing up front: the registry must not call `collect` at registration time."""
        return []

"""NVML collector: SM clock against its maximum, temperature, power, utilisation, throttle reasons, XIDs.

Labels are ``node`` and ``gpu`` (index). A clock below its maximum while the GPU is busy, or a
thermal / power-brake clock event, slows every rank on that GPU and with it the whole job; the alert
rules in prometheus/rules/alerts.yml read these series. Without NVML the collector reports
``failslow_exporter_collector_success{collector="nvml"} 0`` and exposes no GPU series.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client.core import Metric

from exporter.collector import family
from exporter.gpu import CLOCK_EVENT_REASONS, FakeGpuBackend, GpuBackend, NvmlBackend
from exporter.settings import Settings


class NvmlCollector:
    """Exposes one `GpuBackend`'s readings."""

    def __init__(self, backend: GpuBackend, node: str) -> None:
        """Read GPUs from ``backend``, labelled with ``node``."""
        self.backend = backend
        self.node = node
        self._xid_total: dict[int, int] = {}
        self._last_xid: dict[int, int] = {}
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        """One family per GPU metric; raises when the backend cannot read the GPUs."""
        samples = self.backend.sample()
        info = family("failslow_gpu_info")
        clock = family("failslow_gpu_sm_clock_hertz")
        clock_max = family("failslow_gpu_sm_clock_max_hertz")
        temp = family("failslow_gpu_temperature_celsius")
        power = family("failslow_gpu_power_watts")
        util = family("failslow_gpu_utilization_ratio")
        event = family("failslow_gpu_clock_event_active")
        xid_total = family("failslow_gpu_xid_errors_total")
        last_xid = family("failslow_gpu_last_xid")
        with self._lock:
            for g in samples:
                lab = [self.node, str(g.index)]
                info.add_metric([*lab, g.uuid, g.name], 1.0)
                clock.add_metric(lab, g.sm_clock_hz)
                clock_max.add_metric(lab, g.sm_clock_max_hz)
                temp.add_metric(lab, g.temperature_c)
                power.add_metric(lab, g.power_w)
                util.add_metric(lab, g.utilization)
                for bit, reason in CLOCK_EVENT_REASONS.items():
                    event.add_metric([*lab, reason], 1.0 if g.clock_event_reasons & bit else 0.0)
                if g.xids:
                    self._xid_total[g.index] = self._xid_total.get(g.index, 0) + len(g.xids)
                    self._last_xid[g.index] = g.xids[-1]
                xid_total.add_metric(lab, self._xid_total.get(g.index, 0))
                last_xid.add_metric(lab, self._last_xid.get(g.index, 0))
        yield from (info, clock, clock_max, temp, power, util, event, xid_total, last_xid)


def build(settings: Settings) -> NvmlCollector:
    """NVML, or `FakeGpuBackend` when ``fake_gpus`` is set."""
    backend: GpuBackend = FakeGpuBackend(settings.fake_gpus) if settings.fake_gpus else NvmlBackend()
    return NvmlCollector(backend, settings.node)

"""GPU telemetry behind a one-method Protocol: NVML for real GPUs, a fake for tests and demos.

`NvmlBackend` uses nvidia-ml-py (``pynvml``); without a driver its `sample` raises, the NVML
collector reports ``success 0`` and nothing else is affected. `FakeGpuBackend` (``--fake-gpus N``,
like dcgm-exporter) serves deterministic GPUs whose clocks, throttle reasons and XID errors tests can
drive, so the rest of the pipeline (rules, dashboards) can be exercised without hardware.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

#: NVML clock-event (throttle) reason bits and the label each gets (nvmlClocksEventReason*).
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU (base units)."""

    index: int
    uuid: str
    name: str
    sm_clock_hz: float
    sm_clock_max_hz: float
    temperature_c: float
    power_w: float
    utilization: float  # 0..1
    clock_event_reasons: int  # bitmask of CLOCK_EVENT_REASONS
    xids: tuple[int, ...] = ()  # XID error codes reported since the previous sample


class GpuBackend(Protocol):
    """Source of GPU readings."""

    def sample(self) -> list[GpuSample]:
        """Read every GPU now; raise when the source is unavailable."""
        ...


class NvmlBackend:
    """Real GPUs through NVML; initialises lazily so a driver that appears later is picked up."""

    def __init__(self) -> None:
        """Prepare; NVML itself is initialised on the first `sample`."""
        self._nvml: Any = None
        self._events: Any = None
        self._handles: list[Any] = []

    def _init(self) -> Any:
        import pynvml  # deferred: the module loads libnvidia-ml only when used

        pynvml.nvmlInit()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        try:  # XID errors are "where available": not on every GPU/driver, never fatal
            es = pynvml.nvmlEventSetCreate()
            for h in self._handles:
                pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
            self._events = es
        except pynvml.NVMLError:
            self._events = None
        self._nvml = pynvml
        return pynvml

    def _xids(self, nv: Any) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        if self._events is None:
            return out
        for _ in range(1024):  # bounded: drain what is queued, never block
            try:
                ev = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError:
                break
            idx = next((i for i, h in enumerate(self._handles) if h == ev.device), -1)
            out.setdefault(idx, []).append(int(ev.eventData))
        return out

    def sample(self) -> list[GpuSample]:
        """Read every GPU; raises ``pynvml.NVMLError`` (or ImportError) without a usable driver."""
        nv = self._nvml or self._init()
        xids = self._xids(nv)
        out = []
        for i, h in enumerate(self._handles):
            try:
                reasons = nv.nvmlDeviceGetCurrentClocksEventReasons(h)
            except (AttributeError, nv.NVMLError):
                reasons = nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)
            uuid = nv.nvmlDeviceGetUUID(h)
            name = nv.nvmlDeviceGetName(h)
            out.append(GpuSample(
                index=i,
                uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                name=name.decode() if isinstance(name, bytes) else str(name),
                sm_clock_hz=nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM) * 1e6,
                sm_clock_max_hz=nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM) * 1e6,
                temperature_c=float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                power_w=nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                utilization=nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
                clock_event_reasons=int(reasons),
                xids=tuple(xids.get(i, ())),
            ))
        return out


@dataclass
class FakeGpuBackend:
    """Simulated GPUs with settable state (``--fake-gpus N``).

    Attributes:
        count: Number of GPUs.
        gpus: Current state of each GPU; tests change it with `set` and `inject_xid`.
    """

    count: int
    gpus: list[GpuSample] = field(default_factory=list)
    _pending_xids: dict[int, list[int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if not self.gpus:
            self.gpus = [GpuSample(index=i, uuid=f"GPU-fake-{i:04d}", name="Fake GPU", sm_clock_hz=1.98e9,
                                   sm_clock_max_hz=1.98e9, temperature_c=45.0 + i, power_w=300.0,
                                   utilization=0.95, clock_event_reasons=0)
                         for i in range(self.count)]

    def set(self, index: int, **changes: Any) -> None:
        """Change fields of GPU ``index`` (e.g. ``sm_clock_hz=1.2e9, clock_event_reasons=0x40``)."""
        with self._lock:
            self.gpus[index] = replace(self.gpus[index], **changes)

    def inject_xid(self, index: int, code: int) -> None:
        """Queue an XID error on GPU ``index`` for the next sample."""
        with self._lock:
            self._pending_xids.setdefault(index, []).append(code)

    def sample(self) -> list[GpuSample]:
        """The current state, with XIDs queued since the previous sample."""
        with self._lock:
            xids, self._pending_xids = self._pending_xids, {}
            return [replace(g, xids=tuple(xids.get(g.index, ()))) for g in self.gpus]

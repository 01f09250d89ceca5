"""One series through the detector service's own engine, default settings, one poll per sample: the events
it opens. Shared by the tests that hold real series against the service's defaults."""

from __future__ import annotations

from collections.abc import Iterable

from detector.engine import Engine
from detector.settings import Settings


def opened(values: Iterable[float]) -> list[tuple[float, int]]:
    """``(onset, index of the poll that opened it)`` of every job event the engine opens on `values`."""
    s = Settings()
    engine = Engine(s.method, s.threshold, s.quorum, s.dtype)
    out = []
    for k, v in enumerate(values):
        for change in engine.step(float(k), {("job", "0"): float(v)}, sample_ts=float(k)):
            if change.what == "opened":
                out.append((change.event.onset_ts, k))
    return out

"""The collectors, one per module, and the one explicit list that registers them.

To add a collector: write ``exporter/collectors/<name>.py`` with a class that has
``collect() -> Iterable[Metric]`` and a ``build(settings) -> Collector`` function, add its metrics
to `failslow.catalogue`, and add one line below (see docs/exporter.md).
"""

from __future__ import annotations

from collections.abc import Callable

from exporter.collector import Collector
from exporter.collectors import nvml, ring, textfile
from exporter.settings import Settings

#: name -> factory. Scrape order is this order.
REGISTRY: dict[str, Callable[[Settings], Collector | None]] = {
    "ring": ring.build,
    "nvml": nvml.build,
    "textfile": textfile.build,
}

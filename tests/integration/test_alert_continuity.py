"""FailSlowDetected on a real Prometheus (shipped config and rules) across failed scrapes of the detector.

The detector's own metrics class (:class:`detector.metrics.DetectorMetrics`) is served on a port Prometheus
scrapes as its detector target; the test drives it as the service would (an open event naming rank 3, then
rank 5 instead, then closed) and makes its endpoint answer 503 for a few scrapes, which Prometheus records
as a failed scrape and marks every series of the target stale, as when the detector restarts. The alert must
stay firing through that, with the time it became active unchanged (no resolved and re-fired notification),
while a suspect the detector stops naming and the event it closes resolve before that minute is out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import MetricsHandler

from detector.metrics import DetectorMetrics
from failslow_cli.stack.processes import free_port, prometheus, render_prometheus
from tests.integration.polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

JOB = "llm"


class StandInDetector:
    """The detector's metrics on a port; ``down`` makes every scrape fail with 503."""

    def __init__(self) -> None:
        self.metrics = DetectorMetrics(CollectorRegistry())
        self.down = False
        outer = self

        class Handler(MetricsHandler.factory(self.metrics.registry)):
            def do_GET(self) -> None:
                if outer.down:
                    self.send_error(503, "restarting")
                else:
                    super().do_GET()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.addr = f"127.0.0.1:{self.server.server_address[1]}"

    def show(self, is_open: bool, ranks: list[str]) -> None:
        suspects = [{"kind": "compute", "rank": r, "node": f"n{r}", "confidence": 0.9} for r in ranks]
        self.metrics.show_job(JOB, is_open, 1.5 if is_open else 1.0, time.time() - 60, 0.4, suspects)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[StandInDetector, str]]:
    det = StandInDetector()
    port = free_port()
    cfg = render_prometheus(tmp_path / "prom", prometheus=f"127.0.0.1:{port}", detector=[det.addr],
                            scrape_interval="1s", evaluation_interval="1s")
    try:
        with prometheus(cfg, port) as svc:
            yield det, svc.url
    finally:
        det.server.shutdown()


def _alerts(url: str) -> list[dict[str, Any]]:
    """FailSlowDetected instances Prometheus holds now (pending and firing)."""
    got = requests.get(f"{url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    return [a for a in got if a["labels"].get("alertname") == "FailSlowDetected"]


def _firing(url: str) -> dict[str, str]:
    """rank -> activeAt of each firing FailSlowDetected instance."""
    return {a["labels"].get("rank", ""): a["activeAt"] for a in _alerts(url) if a["state"] == "firing"}


def _detector_up(url: str) -> float | None:
    res = requests.get(f"{url}/api/v1/query", params={"query": 'up{job="failslow-detector"}'},
                       timeout=5).json()["data"]["result"]
    return float(res[0]["value"][1]) if res else None


def test_a_failed_detector_scrape_neither_resolves_nor_restarts_the_alert(stack) -> None:
    det, url = stack
    det.show(True, ["3"])
    firing = wait_for(lambda: _firing(url).get("3"), 90, "FailSlowDetected firing for rank 3 (for: 10s)")

    # Scrapes fail for ~4 s: Prometheus marks the detector's series stale. Every look at the alerts in that
    # time, and just after, finds the same instance firing, active since the same time.
    det.down = True
    seen_down, t_end = False, time.monotonic() + 4.0
    while time.monotonic() < t_end:
        seen_down = seen_down or _detector_up(url) == 0.0
        assert _firing(url) == {"3": firing}, _alerts(url)
        time.sleep(0.2)
    assert seen_down or wait_for(lambda: _detector_up(url) == 0.0, 10, "a failed scrape of the detector")
    det.down = False
    wait_for(lambda: _detector_up(url) == 1.0, 30, "the detector scraped again")
    for _ in range(6):
        assert _firing(url) == {"3": firing}, _alerts(url)
        time.sleep(0.5)

    # The detector names rank 5 instead: rank 3's series reads 0, so its alert resolves at once (a removed
    # series would have been read for another minute), and rank 5's fires after its `for:`.
    det.show(True, ["5"])
    wait_for(lambda: "3" not in {a["labels"].get("rank") for a in _alerts(url)}, 30,
             "rank 3's alert resolved (before the minute a removed series would be read)")
    wait_for(lambda: "5" in _firing(url), 60, "FailSlowDetected firing for rank 5")

    # The detector closes the event: resolved within a few evaluations, not a minute later.
    det.show(False, [])
    wait_for(lambda: not _alerts(url), 30, "every FailSlowDetected resolved (before the minute)")

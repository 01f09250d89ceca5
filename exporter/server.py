"""The node agent process: builds the collectors, serves ``/metrics``, polls rings in the background."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from exporter.collector import Collector, CollectorSet
from exporter.collectors import REGISTRY
from exporter.settings import Settings
from failslow.errors import InputError

log = logging.getLogger("failslow.exporter")


def build_collectors(settings: Settings) -> list[tuple[str, Collector]]:
    """Instantiate the collectors named in ``settings.collectors``, in registry order.

    Raises:
        InputError: an unknown collector name.
    """
    unknown = [n for n in settings.collectors if n not in REGISTRY]
    if unknown:
        raise InputError(f"unknown collector(s) {unknown}; known: {', '.join(REGISTRY)}")
    out: list[tuple[str, Collector]] = []
    for name, factory in REGISTRY.items():
        if name in settings.collectors:
            c = factory(settings)
            if c is not None:
                out.append((name, c))
    return out


class Exporter:
    """Registry, HTTP server and background poller for one node."""

    def __init__(self, settings: Settings, collectors: Sequence[tuple[str, Collector]] | None = None) -> None:
        """Wire ``collectors`` (default: from ``settings``) into a fresh registry."""
        self.settings = settings
        self.collectors = list(collectors) if collectors is not None else build_collectors(settings)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(CollectorSet(self.collectors))  # type: ignore[arg-type]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server: Any = None
        self.port: int | None = None

    def render(self) -> bytes:
        """One scrape in the Prometheus text format (what ``/metrics`` returns)."""
        return generate_latest(self.registry)

    def poll(self) -> None:
        """Let collectors that buffer data (rings) catch up between scrapes."""
        for name, c in self.collectors:
            p = getattr(c, "poll", None)
            if p is None:
                continue
            try:
                p()
            except Exception as exc:  # keep polling the others; the scrape reports the failure
                log.warning("poll of %s failed: %s", name, exc)

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.scan_interval_s):
            self.poll()

    def start(self) -> int:
        """Serve ``/metrics`` and start polling; returns the bound port."""
        self._server, thread = start_http_server(self.settings.port, self.settings.address, self.registry)
        self.port = int(self._server.server_port)
        poller = threading.Thread(target=self._loop, name="failslow-exporter-poll", daemon=True)
        poller.start()
        self._threads = [thread, poller]
        log.info("failslow exporter on %s:%d, rings in %s", self.settings.address, self.port,
                 self.settings.ring_dir)
        return self.port

    def stop(self) -> None:
        """Stop serving and polling; close rings."""
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for _, c in self.collectors:
            close = getattr(c, "close", None)
            if close is not None:
                close()

    def wait(self) -> None:
        """Block until `stop` (or SIGTERM/SIGINT via `run_forever`)."""
        self._stop.wait()


def run_forever(settings: Settings, once: bool = False) -> int:
    """Run the exporter until SIGTERM/SIGINT; with ``once`` print one scrape to stdout and return."""
    exp = Exporter(settings)
    if once:
        import sys

        sys.stdout.write(exp.render().decode())
        exp.stop()
        return 0

    def _term(_sig: int, _frame: FrameType | None) -> None:
        exp._stop.set()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    port = exp.start()
    print(f"failslow exporter: serving http://{settings.address}:{port}/metrics (rings: {settings.ring_dir})",
          flush=True)
    exp.wait()
    exp.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m exporter``: settings from ``FAILSLOW_EXPORTER_*`` only."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return run_forever(Settings())

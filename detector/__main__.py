"""`python -m detector` / `failslow detector`: the streaming fail-slow detector service."""

from __future__ import annotations

import logging
import signal
import sys
import threading

from prometheus_client import start_http_server
from pydantic import ValidationError

from detector.service import build
from detector.settings import Settings

log = logging.getLogger("failslow.detector")


def main(settings: Settings | None = None) -> int:
    """Build Settings (env ``FAILSLOW_DETECTOR_*``), serve /metrics, poll until SIGTERM/SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if settings is None:
        try:
            settings = Settings()
        except ValidationError as exc:  # e.g. FAILSLOW_DETECTOR_SHARD not below FAILSLOW_DETECTOR_SHARDS
            print(f"detector: bad FAILSLOW_DETECTOR_* settings: {exc}", file=sys.stderr)
            return 2
    det = build(settings)
    server, _thread = start_http_server(settings.port, settings.address, registry=det.metrics.registry)
    log.info("detector metrics on http://%s:%d/metrics; polling %s every %.3gs", settings.address,
             server.server_port, settings.prometheus_url, settings.poll_interval_s)
    stopping = threading.Event()

    def _stop(signum: int, _frame: object) -> None:
        log.info("signal %d: saving state and stopping", signum)
        stopping.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    det.run(stopping.is_set)
    det.save_now()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

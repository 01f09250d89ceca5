"""`python -m remediator` / `failslow remediator`: the Alertmanager webhook and mitigation service."""

from __future__ import annotations

import logging
import sys

import uvicorn

from failslow.errors import InputError
from remediator.app import TokenFile, create_app
from remediator.config import read_config
from remediator.service import build_service
from remediator.settings import Settings

log = logging.getLogger("failslow.remediator")


def main(settings: Settings | None = None) -> int:
    """Build Settings (env ``FAILSLOW_REMEDIATOR_*``), load the config and the token, serve until SIGTERM.

    Raises:
        InputError: an unreadable or invalid config or token file (exit 2 from the CLI).
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = settings or Settings()
    config = read_config(settings.config)
    try:
        token = TokenFile(settings.token_file)
    except ValueError as exc:
        raise InputError(f"{exc} (FAILSLOW_REMEDIATOR_TOKEN_FILE): every POST needs the token") from None
    svc = build_service(settings, config)
    app = create_app(svc, settings, token)
    log.info("remediator on http://%s:%d (mode %s, %d job rule(s), Redis %s, Prometheus %s)", settings.host,
             settings.port, settings.mode, len(config.jobs), settings.redis_url, settings.prometheus_url)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=30)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except InputError as exc:
        print(f"remediator: {exc}", file=sys.stderr)
        sys.exit(2)

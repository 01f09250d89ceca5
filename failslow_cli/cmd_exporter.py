"""`failslow exporter`: the node agent serving per-rank iteration times and GPU metrics to Prometheus."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from failslow.errors import InputError

HELP = "node agent: read call rings + NVML + textfiles, serve /metrics for Prometheus"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `failslow exporter`; each overrides its ``FAILSLOW_EXPORTER_*`` variable."""
    p.add_argument("--port", type=int, help="HTTP port (default 9400; 0 = any free port)")
    p.add_argument("--address", help="bind address (default 0.0.0.0)")
    p.add_argument("--ring-dir", help="ring directory (default $FAILSLOW_SHM_DIR, else /dev/shm)")
    p.add_argument("--node", help="node name label (default: hostname)")
    p.add_argument("--scan-interval", dest="scan_interval_s", type=float, help="seconds between ring polls")
    p.add_argument("--window", type=int, help="iterations averaged per rank")
    p.add_argument("--textfile-dir", help="serve the *.prom files of this directory")
    p.add_argument("--fake-gpus", type=int, help="simulate N GPUs instead of NVML")
    p.add_argument("--collectors", help="comma-separated collectors to run (default ring,nvml,textfile)")
    p.add_argument("--once", action="store_true", help="print one scrape to stdout and exit")


def run(args: argparse.Namespace) -> int:
    """Build `Settings` (flags over environment) and run the exporter."""
    from pydantic import ValidationError

    from exporter.server import run_forever
    from exporter.settings import Settings

    keys = ("port", "address", "ring_dir", "node", "scan_interval_s", "window", "textfile_dir", "fake_gpus",
            "collectors")
    overrides: dict[str, Any] = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        msgs = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise InputError(f"bad settings: {msgs}") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return run_forever(settings, once=args.once)
    except OSError as exc:
        raise InputError(f"cannot serve on {settings.address}:{settings.port}: {exc.strerror or exc}") from None

"""`failslow detector`: run the detector service (same as `python -m detector`)."""

from __future__ import annotations

import argparse

HELP = "run the streaming fail-slow detector service (polls Prometheus, state in Redis)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options override the FAILSLOW_DETECTOR_* environment."""
    p.add_argument("--prometheus-url", help="Prometheus base URL (FAILSLOW_DETECTOR_PROMETHEUS_URL)")
    p.add_argument("--redis-url", help="Redis URL (FAILSLOW_DETECTOR_REDIS_URL)")
    p.add_argument("--port", type=int, help="port of the detector's /metrics (FAILSLOW_DETECTOR_PORT)")
    p.add_argument("--address", help="address to bind (FAILSLOW_DETECTOR_ADDRESS)")
    p.add_argument("--poll-interval", type=float, help="seconds between polls (FAILSLOW_DETECTOR_POLL_INTERVAL_S)")
    p.add_argument("--stale-after", type=float,
                   help="seconds without a new sample before a rank's series (and a job left without any) is "
                        "dropped (FAILSLOW_DETECTOR_STALE_AFTER_S, default 600)")
    p.add_argument("--shards", type=int,
                   help="detector replicas the jobs are split over, by Prometheus' hashmod of the job label "
                        "(FAILSLOW_DETECTOR_SHARDS, default 1)")
    p.add_argument("--shard", type=int,
                   help="this replica's number, 0 .. shards-1 (FAILSLOW_DETECTOR_SHARD, default 0)")


def run(args: argparse.Namespace) -> int:
    """Build Settings from env plus options and run the service."""
    from pydantic import ValidationError

    from detector.__main__ import main
    from detector.settings import Settings
    from failslow.errors import InputError

    over = {k: v for k, v in {"prometheus_url": args.prometheus_url, "redis_url": args.redis_url,
                              "port": args.port, "address": args.address,
                              "poll_interval_s": args.poll_interval,
                              "stale_after_s": args.stale_after, "shards": args.shards,
                              "shard": args.shard}.items() if v is not None}
    try:
        settings = Settings(**over)
    except ValidationError as exc:
        raise InputError(str(exc).replace("\n", " ")) from exc
    return main(settings)

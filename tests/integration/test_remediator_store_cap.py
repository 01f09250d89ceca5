"""The hourly cap counts actions, not validations (real Redis)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from failslow_cli.stack.processes import free_port, redis_server
from remediator.store import Store

pytestmark = pytest.mark.integration


def test_validations_do_not_count_toward_the_hourly_cap(tmp_path: Path) -> None:
    port = free_port()
    with redis_server(tmp_path / "redis", port) as srv:
        async def run() -> int:
            client = aioredis.Redis.from_url(srv.url)
            store = Store(client, prefix="t")
            now = time.time()
            for i, strategy in enumerate(("validate", "rebalance", "validate", "topology")):
                a = {"id": f"a{i}", "event_id": "e", "job": "j", "strategy": strategy, "state": "planned",
                     "created_at": now, "dry_run": False}
                _, created = await store.create_action(a, {})
                assert created
                await store.transition(f"a{i}", ("planned",), lambda d: {**d, "state": "running",
                                                                          "started_at": time.time()}, {})
                await store.transition(f"a{i}", ("running",), lambda d: {**d, "state": "succeeded"}, {})
            n = await store.started_since("j", now - 10.0)
            await client.aclose()
            return n

        assert asyncio.run(run()) == 2

"""Detector state in Redis: open events (written at once) and a snapshot of the detectors (periodically).

Keys (``prefix`` = ``FAILSLOW_DETECTOR_REDIS_PREFIX``):

* ``<prefix>:events``: hash job -> JSON of the job's event (open or last closed), written on every change,
  so a restart neither forgets an open event nor fires it again;
* ``<prefix>:snapshot``: the detector arrays (numpy ``.npz`` bytes) and ``<prefix>:snapshot:meta`` (JSON:
  series index, poll times, per-job state), written together in one transaction.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import redis


class StoreUnavailable(RuntimeError):
    """Redis did not answer; the caller keeps state in memory and retries."""


class RedisStore:
    """Events and snapshots of one detector in Redis."""

    def __init__(self, url: str, prefix: str = "failslow:detector", timeout_s: float = 10.0,
                 client: redis.Redis | None = None) -> None:
        self.prefix = prefix
        self.client = client or redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)

    def _wrap(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (redis.RedisError, OSError) as exc:
            raise StoreUnavailable(str(exc)) from exc

    def ping(self) -> None:
        """Raise StoreUnavailable unless Redis answers."""
        self._wrap(self.client.ping)

    def save_events(self, events: dict[str, dict[str, Any]]) -> None:
        """Write the given jobs' events."""
        if events:
            self._wrap(self.client.hset, f"{self.prefix}:events",
                       mapping={k: json.dumps(v, sort_keys=True) for k, v in events.items()})

    def delete_events(self, jobs: list[str]) -> None:
        """Forget the given jobs' events (jobs that are gone)."""
        if jobs:
            self._wrap(self.client.hdel, f"{self.prefix}:events", *jobs)

    def load_events(self) -> dict[str, dict[str, Any]]:
        """Every stored job event."""
        raw = self._wrap(self.client.hgetall, f"{self.prefix}:events")
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    def save_snapshot(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> int:
        """Write the detector arrays and their metadata atomically; returns the bytes written."""
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        blob = buf.getvalue()

        def tx() -> None:
            pipe = self.client.pipeline(transaction=True)
            pipe.set(f"{self.prefix}:snapshot", blob)
            pipe.set(f"{self.prefix}:snapshot:meta", json.dumps(meta))
            pipe.execute()

        self._wrap(tx)
        return len(blob)

    def load_snapshot(self) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
        """The last snapshot, or None when there is none."""
        def get() -> list[Any]:
            return list(self.client.mget([f"{self.prefix}:snapshot", f"{self.prefix}:snapshot:meta"]))

        blob, meta = self._wrap(get)
        if blob is None or meta is None:
            return None
        with np.load(io.BytesIO(blob), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        return arrays, json.loads(meta)

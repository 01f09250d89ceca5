"""Detector state in Redis: open events (written at once) and a snapshot of the detectors (periodically).

Keys (``prefix`` = ``FAILSLOW_DETECTOR_REDIS_PREFIX``):

* ``<prefix>:events``: hash job -> JSON of the job's event (open or last closed), written on every change,
  so a restart neither forgets an open event nor fires it again. One field per job: replicas that split
  the jobs between them (``FAILSLOW_DETECTOR_SHARDS``) write and delete only the fields of the jobs they
  own, so they share the hash without overwriting each other, and a job that moves to another replica
  (the replica count changed) takes its event along;
* ``<prefix>:snapshot``: the detector arrays (numpy ``.npz`` bytes) and ``<prefix>:snapshot:meta`` (JSON:
  series index, poll times, per-job state), written together in one transaction. The detector state is
  one vectorised block per process, so with several replicas each has its own snapshot,
  ``<prefix>:shard:<index>:snapshot`` and ``...:snapshot:meta`` (`snapshot_name`).
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import redis


class StoreUnavailable(RuntimeError):
    """Redis did not answer; the caller keeps state in memory and retries."""


def snapshot_name(prefix: str, shard: int = 0, shards: int = 1) -> str:
    """The snapshot key of replica ``shard`` of ``shards`` (its metadata is this key + ``:meta``)."""
    return f"{prefix}:snapshot" if shards == 1 else f"{prefix}:shard:{shard}:snapshot"


class RedisStore:
    """Events and snapshots of one detector (one replica) in Redis."""

    def __init__(self, url: str, prefix: str = "failslow:detector", timeout_s: float = 10.0,
                 client: redis.Redis | None = None, snapshot_key: str | None = None) -> None:
        self.prefix = prefix
        self.snapshot_key = snapshot_key or snapshot_name(prefix)
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
            pipe.set(self.snapshot_key, blob)
            pipe.set(f"{self.snapshot_key}:meta", json.dumps(meta))
            pipe.execute()

        self._wrap(tx)
        return len(blob)

    def load_snapshot(self) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
        """The last snapshot, or None when there is none."""
        def get() -> list[Any]:
            return list(self.client.mget([self.snapshot_key, f"{self.snapshot_key}:meta"]))

        blob, meta = self._wrap(get)
        if blob is None or meta is None:
            return None
        with np.load(io.BytesIO(blob), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        return arrays, json.loads(meta)

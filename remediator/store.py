"""The remediator's state in Redis: events, actions, locks, idempotency keys and the append-only audit.

Keys (``P`` = ``FAILSLOW_REMEDIATOR_REDIS_PREFIX``); documents are JSON strings:

* ``P:event:<id>``, ``P:events`` (zset id -> opened_at), ``P:open`` (hash job -> id of its open event);
* ``P:action:<id>``, ``P:actions`` (zset id -> created_at), ``P:inflight`` (hash job -> id of its action
  that is planned, pending approval or running; at most one per job), ``P:started:<job>`` (zset of action
  ids -> start time, for the cap per hour), ``P:alive:<action id>`` (a running action's lease, renewed by
  the replica executing it);
* ``P:dedupe:<fingerprint|startsAt|status>`` (expiring), ``P:alert:<fingerprint>`` (latest instance seen);
* ``P:lock:<job>`` (planning lock with a lease), ``P:idem:<key>`` (Idempotency-Key -> action id);
* ``P:job:<job>`` (what the remediator remembers of a job: its own micro-batch split, strategies that did
  not help it), ``P:tidy`` (set of jobs whose split was changed), ``P:costs`` (hash adapter:strategy ->
  measured cost);
* ``P:audit``: a Redis Stream; every delivery, decision, action, approval, judgement and event change is
  one entry ``{ts, kind, job, event, action, replica, data}``, trimmed to about the newest
  ``audit_max`` entries (``FAILSLOW_REMEDIATOR_AUDIT_MAX_ENTRIES``; 0 keeps everything).

Every change that must not happen twice is one MULTI/EXEC guarded by WATCH: a delivery's dedupe keys and
the event it changes; an action's creation and the job's in-flight slot; a state transition (approve,
reject, finish) and the state it starts from. Two replicas (or an Alertmanager HA pair delivering twice)
therefore never act twice. Any Redis failure is raised as :class:`Unavailable` (the webhook answers 503 and
Alertmanager retries).

A delivery whose every alert was seen before (most of them: Alertmanager repeats a firing group every
repeat_interval, and both members of an HA pair deliver) takes one round trip: a script checks its dedupe
keys and appends its audit entry atomically; only a delivery with something new runs the transaction.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError, WatchError

T = TypeVar("T")

_UNLOCK = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end
"""
# KEYS: dedupe keys..., audit stream; ARGV: maxlen (0: none), then the audit entry's field/value pairs.
# Appends the entry and returns 1 when every dedupe key exists; otherwise changes nothing and returns 0.
_ALL_SEEN = """
local n = #KEYS - 1
for i = 1, n do
  if redis.call('exists', KEYS[i]) == 0 then return 0 end
end
local args = {KEYS[n + 1]}
if tonumber(ARGV[1]) > 0 then
  table.insert(args, 'MAXLEN'); table.insert(args, '~'); table.insert(args, ARGV[1])
end
table.insert(args, '*')
for i = 2, #ARGV do table.insert(args, ARGV[i]) end
redis.call('xadd', unpack(args))
return 1
"""
_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end
"""


class Unavailable(RuntimeError):
    """Redis did not answer (or a transaction kept conflicting): a transient fault, retry later."""


def new_id(kind: str) -> str:
    """A new event or action id: a sortable time prefix and randomness (``ev-…``, ``act-…``)."""
    return f"{kind}-{int(time.time() * 1000):x}-{uuid.uuid4().hex[:8]}"


def _dumps(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _loads(raw: bytes | str | None) -> Any:
    return None if raw is None else json.loads(raw)


@dataclass
class IngestResult:
    """What one job's share of a delivery did."""

    outcomes: list[str] = field(default_factory=list)  # per alert: accepted | duplicate | stale
    event: dict[str, Any] | None = None  # the event as stored (None when nothing changed)
    opened: bool = False
    changed: bool = False


class Store:
    """The remediator's Redis state (asyncio client; one per process, shared by every request)."""

    def __init__(self, client: aioredis.Redis, prefix: str = "failslow:remediator", replica: str = "",
                 retries: int = 50, audit_max: int = 1_000_000) -> None:
        self.r = client
        self.audit_max = audit_max
        self.prefix = prefix
        self.replica = replica
        self.retries = retries
        self._unlock = client.register_script(_UNLOCK)
        self._renew = client.register_script(_RENEW)
        self._all_seen = client.register_script(_ALL_SEEN)

    @classmethod
    def from_url(cls, url: str, prefix: str, replica: str, timeout_s: float = 5.0,
                 audit_max: int = 1_000_000) -> Store:
        """A store on a new connection pool to `url`."""
        client = aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                         health_check_interval=30)
        return cls(client, prefix, replica, audit_max=audit_max)

    def k(self, *parts: str) -> str:
        """A key under the prefix."""
        return ":".join((self.prefix, *parts))

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        try:
            return await fn()
        except RedisError as exc:
            raise Unavailable(f"redis: {exc}") from exc
        except OSError as exc:
            raise Unavailable(f"redis: {exc}") from exc

    async def _transaction(self, keys: Sequence[str], body: Callable[[Any], Awaitable[T]]) -> T:
        """Run `body(pipe)` under WATCH of `keys` until its MULTI/EXEC goes through (or give up: Unavailable).

        `body` reads in immediate mode, may WATCH more keys, calls ``pipe.multi()`` and queues the writes;
        its return value is returned once EXEC succeeded.
        """
        async def run() -> T:
            for _ in range(self.retries):
                async with self.r.pipeline(transaction=True) as pipe:
                    try:
                        if keys:
                            await pipe.watch(*keys)
                        out = await body(pipe)
                        if pipe.explicit_transaction:
                            await pipe.execute()
                        return out
                    except WatchError:
                        continue
            raise Unavailable("redis: transaction kept conflicting")

        return await self._call(run)

    def _xadd(self, target: Any, fields: dict[str, str]) -> Any:
        """XADD one audit entry on `target` (the client or a pipeline), trimming the stream to about audit_max."""
        if self.audit_max > 0:
            return target.xadd(self.k("audit"), fields, maxlen=self.audit_max, approximate=True)
        return target.xadd(self.k("audit"), fields)

    def _audit_args(self, kind: str, job: str = "", event: str = "", action: str = "",
                    data: dict[str, Any] | None = None, ts: float | None = None) -> dict[str, str]:
        return {"ts": f"{time.time() if ts is None else ts:.3f}", "kind": kind, "job": job, "event": event,
                "action": action, "replica": self.replica, "data": _dumps(data or {})}

    # ------------------------------------------------------------------ plain reads and writes
    async def ping(self) -> None:
        """Raise Unavailable unless Redis answers."""
        await self._call(self.r.ping)

    async def audit(self, kind: str, *, job: str = "", event: str = "", action: str = "",
                    data: dict[str, Any] | None = None) -> str:
        """Append one audit entry; returns its stream id."""
        args = self._audit_args(kind, job, event, action, data)
        sid = await self._call(lambda: self._xadd(self.r, args))
        return sid.decode() if isinstance(sid, bytes) else str(sid)

    async def read_audit(self, count: int = 200, job: str | None = None, before: str | None = None) -> list[dict[str, Any]]:
        """The newest audit entries (newest first), optionally one job's, older than stream id `before`."""
        out: list[dict[str, Any]] = []
        hi = f"({before}" if before else "+"
        while len(out) < count:
            batch = await self._call(lambda hi=hi: self.r.xrevrange(self.k("audit"), max=hi, min="-", count=500))
            if not batch:
                break
            for sid, fields in batch:
                doc = {k.decode(): v.decode() for k, v in fields.items()}
                doc["id"] = sid.decode()
                doc["data"] = json.loads(doc.get("data") or "{}")
                doc["ts"] = float(doc.get("ts", 0))
                if job is None or doc.get("job") == job:
                    out.append(doc)
                    if len(out) >= count:
                        break
            hi = f"({batch[-1][0].decode()}"
        return out

    async def get_event(self, event_id: str) -> dict[str, Any] | None:
        """One event."""
        doc: dict[str, Any] | None = _loads(await self._call(lambda: self.r.get(self.k("event", event_id))))
        return doc

    async def open_events(self) -> dict[str, str]:
        """job -> id of its open event."""
        raw = await self._call(lambda: self.r.hgetall(self.k("open")))
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def list_docs(self, kind: str, limit: int = 100) -> list[dict[str, Any]]:
        """The newest events or actions (``kind`` = event | action), newest first."""
        ids = await self._call(lambda: self.r.zrevrange(self.k(f"{kind}s"), 0, max(0, limit - 1)))
        if not ids:
            return []
        raws = await self._call(lambda: self.r.mget([self.k(kind, i.decode()) for i in ids]))
        return [json.loads(x) for x in raws if x is not None]

    async def get_action(self, action_id: str) -> dict[str, Any] | None:
        """One action."""
        doc: dict[str, Any] | None = _loads(await self._call(lambda: self.r.get(self.k("action", action_id))))
        return doc

    async def get_actions(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        """Several actions (missing ones left out), in the order asked."""
        if not ids:
            return []
        raws = await self._call(lambda: self.r.mget([self.k("action", i) for i in ids]))
        return [json.loads(x) for x in raws if x is not None]

    async def inflight(self) -> dict[str, str]:
        """job -> id of its in-flight action."""
        raw = await self._call(lambda: self.r.hgetall(self.k("inflight")))
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def count_open(self) -> int:
        """Open events."""
        return int(await self._call(lambda: self.r.hlen(self.k("open"))))

    async def started_since(self, job: str, since: float) -> int:
        """Actions of `job` started since `since` (Unix seconds), validations not counted."""
        return int(await self._call(lambda: self.r.zcount(self.k("started", job), since, "+inf")))

    async def job_memory(self, job: str) -> dict[str, Any]:
        """What the remediator remembers of `job` ({} when nothing)."""
        doc = _loads(await self._call(lambda: self.r.get(self.k("job", job))))
        return doc if isinstance(doc, dict) else {}

    async def update_job_memory(self, job: str, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        """Read-modify-write of a job's memory under WATCH."""
        key = self.k("job", job)

        async def body(pipe: Any) -> dict[str, Any]:
            cur = _loads(await pipe.get(key)) or {}
            new = fn(dict(cur))
            pipe.multi()
            pipe.set(key, _dumps(new))
            if new.get("split_changed"):
                pipe.sadd(self.k("tidy"), job)
            else:
                pipe.srem(self.k("tidy"), job)
            return new

        return await self._transaction([key], body)

    async def tidy_jobs(self) -> list[str]:
        """Jobs whose micro-batch split the remediator changed and has not restored yet."""
        raw = await self._call(lambda: self.r.smembers(self.k("tidy")))
        return sorted(x.decode() for x in raw)

    async def costs(self) -> dict[str, dict[str, float]]:
        """Measured costs, ``adapter:strategy`` -> {last_s, ewma_s, n}."""
        raw = await self._call(lambda: self.r.hgetall(self.k("costs")))
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    async def record_cost(self, adapter: str, strategy: str, seconds: float, alpha: float = 0.5) -> None:
        """Fold one measured cost into the adapter's running estimate for `strategy`."""
        key, fld = self.k("costs"), f"{adapter}:{strategy}"

        async def body(pipe: Any) -> None:
            cur = _loads(await pipe.hget(key, fld)) or {}
            n = int(cur.get("n", 0))
            ewma = seconds if n == 0 else alpha * seconds + (1 - alpha) * float(cur["ewma_s"])
            pipe.multi()
            pipe.hset(key, fld, _dumps({"last_s": seconds, "ewma_s": ewma, "n": n + 1}))

        await self._transaction([key], body)

    # ------------------------------------------------------------------ deliveries
    async def ingest(self, job: str, keys: list[str], fingerprints: list[str], now: float, ttl_s: float,
                     apply: Callable[[dict[str, Any] | None, list[int], dict[str, dict[str, Any]]],
                                     tuple[dict[str, Any] | None, list[str], dict[str, dict[str, Any]]]],
                     audit: dict[str, Any]) -> IngestResult:
        """Store one job's share of a delivery exactly once.

        Args:
            job: The training job.
            keys: Delivery key (fingerprint|startsAt|status) of each alert.
            fingerprints: Fingerprint of each alert.
            now: Receipt time.
            ttl_s: How long delivery keys and alert instances are remembered.
            apply: ``(open event, indices of the alerts not seen before, seen instances) -> (event, outcome
                per new alert, instance updates)`` (pure; :func:`remediator.events.apply_alerts`).
            audit: Data of the audit entry of this delivery.
        """
        dkeys = [self.k("dedupe", k) for k in keys]
        akeys = sorted({self.k("alert", f) for f in fingerprints})
        open_key = self.k("open")
        if dkeys:
            dup = IngestResult(outcomes=["duplicate"] * len(keys))
            fields = self._audit_args("delivery", job, data={**audit, "outcomes": dup.outcomes}, ts=now)
            argv = [str(self.audit_max), *(x for kv in fields.items() for x in kv)]
            if await self._call(lambda: self._all_seen(keys=[*dkeys, self.k("audit")], args=argv)):
                return dup

        async def body(pipe: Any) -> IngestResult:
            dup = await pipe.mget(dkeys)
            fresh = [i for i, d in enumerate(dup) if d is None]
            res = IngestResult(outcomes=["duplicate"] * len(keys))
            if not fresh:
                pipe.multi()
                self._xadd(pipe, self._audit_args("delivery", job, data={**audit, "outcomes": res.outcomes}))
                return res
            seen_raw = await pipe.mget(akeys)
            seen = {a.split(":")[-1]: json.loads(v) for a, v in zip(akeys, seen_raw, strict=True) if v is not None}
            ev_id = await pipe.hget(open_key, job)
            event = None
            if ev_id is not None:
                ekey = self.k("event", ev_id.decode())
                await pipe.watch(ekey)
                event = _loads(await pipe.get(ekey))
            new_ev, outs, updates = apply(event, fresh, seen)
            for i, o in zip(fresh, outs, strict=True):
                res.outcomes[i] = o
            res.event, res.changed = new_ev, new_ev is not None and new_ev != event
            res.opened = new_ev is not None and (event is None or new_ev["id"] != event.get("id"))
            pipe.multi()
            for i in fresh:
                pipe.set(dkeys[i], b"1", ex=int(ttl_s))
            for fp, inst in updates.items():
                pipe.set(self.k("alert", fp), _dumps(inst), ex=int(ttl_s))
            if res.changed and new_ev is not None:
                pipe.set(self.k("event", new_ev["id"]), _dumps(new_ev))
                if res.opened:
                    pipe.zadd(self.k("events"), {new_ev["id"]: new_ev["opened_at"]})
                    pipe.hset(open_key, job, new_ev["id"])
            self._xadd(pipe, self._audit_args(
                "delivery", job, new_ev["id"] if new_ev else "", data={**audit, "outcomes": res.outcomes,
                                                                       "opened": res.opened}, ts=now))
            return res

        return await self._transaction([*dkeys, *akeys, open_key], body)

    # ------------------------------------------------------------------ events
    async def create_event(self, event: dict[str, Any]) -> dict[str, Any]:
        """Store a new open event (manual requests), unless the job has one: then that one is returned."""
        open_key = self.k("open")

        async def body(pipe: Any) -> dict[str, Any]:
            cur = await pipe.hget(open_key, event["job"])
            if cur is not None:
                doc: dict[str, Any] = _loads(await pipe.get(self.k("event", cur.decode()))) or {}
                if doc:
                    return doc
            pipe.multi()
            pipe.set(self.k("event", event["id"]), _dumps(event))
            pipe.zadd(self.k("events"), {event["id"]: event["opened_at"]})
            pipe.hset(open_key, event["job"], event["id"])
            self._xadd(pipe, self._audit_args("event", event["job"], event["id"],
                                                        data={"what": "opened", "manual": True}))
            return event

        return await self._transaction([open_key], body)

    async def mutate_event(self, event_id: str, fn: Callable[[dict[str, Any]], dict[str, Any] | None],
                           audit: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Read-modify-write of one event under WATCH; `fn` returns the new document (None: no change).

        Closing the event (``state`` "closed") also frees the job's open slot.
        """
        ekey, open_key = self.k("event", event_id), self.k("open")

        async def body(pipe: Any) -> dict[str, Any] | None:
            cur = _loads(await pipe.get(ekey))
            if cur is None:
                return None
            new = fn(json.loads(json.dumps(cur)))
            if new is None or new == cur:
                return cur
            pipe.multi()
            pipe.set(ekey, _dumps(new))
            if new.get("state") == "closed" and cur.get("state") != "closed":
                pipe.hdel(open_key, new["job"])
            if audit is not None:
                self._xadd(pipe, self._audit_args(audit.pop("kind", "event"), new["job"], event_id,
                                                            audit.pop("action", ""), audit))
            return new

        return await self._transaction([ekey, open_key], body)

    # ------------------------------------------------------------------ actions
    async def create_action(self, action: dict[str, Any], audit: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Store a new action and add it to its event, unless the job already has one in flight.

        Dry-run plans do not take the in-flight slot. An action that will run also counts for the cap.

        Returns:
            (the new action, True) or (the action already in flight, False).
        """
        job = action["job"]
        infl, ekey = self.k("inflight"), self.k("event", action["event_id"])

        async def body(pipe: Any) -> tuple[dict[str, Any], bool]:
            cur = await pipe.hget(infl, job)
            if cur is not None:
                other = _loads(await pipe.get(self.k("action", cur.decode())))
                if other is not None and other.get("state") in ("planned", "pending_approval", "running"):
                    return other, False
            ev = _loads(await pipe.get(ekey))
            pipe.multi()
            pipe.set(self.k("action", action["id"]), _dumps(action))
            pipe.zadd(self.k("actions"), {action["id"]: action["created_at"]})
            if not action.get("dry_run"):
                pipe.hset(infl, job, action["id"])
            if ev is not None:
                ev["actions"] = [*ev.get("actions", []), action["id"]]
                pipe.set(ekey, _dumps(ev))
            self._xadd(pipe, self._audit_args("action", job, action["event_id"], action["id"],
                                                        data={"what": "created", **audit}))
            return action, True

        return await self._transaction([infl, ekey], body)

    async def transition(self, action_id: str, allowed_from: Sequence[str],
                         fn: Callable[[dict[str, Any]], dict[str, Any]], audit: dict[str, Any],
                         ) -> tuple[dict[str, Any] | None, bool]:
        """Move an action to a new state if it is in one of `allowed_from` (approve, reject, run, finish).

        An action leaving the in-flight states frees the job's slot; one entering ``running`` counts for the
        cap and gets a liveness lease (renew it with :meth:`keep_alive`).

        Returns:
            (the action as it is now, whether this call changed it); (None, False) for an unknown id.
        """
        akey, infl = self.k("action", action_id), self.k("inflight")

        async def body(pipe: Any) -> tuple[dict[str, Any] | None, bool]:
            cur = _loads(await pipe.get(akey))
            if cur is None:
                return None, False
            if cur.get("state") not in allowed_from:
                return cur, False
            new = fn(dict(cur))
            pipe.multi()
            pipe.set(akey, _dumps(new))
            if new["state"] not in ("planned", "pending_approval", "running"):
                pipe.hdel(infl, new["job"])
            if new["state"] == "running" and cur.get("state") != "running":
                if new.get("strategy") != "validate":  # a measurement, not an action the hourly cap limits
                    pipe.zadd(self.k("started", new["job"]), {action_id: new.get("started_at") or time.time()})
                pipe.set(self.k("alive", action_id), self.replica, px=int(audit.pop("lease_ms", 30000)))
            self._xadd(pipe, self._audit_args("action", new["job"], new.get("event_id", ""), action_id,
                                                        data={"state": new["state"], **audit}))
            return new, True

        return await self._transaction([akey, infl], body)

    async def keep_alive(self, action_id: str, lease_s: float) -> None:
        """Renew a running action's liveness lease."""
        await self._call(lambda: self.r.set(self.k("alive", action_id), self.replica, px=int(lease_s * 1000)))

    async def alive(self, action_id: str) -> bool:
        """Whether some replica is still executing the action (its lease is live)."""
        return bool(await self._call(lambda: self.r.exists(self.k("alive", action_id))))

    async def update_action(self, action_id: str, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any] | None:
        """Read-modify-write of fields that do not change the state (measured effect, notes)."""
        akey = self.k("action", action_id)

        async def body(pipe: Any) -> dict[str, Any] | None:
            cur = _loads(await pipe.get(akey))
            if cur is None:
                return None
            new = fn(dict(cur))
            new["state"] = cur["state"]
            pipe.multi()
            pipe.set(akey, _dumps(new))
            return new

        return await self._transaction([akey], body)

    # ------------------------------------------------------------------ locks and idempotency
    async def lock(self, job: str, lease_s: float) -> str | None:
        """Take the job's planning lock for `lease_s`; returns its token, or None when another holds it."""
        token = f"{self.replica}:{uuid.uuid4().hex[:8]}"
        ok = await self._call(lambda: self.r.set(self.k("lock", job), token, nx=True, px=int(lease_s * 1000)))
        return token if ok else None

    async def unlock(self, job: str, token: str) -> None:
        """Release the lock if we still hold it."""
        await self._call(lambda: self._unlock(keys=[self.k("lock", job)], args=[token]))

    async def idem_get(self, key: str) -> str | None:
        """The action id an Idempotency-Key already produced."""
        raw = await self._call(lambda: self.r.get(self.k("idem", key)))
        return None if raw is None else raw.decode()

    async def idem_claim(self, key: str, action_id: str, ttl_s: float) -> str:
        """Bind an Idempotency-Key to `action_id` unless already bound; returns the bound action id."""
        ikey = self.k("idem", key)

        async def body(pipe: Any) -> str:
            cur = await pipe.get(ikey)
            if cur is not None:
                return str(cur.decode())
            pipe.multi()
            pipe.set(ikey, action_id, ex=int(ttl_s))
            return action_id

        return await self._transaction([ikey], body)

    async def close(self) -> None:
        """Close the connection pool."""
        await self.r.aclose()

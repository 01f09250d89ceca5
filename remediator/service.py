"""The remediator: deliveries in, events kept, the planner run on its own clock, actions carried out safely.

One :class:`Remediator` per process. Its parts and who calls them:

* :meth:`Remediator.ingest` — the webhook route, for every Alertmanager delivery: stores what is new exactly
  once (the store's WATCH transaction on the delivery keys) and wakes the planner for a job whose event
  opened or whose suspects changed. A repeat changes nothing.
* :meth:`Remediator.run` — the planner loop: every ``tick_s`` (and at once when woken) it takes each job
  with an open event under the job's lock (one replica plans a job at a time), reads the job's pace from
  Prometheus and its shape from its adapter, accrues the slowdown since onset, recovers actions whose
  replica died, judges finished actions once the cooldown passed and the readings show them, closes the
  event when the alert resolved and the pace is confirmed back, and asks :func:`failslow.plan.policy.decide`
  what to do.
* :meth:`Remediator.remediate`, :meth:`approve`, :meth:`reject` — the manual API.
* actions run in worker threads (adapter calls block); a running action holds a liveness lease in Redis
  that its replica renews, so a replica killed mid-action is noticed and its action recovered through the
  adapter (:meth:`TrainingAdapter.recover`) — never started again.

Dry-run (the default mode) plans and audits every decision the auto mode would act on, and acts on nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from failslow.errors import InputError
from failslow.plan.pace import (
    SLOW_CELL_MULTIPLE,
    PaceModel,
    fit,
    healthy_calibration,
    slow_ranks,
)
from failslow.plan.placement import PlacementParams, plan_topology, suspect_slowness
from failslow.plan.policy import (
    IN_FLIGHT,
    LEVEL,
    Costs,
    Decision,
    EventView,
    JobView,
    PastAction,
    Suspect,
    TopologyOption,
    accrue,
    decide,
    judge,
    recovered,
    restore,
    signature,
    verdict_for,
)
from failslow.topology import Layout
from remediator.adapters import build
from remediator.adapters.base import (
    ActionOutcome,
    ActionRequest,
    AdapterError,
    ConfigError,
    JobInfo,
    TrainingAdapter,
)
from remediator.config import RemediatorConfig
from remediator.events import apply_alerts, new_event
from remediator.metrics import RemediatorMetrics
from remediator.observe import JobObservation, Prometheus, PromUnavailable, RankSample
from remediator.payload import Alert, Notification, RemediateRequest
from remediator.settings import Settings
from remediator.store import Store, Unavailable, new_id

log = logging.getLogger("failslow.remediator")


class RequestRefused(Exception):
    """A manual request that cannot be carried out: HTTP status and a JSON body for the answer."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("detail", ""))
        self.status, self.body = status, body


def _suspects(doc: list[dict[str, Any]]) -> tuple[Suspect, ...]:
    return tuple(Suspect(s.get("kind", ""), s.get("rank"), s.get("node", "")) for s in doc)


def named_suspects(suspects: tuple[Suspect, ...], nodes: Sequence[str]) -> tuple[Suspect, ...]:
    """Suspects with their node as the adapter names it: an exporter labels a node by its index in the job
    (``FAILSLOW_NODE_ID``, ``SLURM_NODEID``, ``GROUP_RANK``) when the launcher gives one, so a label that is
    not a node name but an index into `nodes` becomes that node's name."""
    names = set(nodes)
    out = []
    for s in suspects:
        node = s.node
        if node and node not in names and node.isdigit() and int(node) < len(nodes):
            node = nodes[int(node)]
        out.append(s if node == s.node else replace(s, node=node))
    return tuple(out)


def with_slow_ranks(suspects: tuple[Suspect, ...], slow: Sequence[dict[str, Any]]) -> tuple[Suspect, ...]:
    """The detector's suspects and the ranks whose own compute shows them slow (the event's ``pace_suspects``,
    `failslow.plan.pace.slow_ranks`) that it did not name: a straggler behind a slower one in its replica
    leaves the replica's pace, all the detector judges ranks by, unchanged. Validation then benchmarks them
    like any suspect (a named rank it did not measure leaves no verdict standing)."""
    named = {s.rank for s in suspects if s.kind == "compute"}
    return (*suspects, *(s for s in _suspects(list(slow)) if s.rank not in named))


HEALTHY_WINDOW_S = 120.0   # the healthy pace: this long before the onset ...
HEALTHY_SETTLE_S = 10.0    # ... starting at least this long after the job's previous event closed ...
HEALTHY_LEAST_S = 30.0     # ... and at least this long, else the previous event's healthy pace stands


def healthy_window(onset: float, last_closed: dict[str, Any] | None) -> tuple[float, float] | None:
    """Where to measure a new event's healthy pace: ``(end, seconds)`` of the window before `onset`, or None
    when the job's previous event (`last_closed`: its ``closed_at``) closed too recently to leave
    ``HEALTHY_LEAST_S`` of clean iterations — the window would hold that event's slow iterations (a compound
    fault read a 1.05 s "healthy" pace on a 0.67 s job that way, and accrued no loss)."""
    end = onset - 5.0
    start = end - HEALTHY_WINDOW_S
    closed = (last_closed or {}).get("closed_at")
    if closed is not None:
        start = max(start, float(closed) + HEALTHY_SETTLE_S)
    if end - start < HEALTHY_LEAST_S:
        return None
    return end, end - start


def compute_window(since: float, pace_s: float, now: float, lag_iterations: int, longest_s: float) -> float | None:
    """Seconds to average each rank's compute reading over now, or None for the newest reading alone.

    A reading is the mean over the exporter's last `lag_iterations` iterations, so it is clean of what came
    before `since` (the onset, or the end of the event's last action: another split, a pause) only that many
    iterations of `pace_s` later. From then to `now`, at most `longest_s`, the mean of the readings holds
    fewer of the swings of tens of seconds a single window follows: on the testbed, three replicas behind
    the same CPU quota read 0.901, 0.947 and 0.950 s at one decision and 0.967, 0.982 and 1.002 s averaged
    over the 25 s before it. A split priced on such a swing gives the replica that happened to read fast
    micro-batches it cannot take.
    """
    if longest_s <= 0 or not (pace_s > 0 and math.isfinite(pace_s)):
        return None
    span = min(longest_s, now - (since + lag_iterations * pace_s))
    return span if span >= 1.0 else None


COMPUTE_RECENT_MIN_S = 10.0  # the newest stretch a rank's change is judged on is at least this long


def settled_ranks(window: Sequence[RankSample], earlier: Sequence[RankSample], recent: Sequence[RankSample],
                  shift: float) -> tuple[list[RankSample], dict[int, tuple[float, float]]]:
    """Each rank's compute reading for the pace model, and the ranks that changed inside the window (each with
    its means before and over the newest stretch).

    A rank's reading is its mean over the whole window (`window`) unless its mean over the newest stretch
    (`recent`) differs from its mean before it (`earlier`) by more than `shift` (a share of the earlier mean):
    the rank changed after the window began (the straggler recovered, or another rank slowed) and its newest
    stretch stands for it. Without this the window's mean holds the old speed for up to its whole length: on
    the testbed (DP2xPP2, one rank 3.3x slower for 110 s) the split [7, 1] was first re-tuned 28 s after the
    fault ended, on a mean still two-thirds fault, and was even again 75 s after it; with the newest stretch
    the first re-tuning came 15-16 s after it. A swing of a few seconds moves the newest stretch's mean by a
    fraction of its size and stays averaged.
    """
    before = {r.rank: r.compute_s for r in earlier}
    now = {r.rank: r for r in recent}
    out, changed = [], {}
    for r in window:
        b, n = before.get(r.rank), now.get(r.rank)
        if b is not None and n is not None and b > 0 and abs(n.compute_s - b) > shift * b:
            out.append(replace(r, compute_s=n.compute_s, outside_s=n.outside_s))
            changed[r.rank] = (b, n.compute_s)
        else:
            out.append(r)
    return out, changed


def _compute_basis(upd: dict[str, Any]) -> dict[str, Any]:
    """What a pass's compute readings were, for an action's prediction: the seconds they were averaged over
    (None: the newest readings) and the ranks whose newest stretch stood for them (:func:`settled_ranks`)."""
    return {"compute_window_s": upd.get("compute_window_s"),
            "compute_changed_ranks": upd.get("compute_changed_ranks", [])}


def _model_basis(model: PaceModel | None) -> dict[str, Any]:
    """The pace model an action's prediction came from: each replica's seconds per micro-batch per stage
    (after the healthy floor), each one's once-per-iteration work (None where the exporter did not tell it),
    its fixed part ``F`` and the split the cells were measured under (None without a model)."""
    if model is None:
        return {"model_per_mb_s": None, "model_step_s": None, "model_overhead_s": None, "model_counts": None}
    return {"model_per_mb_s": [[round(float(x), 6) for x in row] for row in model.per_mb],
            "model_step_s": None if model.step is None else [[round(float(x), 6) for x in row] for row in model.step],
            "model_overhead_s": round(float(model.overhead_s), 6), "model_counts": list(model.microbatches)}


def healthy_estimate(before: float | None, detector_baseline: float | None) -> float | None:
    """A new event's healthy pace: the pace measured `before` its onset (or the previous event's), and the
    healthy level the detector measures the slowdown against; the lower of the two that are known.

    The window before the onset can read slow iterations as healthy: it can hold the exporter's first
    iterations (a period still being learnt) or, when the previous event closed too recently to leave a clean
    window, that event's healthy pace is taken over (a compound run read 0.479 s on a 0.35 s job and then
    judged a restart to 0.479 s not worth it). The detector's baseline is the mean of the run before its change
    point, the same series over the same stretch when all goes well. A slow stretch makes either too high,
    never too low. Not the pace now over the detector's ratio: the two are read at different moments (a scrape
    and a poll apart), and a pace falling meanwhile (the first split acts at once) puts the estimate under
    the healthy pace, after which the job is never confirmed back.
    """
    known = [x for x in (before, detector_baseline) if x is not None and x > 0 and math.isfinite(x)]
    return min(known) if known else None


def topology_options(job: str, info: JobInfo, suspects: tuple[Suspect, ...], model: PaceModel | None,
              pace: float | None, validated: dict[str, Any] | None = None,
              healthy: float | None = None, rebalance: bool = False,
              known_paths: Sequence[Sequence[Any]] = (),
              healthy_counts: Sequence[int] | None = None,
              stage_s: Sequence[float] | None = None,
              overhead_s: float | None = None) -> tuple[TopologyOption, ...]:
    """S3 placements for the planner: the suspects' slowness scored by the topology planner (empty when the
    job's shape is unknown, nothing is suspected, or the plan refused).

    Once a validation measured the links (`validated`: the nodes it convicted and the slow paths between
    nodes it did not), those replace the detector's link suspects: a path is moved, not a whole NIC guessed.
    The planner's model is calibrated on the healthy pace when it is known (under `healthy_counts`, the split
    it was measured with; the current one by default). Only links slow: their share is what a validation
    measured. Compute suspects: their factors are scaled together until the current placement predicts the
    pace now (:func:`failslow.plan.placement.fit_slowness`), so a move that loads the healthy replicas is
    priced at the healthy speed; without the healthy pace the model is calibrated on the pace now. With
    `rebalance` (the adapter can also set the split) every placement is scored under its own best micro-batch
    split, which the topology action then applies: slow GPUs gathered into one replica pay only that way.
    `known_paths` are slow paths earlier validations of the job measured (:func:`remember_paths`): a move made
    for this event must not put traffic back onto them. `stage_s` and `overhead_s` are the job's own healthy
    seconds per micro-batch of each stage and fixed part (the pace model's healthy calibration): they replace
    the planner's default compute shape (see :func:`placement_params`).
    """
    if validated is not None:
        suspects = (*(s for s in suspects if s.kind != "link"),
                    *(Suspect("link", None, str(n)) for n in validated.get("nodes") or []))
    paths = [p for p in (validated or {}).get("paths") or [] if len(p) == 3]
    mine = {frozenset(p[:2]) for p in paths}
    paths += [p for p in known_paths if len(p) == 3 and frozenset(p[:2]) not in mine]
    if not (suspects or paths) or not info.layout or not info.placement:
        return ()
    try:
        layout = Layout.from_mapping(info.layout)
        slow_ranks, slow_links = suspect_slowness(layout, suspects, info.nodes, model)
        for a, b, share in paths:
            if a in info.nodes and b in info.nodes and a != b:
                key = (info.nodes.index(a), info.nodes.index(b))
                slow_links[key] = min(float(share), slow_links.get(key, 1.0))
        if not slow_ranks and not slow_links:
            return ()
        params = placement_params(info, validated, stage_s, overhead_s)
        plan = plan_topology(layout, info.placement, slow_ranks=slow_ranks, slow_links=slow_links, params=params,
                             iteration_s=pace, healthy_s=healthy, rebalance=rebalance and bool(info.microbatches),
                             healthy_counts=healthy_counts)
    except InputError as exc:
        log.info("job %s: no topology plan: %s", job, exc)
        return ()
    log.info("job %s: topology plan: %s", job, plan.reason)
    return plan.options()


def remember_paths(known: Sequence[Sequence[Any]], measured: Sequence[str], found: Sequence[Sequence[Any]] | None
                   ) -> list[list[Any]]:
    """The job's known slow paths after a link validation: those it found slow (``[a, b, share]``) replace
    what was known of the same pair; a known path between two nodes it measured and did not find slow is
    forgotten (the path healed); the rest stay (what it did not measure is still as last measured)."""
    found = [list(p) for p in found or [] if len(p) == 3]
    seen = {frozenset(p[:2]) for p in found}
    nodes = set(measured)
    kept = [list(p) for p in known if len(p) == 3 and frozenset(p[:2]) not in seen
            and not (p[0] in nodes and p[1] in nodes)]
    return kept + found


def _cleared(ev: dict[str, Any], verdict: bool | None) -> frozenset[str]:
    """Nodes the event's link validation measured and did not convict (while its verdict stands)."""
    targets = ev.get("validated_targets") or {}
    if verdict is None or not targets.get("nodes"):
        return frozenset()
    convicted = set((ev.get("validated_links") or {}).get("nodes") or [])
    return frozenset(str(n) for n in targets["nodes"] if n not in convicted)


def standing_suspects(suspects: tuple[Suspect, ...], ev: dict[str, Any], verdict: bool | None) -> tuple[Suspect, ...]:
    """The suspects less the ranks the event's compute validation benchmarked and cleared (while its verdict
    stands): a restart does not move a rank whose device measured healthy."""
    found = ev.get("validated_links") or {}
    targets = ev.get("validated_targets") or {}
    if not verdict or "ranks" not in found or not targets.get("ranks"):
        return suspects
    cleared = set(targets["ranks"]) - set(found["ranks"])
    return tuple(s for s in suspects if not (s.kind == "compute" and s.rank in cleared))


def placement_params(info: JobInfo, validated: dict[str, Any] | None, stage_s: Sequence[float] | None = None,
                     overhead_s: float | None = None) -> PlacementParams:
    """The S3 planner's traffic and time model for this job: its micro-batch split, the bytes it moves (when
    the adapter knows them), the link bandwidth a validation measured on the healthy links, and the compute
    shape measured on the healthy job: `stage_s` (seconds per micro-batch of each stage, one per stage) as the
    stages' compute with no edge-stage weight (the measurement holds what the first and last stage add) and
    `overhead_s` as the fixed part; the defaults otherwise. The planner still fits one scale to the pace."""
    kw: dict[str, Any] = {}
    pp = int((info.layout or {}).get("pp") or 0)
    if stage_s is not None and pp and len(stage_s) == pp and all(
            isinstance(x, int | float) and x > 0 and math.isfinite(x) for x in stage_s):
        kw["compute_s"], kw["edge_stage_weight"] = tuple(float(x) for x in stage_s), 1.0
        if overhead_s is not None and overhead_s >= 0 and math.isfinite(overhead_s):
            kw["overhead_s"] = float(overhead_s)
    if info.microbatches:
        kw["microbatches"] = tuple(int(m) for m in info.microbatches)
    for key in ("grad_bytes", "p2p_bytes", "tp_bytes"):
        v = info.traffic.get(key)
        if isinstance(v, list | tuple) and v:
            kw[key] = tuple(float(x) for x in v)
        elif isinstance(v, int | float) and not isinstance(v, bool):
            kw[key] = float(v)
    bw = (validated or {}).get("link_bw_Bps")
    if isinstance(bw, int | float) and bw > 0:
        kw["link_bw"] = float(bw)
    return PlacementParams(**kw)


def _past(actions: list[dict[str, Any]], dry_run_mode: bool) -> tuple[PastAction, ...]:
    # Dry-run plans walk the ladder only while planning dry: once a person switches to auto, an event planned
    # dry is acted on from the bottom rung.
    return tuple(PastAction(a["strategy"], a["state"], bool(a.get("dry_run")), a.get("ended_at"),
                            (a.get("measured") or {}).get("effective"), a.get("params") or {},
                            (a.get("predicted") or {}).get("pace_before_s"),
                            (a.get("measured") or {}).get("pace_after_s"))
                 for a in actions if dry_run_mode or not a.get("dry_run"))


def _decision_key(d: Decision) -> str:
    return f"{d.strategy}:{d.reason.split(' ')[0]}"


class Remediator:
    """The service's state machine; dependencies are passed in (production ones built by :func:`build_service`)."""

    def __init__(self, settings: Settings, config: RemediatorConfig, store: Store, prom: Prometheus,
                 metrics: RemediatorMetrics, clock: Callable[[], float] = time.time) -> None:
        self.settings, self.config, self.store, self.prom = settings, config, store, prom
        self.metrics, self.clock = metrics, clock
        self.auto = settings.mode == "auto"
        self.metrics.auto.set(1 if self.auto else 0)
        self._adapters: dict[str, TrainingAdapter | None] = {}
        self._adapter_errors: dict[str, str] = {}
        self._executing: dict[str, asyncio.Task[None]] = {}
        self._kicked: list[str] = []
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._last_full = 0.0
        self.prom_ok: bool | None = None  # whether Prometheus answered the last query (None: not asked yet)

    # ================================================================== deliveries
    async def ingest(self, note: Notification) -> dict[str, Any]:
        """Store one Alertmanager delivery; returns what became of each alert.

        Raises:
            Unavailable: Redis is away (the route answers 503; Alertmanager retries).
        """
        now = self.clock()
        by_job: dict[str, list[Alert]] = {}
        unlabelled = 0
        for a in note.alerts:
            job = a.labels.get("job", "")
            if job:
                by_job.setdefault(job, []).append(a)
            else:
                unlabelled += 1
        outcomes: list[str] = []
        events: list[str] = []
        try:
            for job, alerts in by_job.items():
                ids: list[str] = []  # the id a new event would take, made once a delivery holds a new alert

                def apply(ev: dict[str, Any] | None, fresh: list[int], seen: dict[str, dict[str, Any]],
                          alerts: list[Alert] = alerts, ids: list[str] = ids,
                          ) -> tuple[dict[str, Any] | None, list[str], dict[str, dict[str, Any]]]:
                    if not ids:
                        ids.append(new_id("ev"))
                    return apply_alerts(ev, [alerts[i] for i in fresh], seen, now, ids[0])

                audit = {"status": note.status, "receiver": note.receiver, "group_key": note.group_key,
                         "truncated_alerts": note.truncated_alerts,
                         "alerts": [{"fingerprint": a.fingerprint, "status": a.status, "starts_at": a.starts_at_s,
                                     "alertname": a.labels.get("alertname", ""),
                                     "suspect": {k: a.labels[k] for k in ("kind", "rank", "node") if k in a.labels}}
                                    for a in alerts[:50]]}
                res = await self.store.ingest(job, [a.key for a in alerts], [a.fingerprint for a in alerts], now,
                                              self.settings.dedupe_ttl_s, apply, audit)
                outcomes.extend(res.outcomes)
                if res.event is not None:
                    events.append(res.event["id"])
                if res.changed:
                    self.kick(job)
        except Unavailable:
            self.metrics.redis_up.set(0)
            self.metrics.deliveries.labels("unavailable").inc()
            raise
        self.metrics.redis_up.set(1)
        if "accepted" in outcomes:
            overall = "accepted"
        elif "stale" in outcomes:
            overall = "stale"
        else:
            overall = "duplicate"
        self.metrics.deliveries.labels(overall).inc()
        return {"outcome": overall, "alerts": outcomes, "events": sorted(set(events)),
                "ignored_without_job_label": unlabelled}

    def kick(self, job: str) -> None:
        """Plan `job` now rather than at the next tick."""
        if job not in self._kicked:
            self._kicked.append(job)
        self._wake.set()

    # ================================================================== the planner loop
    async def run(self) -> None:
        """Plan every open event each ``tick_s`` (and kicked jobs at once) until :meth:`stop`."""
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.settings.tick_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            jobs, self._kicked = list(self._kicked), []
            try:
                if time.monotonic() - self._last_full >= self.settings.tick_s or not jobs:
                    self._last_full = time.monotonic()
                    open_ev = await self.store.open_events()
                    tidy = await self.store.tidy_jobs()
                    self.metrics.open_events.set(len(open_ev))
                    jobs += [j for j in [*open_ev, *tidy] if j not in jobs]
                    if not jobs:
                        await self._probe_prometheus()
                self.metrics.redis_up.set(1)
            except Unavailable as exc:
                self.metrics.redis_up.set(0)
                log.warning("planner: %s", exc)
                continue
            for job in jobs:
                if self._stop.is_set():
                    break
                try:
                    await self.plan_job(job)
                except Unavailable as exc:
                    self.metrics.redis_up.set(0)
                    log.warning("planner: job %s postponed: %s", job, exc)
                except Exception:  # one job's bug must not stop planning for the others
                    log.exception("planner: job %s failed", job)

    async def stop(self, grace_s: float = 20.0) -> None:
        """Stop planning; give running actions `grace_s` to finish (their leases cover the rest)."""
        self._stop.set()
        self._wake.set()
        running = list(self._executing.values())
        if running:
            await asyncio.wait(running, timeout=grace_s)

    async def plan_job(self, job: str) -> Decision | None:
        """One planner pass over `job` under its lock; returns the decision (None: nothing to plan)."""
        token = await self.store.lock(job, self.settings.lock_lease_s)
        if token is None:
            return None  # another replica is planning this job
        try:
            eid = (await self.store.open_events()).get(job)
            ev = await self.store.get_event(eid) if eid else None
            if ev is None or ev.get("state") != "open":
                await self._tidy(job)
                return None
            return await self._plan_event(ev)
        finally:
            await self.store.unlock(job, token)

    # ------------------------------------------------------------------ adapters
    def adapter_for(self, job: str, labels: dict[str, str]) -> TrainingAdapter | None:
        """The job's adapter from the config (None: no rule covers the job, or its options are bad)."""
        if job in self._adapters:
            return self._adapters[job]
        rule = self.config.rule_for(job)
        adapter: TrainingAdapter | None = None
        if rule is not None:
            try:
                adapter = build(rule.adapter, job, labels, rule.options)
            except ConfigError as exc:
                self._adapter_errors[job] = f"adapter {rule.adapter}: {exc}"
                log.error("job %s: %s", job, self._adapter_errors[job])
        self._adapters[job] = adapter
        return adapter

    async def _info(self, adapter: TrainingAdapter | None) -> JobInfo | None:
        if adapter is None:
            return None
        try:
            return await asyncio.to_thread(adapter.info)
        except AdapterError as exc:
            log.warning("adapter %s: info: %s", adapter.kind, exc)
            return None

    async def _observe(self, job: str, now: float) -> JobObservation | None:
        try:
            obs = await asyncio.to_thread(self.prom.observe, job, now)
        except PromUnavailable as exc:
            self.metrics.prom_up.set(0)
            if self.prom_ok is not False:  # say it when it goes away, not at every tick
                log.warning("prometheus unavailable (no pace until it answers): %s", exc)
            self.prom_ok = False
            return None
        self.metrics.prom_up.set(1)
        self.prom_ok = True
        return obs

    async def _probe_prometheus(self) -> None:
        """With nothing to plan, still find out whether Prometheus answers (its metric and the page say so)."""
        try:
            await asyncio.to_thread(self.prom.query, "vector(1)")
        except PromUnavailable as exc:
            if self.prom_ok is not False:
                log.warning("prometheus unavailable: %s", exc)
            self.prom_ok = False
            self.metrics.prom_up.set(0)
            return
        self.prom_ok = True
        self.metrics.prom_up.set(1)

    async def _costs(self, adapter: TrainingAdapter | None, info: JobInfo | None) -> Costs:
        """Defaults < the adapter's estimate for the job < the config file's costs < costs measured here."""
        expected = info.costs if info is not None else {}
        if adapter is None:
            return self.config.costs.layered(self.config.costs_given, expected, {})
        measured = {k.split(":", 1)[1]: v["ewma_s"] for k, v in (await self.store.costs()).items()
                    if k.startswith(f"{adapter.kind}:")}
        # a topology move and a restart are both a checkpoint-restart: until one of them is measured on this
        # cluster, the other's measurement stands for it
        for a, b in (("topology", "restart"), ("restart", "topology")):
            if a in measured and b not in measured:
                measured[b] = measured[a]
        return self.config.costs.layered(self.config.costs_given, expected, measured)

    # ------------------------------------------------------------------ one event
    async def _inputs(self, ev: dict[str, Any], now: float, suspects: tuple[Suspect, ...] | None = None
                      ) -> tuple[JobView, dict[str, Any], Costs, list[dict[str, Any]], TrainingAdapter | None]:
        """Measure everything the planner needs for `ev` (S3 placements scored for `suspects`, by default the
        event's); returns the job view, the event fields to store, the costs, the event's actions and the
        adapter."""
        job = ev["job"]
        adapter = self.adapter_for(job, ev.get("labels") or {})
        obs = await self._observe(job, now)
        info = await self._info(adapter)
        upd: dict[str, Any] = {}
        onset = float(ev["onset"])
        if obs is not None and obs.onset_ts is not None and ev.get("onset_source") != "detector" and not ev.get("manual"):
            onset, upd["onset"], upd["onset_source"] = obs.onset_ts, obs.onset_ts, "detector"
        memory = await self.store.job_memory(job)
        last = memory.get("last_closed")
        if last is not None and last.get("event") == ev["id"]:
            last = None
        healthy_span = healthy_window(onset, last)
        healthy, measured_healthy = ev.get("healthy_s"), None
        if healthy is None and obs is not None:
            if healthy_span is None:
                healthy = (last or {}).get("healthy_s")
            else:
                with contextlib.suppress(PromUnavailable):
                    healthy = measured_healthy = await asyncio.to_thread(self.prom.healthy_pace, job, *healthy_span)
            healthy = healthy_estimate(healthy, obs.detector_baseline_s)
            if healthy is not None:
                upd["healthy_s"] = healthy
        pace = obs.pace_s if obs is not None and obs.current(self.settings.stale_after_s) else None
        upd["pace_s"] = pace
        upd["ratio"] = None if pace is None or not healthy else pace / healthy
        upd["lost_s"] = accrue(float(ev.get("lost_s") or 0.0), float(ev.get("last_tick") or onset), now, pace, healthy)
        upd["last_tick"] = now
        upd["last_seen_series"] = now if obs is not None and obs.last_iteration_ts is not None else ev.get("last_seen_series")
        if info is not None:
            upd["info"] = info.to_json()
        if adapter is not None:
            upd["adapter"] = adapter.kind
        if info is not None and info.microbatches and not ev.get("microbatches_at_onset"):
            upd["microbatches_at_onset"] = list(info.microbatches)
        actions = await self.store.get_actions(ev.get("actions") or [])
        ended = [float(a["ended_at"]) for a in actions if a.get("ended_at") and not a.get("dry_run")]
        window = None if pace is None else compute_window(max([onset, *ended]), pace, now,
                                                          self.settings.exporter_window_iterations,
                                                          self.settings.compute_average_s)
        changed: dict[int, tuple[float, float]] = {}
        if window is not None and obs is not None and obs.ranks:
            with contextlib.suppress(PromUnavailable):
                averaged = await asyncio.to_thread(self.prom.ranks, job, None, window)
                recent = max(COMPUTE_RECENT_MIN_S, self.settings.exporter_window_iterations * (pace or 0.0))
                if averaged and window >= 2 * recent:
                    earlier = await asyncio.to_thread(self.prom.ranks, job, now - recent, window - recent)
                    newest = await asyncio.to_thread(self.prom.ranks, job, None, recent)
                    averaged, changed = settled_ranks(averaged, earlier, newest, self.settings.compute_shift)
                    if changed:
                        log.info("job %s: ranks changed inside the %.0f s compute window, their last %.0f s stand "
                                 "for them: %s", job, window, recent,
                                 ", ".join(f"{k} {b:.3f} -> {n:.3f} s" for k, (b, n) in sorted(changed.items())))
                if averaged:
                    obs = replace(obs, ranks=averaged)
        upd["compute_window_s"], upd["compute_changed_ranks"] = window, sorted(changed)
        f0, floor, step0 = ev.get("overhead_s"), ev.get("healthy_stage_s"), ev.get("healthy_step_s")
        if f0 is None and healthy is not None and obs is not None:
            calibrated = await self._healthy_calibration(
                job, onset, healthy_span, measured_healthy, healthy,
                ev.get("microbatches_at_onset") or upd.get("microbatches_at_onset"))
            if calibrated is not None:
                f0, floor, step0 = calibrated
                upd["overhead_s"], upd["healthy_stage_s"], upd["healthy_step_s"] = f0, list(floor), step0
        model: PaceModel | None = None
        if pace is not None and info is not None and info.microbatches and obs is not None and obs.ranks:
            ranks = obs.computes
            stages = 1 + max(r.pp for r in ranks)
            floor_here = floor if floor and len(floor) == stages else None
            try:  # a floor measured with another pipeline depth does not apply
                model = fit(ranks, info.microbatches, pace, f0, impute=True, floor=floor_here)
                node_of = {r.rank: r.node for r in obs.ranks}
                upd["pace_suspects"] = [{"kind": "compute", "rank": r, "node": node_of.get(r, "")}
                                        for r in slow_ranks(ranks, info.microbatches, floor_here or ())]
                named = {x.get("rank") for x in ev.get("suspects") or [] if x.get("kind") == "compute"}
                if unnamed := [x["rank"] for x in upd["pace_suspects"] if x["rank"] not in named]:
                    log.info("job %s: ranks %s compute >= %.1fx their stage's healthy time and are suspects too",
                             job, unnamed, SLOW_CELL_MULTIPLE)
            except InputError as exc:
                log.info("job %s: no pace model: %s", job, exc)
        inef = frozenset(s for s, until in (memory.get("ineffective") or {}).items() if until > now)
        view = JobView(
            now=now, pace_s=pace, healthy_s=healthy, model=model,
            microbatches=tuple(info.microbatches) if info is not None and info.microbatches else None,
            default_microbatches=tuple(memory["default_microbatches"])
            if memory.get("split_changed") and memory.get("default_microbatches") else None,
            placement=tuple(info.placement) if info is not None and info.placement else None,
            nodes=tuple(info.nodes) if info is not None else (),
            spares=len(info.spare_nodes) if info is not None and info.spare_nodes is not None else None,
            capabilities=adapter.capabilities() if adapter is not None else frozenset(),
            ineffective=inef,
            actions_last_hour=await self.store.started_since(job, now - 3600.0),
            settling=await self._settling(job, actions, pace, now),
        )
        upd["settling"] = view.settling
        if adapter is not None and info is not None and "topology" in view.capabilities:
            base = _suspects(ev.get("suspects") or []) if suspects is None else suspects
            found = named_suspects(with_slow_ranks(base, upd.get("pace_suspects") or []), info.nodes)
            view = replace(view, topology=await asyncio.to_thread(
                topology_options, job, info, found, model, pace, validated=ev.get("validated_links"),
                healthy=healthy, rebalance="rebalance" in view.capabilities,
                known_paths=memory.get("slow_paths") or (), healthy_counts=view.default_microbatches,
                stage_s=floor, overhead_s=None if f0 is None else f0 + (step0 or 0.0)))
        return view, upd, await self._costs(adapter, info), actions, adapter

    async def _settling(self, job: str, actions: list[dict[str, Any]], pace: float | None, now: float) -> str | None:
        """Why the job's pace does not show its latest action yet (see `JobView.settling`), or None.

        The exporters' readings are means over their last `exporter_window_iterations` iterations: they show an
        action once that many iterations (and one more, the one it applied in) were reported after it. Counted
        by the ranks' iteration counters from their first scrape after the action (their median); without a
        counter, estimated at the current pace. (A cooldown in seconds alone does not scale with the job: at 5 s
        per iteration and the default 20, a 60 s cooldown would judge readings 40% of which came before it.)
        """
        need = self.settings.exporter_window_iterations
        ran = [a for a in actions if a.get("ended_at") and not a.get("dry_run") and a["strategy"] != "validate"
               and a["state"] in ("succeeded", "failed")]
        if need <= 0 or not ran or pace is None:
            return None
        last = max(ran, key=lambda a: float(a["ended_at"]))
        if (last.get("measured") or {}).get("judged_at"):
            return None  # judged: it settled first
        need += 1
        since = float(last["ended_at"])
        try:
            n = await asyncio.to_thread(self.prom.iterations_since, job, since, now)
        except PromUnavailable:
            n = None
        if n is not None:
            return None if n >= need else f"{n:.0f} of {need} iterations reported since the last action"
        waited, wait = now - since, need * pace
        return None if waited >= wait else f"{waited:.0f} of ~{wait:.0f} s ({need} iterations) since the last action"

    async def _healthy_calibration(self, job: str, onset: float, window: tuple[float, float] | None,
                                   window_pace: float | None, healthy: float, microbatches: list[int] | None
                                   ) -> tuple[float, tuple[float, ...], float] | None:
        """The pace model's fixed part ``F``, each stage's time per micro-batch (the floor of its cells) and
        the replicas' once-per-iteration work (:func:`healthy_step`; 0 where the exporter does not tell it),
        measured on the healthy job before the onset: each rank's median reading and the pace over `window`,
        the ``(end, seconds)`` the healthy pace is measured in (:func:`healthy_window`; `window_pace`: the pace
        already read there, None to read it), as a single reading is the exporter's mean over its last
        iterations and swings, and a median is not moved by a few readings unlike the rest (the job's first
        iterations); else the readings 5 s before the onset and `healthy` (None: no data)."""
        if not microbatches:
            return None
        try:
            samples, pace = [], None
            if window is not None:
                samples = await asyncio.to_thread(self.prom.ranks, job, window[0], window[1], median=True)
                pace = window_pace if window_pace is not None else \
                    await asyncio.to_thread(self.prom.healthy_pace, job, *window)
            if not samples or pace is None:
                samples, pace = await asyncio.to_thread(self.prom.ranks, job, onset - 5.0), healthy
            ranks = [r.compute() for r in samples]
            return healthy_calibration(ranks, microbatches, pace)
        except (PromUnavailable, InputError) as exc:
            log.info("job %s: no healthy calibration: %s", job, exc)
            return None

    async def _plan_event(self, ev: dict[str, Any]) -> Decision:
        now = self.clock()
        job = ev["job"]
        view, upd, costs, actions, adapter = await self._inputs(ev, now)
        policy = self.config.policy
        for a in actions:
            if a["state"] == "running" and a["id"] not in self._executing and not await self.store.alive(a["id"]):
                await self._recover(a, adapter)
            elif (a["state"] == "succeeded" and not a.get("dry_run") and a["strategy"] != "validate"
                  and (a.get("measured") or {}).get("effective") is None and a.get("ended_at")
                  and now - a["ended_at"] >= policy.cooldown_s and view.pace_s is not None
                  and view.settling is None):
                await self._judge(a, view.pace_s)
        actions = await self.store.get_actions(ev.get("actions") or [])
        if any(a["strategy"] == "validate" and a.get("ended_at") for a in actions):
            # a validation's verdict lands on the event before its action ends: one that ended after this pass
            # read the event left a verdict the pass has not seen (nor scored S3 with): plan again with it
            fresh = await self.store.get_event(ev["id"])
            if fresh is not None and any(fresh.get(k) != ev.get(k) for k in ("validated", "validated_links")):
                self.kick(job)
                return Decision("ignore", "a validation's verdict landed during planning: planning again", wait=True)
        suspects = named_suspects(with_slow_ranks(_suspects(ev.get("suspects") or []), upd.get("pace_suspects") or []),
                                  view.nodes)
        verdict = verdict_for(ev.get("validated"), ev.get("validated_targets"), suspects)
        ev_view = EventView(job=job, onset_ts=float(upd.get("onset", ev["onset"])), firing=bool(ev.get("firing")),
                            suspects=standing_suspects(suspects, ev, verdict), lost_s=float(upd["lost_s"]), validated=verdict,
                            cleared=_cleared(ev, verdict), actions=_past(actions, not self.auto))
        memory = await self.store.job_memory(job)
        view = replace(view, ineffective=frozenset(s for s, u in (memory.get("ineffective") or {}).items() if u > now))
        close = self._close_reason(ev, view, upd, now)
        if close is not None and not any(a["state"] in IN_FLIGHT and not a.get("dry_run") for a in actions):
            await self.store.mutate_event(ev["id"], lambda d: {**d, **upd, "state": "closed", "closed_at": now,
                                                                 "close_reason": close},
                                          audit={"kind": "event", "what": "closed", "reason": close})
            last = {"event": ev["id"], "onset": float(upd.get("onset", ev["onset"])), "closed_at": now,
                    "healthy_s": upd.get("healthy_s", ev.get("healthy_s")), "pace_s": view.pace_s}
            await self.store.update_job_memory(job, lambda m: {**m, "last_closed": last})
            log.info("event %s of %s closed: %s", ev["id"], job, close)
            return Decision("ignore", f"closed: {close}", wait=True)
        decision = decide(ev_view, view, costs, policy)
        if adapter is None and decision.strategy == "ignore":
            why = self._adapter_errors.get(job, "no adapter configured for the job")
            decision = replace(decision, reason=f"{why}; {decision.reason}")
        last = ev.get("last_decision") or {}
        if last.get("key") != _decision_key(decision):
            self.metrics.decisions.labels(decision.strategy).inc()
            await self.store.audit("decision", job=job, event=ev["id"], data={**decision.to_json(), "pace_s": view.pace_s,
                                                                              "healthy_s": view.healthy_s,
                                                                              "lost_s": ev_view.lost_s})
        upd["last_decision"] = {"key": _decision_key(decision), "strategy": decision.strategy,
                                "reason": decision.reason, "at": now,
                                "chosen": None if decision.chosen is None else decision.chosen.to_json()}
        if decision.strategy != "ignore" and adapter is not None:
            await self._act(ev, decision, adapter, view, requested_by="planner", dry_run=not self.auto,
                            compute=_compute_basis(upd))
            upd["level"] = max(int(ev.get("level") or 1), LEVEL[decision.strategy])
        await self.store.mutate_event(ev["id"], lambda d: {**d, **upd, "level": max(int(d.get("level") or 1),
                                                                                       int(upd.get("level", 1)))})
        return decision

    def _close_reason(self, ev: dict[str, Any], view: JobView, upd: dict[str, Any], now: float) -> str | None:
        if ev.get("firing"):
            return None
        resolved_at = float(ev.get("resolved_at") or now)
        healthy = view.healthy_s
        if recovered(view.pace_s, healthy, self.config.policy):
            assert view.pace_s is not None and healthy is not None
            return f"alert resolved and pace confirmed back: {view.pace_s:.3f} s vs healthy {healthy:.3f} s"
        last_seen = upd.get("last_seen_series") or ev.get("opened_at")
        if view.pace_s is None and now - float(last_seen) > self.settings.stale_after_s:
            return f"alert resolved and the job has had no iteration series for {now - float(last_seen):.0f} s (ended)"
        if now - resolved_at > self.settings.confirm_timeout_s:
            pace = "unknown" if view.pace_s is None else f"{view.pace_s:.3f} s"
            return (f"alert resolved {now - resolved_at:.0f} s ago; pace {pace} not confirmed back "
                    f"within {self.settings.confirm_timeout_s:.0f} s")
        return None

    # ------------------------------------------------------------------ actions
    async def _act(self, ev: dict[str, Any], decision: Decision, adapter: TrainingAdapter, view: JobView, *,
                   requested_by: str, dry_run: bool, reason: str = "", approve: bool = False,
                   action_id: str | None = None, compute: dict[str, Any] | None = None) -> tuple[dict[str, Any], bool]:
        """Record and (unless a dry run or awaiting approval) execute `decision`; `compute`: what the pace
        model's compute readings were (:func:`_compute_basis`), kept with the prediction."""
        chosen = decision.chosen
        assert chosen is not None
        now = self.clock()
        action = {
            "id": action_id or new_id("act"), "event_id": ev["id"], "job": ev["job"], "strategy": decision.strategy,
            "state": "planned", "created_at": now, "started_at": None, "ended_at": None, "dry_run": dry_run,
            "requested_by": requested_by, "reason": reason or decision.reason, "params": chosen.params,
            "adapter": adapter.kind, "labels": ev.get("labels") or {},
            "predicted": {"pace_s": chosen.predicted_s, "saving_s": chosen.saving_s, "cost_s": chosen.cost_s,
                          "pace_before_s": view.pace_s, "healthy_s": view.healthy_s,
                          **(compute or _compute_basis({})), **_model_basis(view.model)},
            "measured": {}, "outcome": None, "needs_approval": decision.needs_approval and not approve,
            "decision": decision.to_json(), "first_delivery_at": ev.get("first_delivery_at"),
        }
        action, created = await self.store.create_action(action, {"strategy": decision.strategy,
                                                                  "dry_run": dry_run, "params": chosen.params,
                                                                  "predicted": action["predicted"],
                                                                  "requested_by": requested_by})
        if not created:
            return action, False
        log.info("job %s: %s %s %s (%s)", ev["job"], "plan" if dry_run else "action", decision.strategy,
                 chosen.params, decision.reason)
        if dry_run:
            self.metrics.actions.labels(decision.strategy, "dry_run").inc()
            return action, True
        if action["needs_approval"]:
            action, _ = await self.store.transition(action["id"], ("planned",),
                                                    lambda a: {**a, "state": "pending_approval"},
                                                    {"why": "needs approval"})
            return action or {}, True
        return await self._start(action["id"], "planner" if requested_by == "planner" else "manual"), True

    async def _start(self, action_id: str, by: str) -> dict[str, Any]:
        now = self.clock()

        def run(a: dict[str, Any]) -> dict[str, Any]:
            lat = None if a.get("first_delivery_at") is None else max(0.0, now - float(a["first_delivery_at"]))
            return {**a, "state": "running", "started_at": now, "started_by": by, "decision_latency_s": lat}

        action, changed = await self.store.transition(action_id, ("planned", "pending_approval"), run,
                                                      {"by": by, "lease_ms": int(self.settings.lock_lease_s * 1000)})
        if action is None or not changed:
            raise RequestRefused(409, {"detail": "action is not waiting to run", "action": action})
        if action.get("decision_latency_s") is not None:
            self.metrics.latency.labels(action["strategy"]).observe(action["decision_latency_s"])
        adapter = self._adapters.get(action["job"]) or self.adapter_for(action["job"], action.get("labels") or {})
        task = asyncio.create_task(self._execute(action, adapter))
        self._executing[action_id] = task
        return action

    async def _execute(self, action: dict[str, Any], adapter: TrainingAdapter | None) -> None:
        aid = action["id"]
        self.metrics.in_flight.inc()
        lease = self.settings.lock_lease_s

        async def heartbeat() -> None:
            while True:
                await asyncio.sleep(lease / 3)
                with contextlib.suppress(Unavailable):
                    await self.store.keep_alive(aid, lease)

        beat = asyncio.create_task(heartbeat())
        t0 = time.monotonic()
        try:
            req = ActionRequest(aid, action["job"], action["strategy"], action.get("params") or {},
                                action.get("reason", ""), action.get("labels") or {})
            if adapter is None:
                outcome = ActionOutcome(False, "no adapter for the job")
            else:
                try:
                    outcome = await asyncio.to_thread(adapter.execute, req)
                except AdapterError as exc:
                    outcome = ActionOutcome(False, f"{'transient: ' if exc.transient else ''}{exc}")
                except Exception as exc:  # an adapter bug is a failed action, not a dead service
                    log.exception("adapter %s crashed on %s", getattr(adapter, "kind", "?"), aid)
                    outcome = ActionOutcome(False, f"adapter error: {type(exc).__name__}: {exc}")
            await self._finish(action, outcome, time.monotonic() - t0, adapter)
        finally:
            beat.cancel()
            self.metrics.in_flight.dec()
            self._executing.pop(aid, None)
            self.kick(action["job"])

    async def _finish(self, action: dict[str, Any], outcome: ActionOutcome, duration_s: float | None,
                      adapter: TrainingAdapter | None, recovered_by: str | None = None) -> None:
        """Record an action's end; retried until Redis takes it (the outcome must not be lost)."""
        now = self.clock()
        state = "succeeded" if outcome.ok else "failed"
        healthy = (action.get("predicted") or {}).get("healthy_s")
        cost = None
        if outcome.pause_s is not None or outcome.iterations_lost is not None:
            cost = (outcome.pause_s or 0.0) + (outcome.iterations_lost or 0) * float(healthy or 0.0)

        def end(a: dict[str, Any]) -> dict[str, Any]:
            m = {**(a.get("measured") or {}), "duration_s": duration_s, "pause_s": outcome.pause_s,
                 "iterations_lost": outcome.iterations_lost, "cost_s": cost}
            return {**a, "state": state, "ended_at": now, "outcome": outcome.to_json(), "measured": m,
                    **({"recovered_by": recovered_by} if recovered_by else {})}

        if action["strategy"] == "validate":
            # the verdict lands on the event before the action reads as ended: a plan in between would see a
            # finished validation and no verdict, and validate again
            confirmed = bool(outcome.ok and outcome.result.get("confirmed", False))
            params = action.get("params") or {}
            found = {"nodes": list(outcome.result.get("nodes") or []),
                     "paths": list(outcome.result.get("paths") or []),
                     "ranks": list(outcome.result.get("ranks") or []),
                     **({"link_bw_Bps": outcome.result["link_bw_Bps"]} if outcome.result.get("link_bw_Bps") else {})
                     } if confirmed else None
            while True:
                try:
                    await self.store.mutate_event(action["event_id"],
                                                  lambda d: {**d, "validated": confirmed, "validated_links": found,
                                                             "validated_targets": {
                                                                 "ranks": list(params.get("ranks") or []),
                                                                 "nodes": list(params.get("nodes") or [])}})
                    break
                except Unavailable as exc:
                    self.metrics.redis_up.set(0)
                    log.warning("validation %s ended but redis is away, retrying: %s", action["id"], exc)
                    await asyncio.sleep(1.0)
            if outcome.ok and params.get("nodes"):  # what it measured of the links, slow or not, is remembered
                measured, paths = list(params["nodes"]), list(outcome.result.get("paths") or [])
                with contextlib.suppress(Unavailable):
                    await self.store.update_job_memory(action["job"], lambda m: {
                        **m, "slow_paths": remember_paths(m.get("slow_paths") or [], measured, paths)})
        while True:
            try:
                done, changed = await self.store.transition(action["id"], ("running",), end,
                                                            {"outcome": outcome.to_json(), "duration_s": duration_s,
                                                             **({"recovered_by": recovered_by} if recovered_by else {})})
                break
            except Unavailable as exc:
                self.metrics.redis_up.set(0)
                log.warning("action %s ended (%s) but redis is away, retrying: %s", action["id"], state, exc)
                await asyncio.sleep(1.0)
        self.metrics.redis_up.set(1)
        if not changed or done is None:
            return
        strategy = action["strategy"]
        self.metrics.actions.labels(strategy, state).inc()
        if duration_s is not None:
            self.metrics.duration.labels(strategy).observe(duration_s)
        log.info("action %s (%s %s) %s: %s", action["id"], strategy, action["job"], state, outcome.detail)
        with contextlib.suppress(Unavailable):
            if cost is not None and outcome.ok and adapter is not None:
                await self.store.record_cost(adapter.kind, strategy, cost)
            if cost is not None:
                await self.store.mutate_event(action["event_id"],
                                              lambda d: {**d, "spent_s": float(d.get("spent_s") or 0.0) + cost})
            if outcome.ok and (strategy == "rebalance" or (action.get("params") or {}).get("counts")):
                await self._remember_split(action)

    async def _remember_split(self, action: dict[str, Any]) -> None:
        params = action.get("params") or {}

        def upd(mem: dict[str, Any]) -> dict[str, Any]:
            default = mem.get("default_microbatches") or params.get("from")
            counts = params.get("counts")
            return {**mem, "default_microbatches": default, "microbatches": counts, "last_event": action["event_id"],
                    "split_changed": bool(default) and list(counts or []) != list(default or [])}

        await self.store.update_job_memory(action["job"], upd)

    async def _recover(self, action: dict[str, Any], adapter: TrainingAdapter | None) -> None:
        """An action whose replica died mid-way: ask the adapter what became of it; never run it again."""
        req = ActionRequest(action["id"], action["job"], action["strategy"], action.get("params") or {},
                            action.get("reason", ""), action.get("labels") or {})
        outcome: ActionOutcome | None = None
        if adapter is not None:
            try:
                outcome = await asyncio.to_thread(adapter.recover, req)
            except AdapterError as exc:
                log.warning("recovering %s: %s", action["id"], exc)
        if outcome is None:
            outcome = ActionOutcome(False, "interrupted: the replica executing it stopped and the adapter cannot "
                                           "tell the outcome; not repeated")
        await self._finish(action, outcome, None, adapter, recovered_by=self.store.replica)

    async def _judge(self, action: dict[str, Any], pace_after: float) -> None:
        pred = action.get("predicted") or {}
        before = pred.get("pace_before_s")
        if before is None:
            return
        eff, why = judge(float(before), pace_after, pred.get("pace_s"), self.config.policy)
        now = self.clock()
        err = None if not pred.get("pace_s") else (pace_after - float(pred["pace_s"])) / float(pred["pace_s"])

        def upd(a: dict[str, Any]) -> dict[str, Any]:
            return {**a, "measured": {**(a.get("measured") or {}), "pace_after_s": pace_after, "effective": eff,
                                      "judged_at": now, "prediction_error": err, "verdict": why}}

        await self.store.update_action(action["id"], upd)
        await self.store.audit("judgement", job=action["job"], event=action["event_id"], action=action["id"],
                               data={"effective": eff, "verdict": why, "prediction_error": err})
        log.info("action %s judged: %s", action["id"], why)
        if not eff:
            until = now + self.settings.ineffective_ttl_s
            key = signature(action["strategy"], action.get("params") or {})
            await self.store.update_job_memory(action["job"], lambda m: {
                **m, "ineffective": {**(m.get("ineffective") or {}), key: until}})

    async def _tidy(self, job: str) -> None:
        """A job without an open event whose split the remediator changed: go back once replicas are even."""
        memory = await self.store.job_memory(job)
        if not memory.get("split_changed") or not memory.get("default_microbatches"):
            return
        if (await self.store.inflight()).get(job):
            return
        adapter = self.adapter_for(job, {})
        now = self.clock()
        obs = await self._observe(job, now)
        info = await self._info(adapter)
        if adapter is None or info is None or not info.microbatches or obs is None or not obs.ranks \
                or not obs.current(self.settings.stale_after_s) or obs.pace_s is None:
            return
        if list(info.microbatches) == list(memory["default_microbatches"]):
            await self.store.update_job_memory(job, lambda m: {**m, "split_changed": False})
            return
        try:
            model = fit(obs.computes, info.microbatches, obs.pace_s, impute=True)
        except InputError:
            return
        view = JobView(now=now, pace_s=obs.pace_s, model=model, microbatches=tuple(info.microbatches),
                       capabilities=adapter.capabilities())
        cand = restore(view, memory["default_microbatches"], self.config.policy)
        if cand is None or "rebalance" not in view.capabilities:
            return
        ev = await self.store.get_event(memory.get("last_event") or "")
        if ev is None:
            return
        decision = Decision("rebalance", cand.why, cand, (cand,))
        self.metrics.decisions.labels("rebalance").inc()
        await self.store.audit("decision", job=job, event=ev["id"], data={**decision.to_json(), "restore": True})
        await self._act(ev, decision, adapter, view, requested_by="planner", dry_run=not self.auto,
                        reason=f"restore: {cand.why}")

    # ================================================================== manual API
    async def remediate(self, req: RemediateRequest, idempotency_key: str | None = None) -> dict[str, Any]:
        """A person's request: plan now and (unless dry-run) act; returns the plan and the action.

        Raises:
            RequestRefused: 409 while another action of the job is in flight, 422 when nothing applies.
            Unavailable: Redis is away.
        """
        if idempotency_key:
            prior = await self.store.idem_get(idempotency_key)
            if prior is not None:
                action = await self.store.get_action(prior)
                return {"action": action, "replayed": True}
        now = self.clock()
        eid = (await self.store.open_events()).get(req.job)
        ev = await self.store.get_event(eid) if eid else None
        if ev is None:
            fake = Alert.model_validate_json(json.dumps({"status": "firing", "labels": {"job": req.job},
                                                         "fingerprint": "manual", "startsAt": _iso(now)}))
            ev = new_event(new_id("ev"), req.job, fake, now)
            ev.update({"manual": True, "onset_source": "manual", "first_delivery_at": now,
                       "suspects": [s.model_dump() for s in req.suspects]})
            ev = await self.store.create_event(ev)
        inflight = (await self.store.inflight()).get(req.job)
        if inflight:
            other = await self.store.get_action(inflight)
            if other is not None and other.get("state") in IN_FLIGHT:
                raise RequestRefused(409, {"detail": f"action {inflight} of job {req.job} is {other['state']}",
                                           "action_id": inflight, "action": other})
        suspects = _suspects([s.model_dump() for s in req.suspects]) if req.suspects else \
            _suspects(ev.get("suspects") or [])
        view, upd, costs, actions, adapter = await self._inputs(ev, now, suspects)
        suspects = named_suspects(suspects, view.nodes)
        ev_view = EventView(job=req.job, onset_ts=float(upd.get("onset", ev["onset"])), firing=bool(ev.get("firing")),
                            suspects=suspects, lost_s=float(upd["lost_s"]),
                            validated=verdict_for(ev.get("validated"), ev.get("validated_targets"), suspects),
                            actions=_past(actions, not self.auto))
        ev_view = replace(ev_view, cleared=_cleared(ev, ev_view.validated))
        decision = decide(ev_view, view, costs, self.config.policy, force=req.action)
        await self.store.audit("decision", job=req.job, event=ev["id"],
                               data={**decision.to_json(), "manual": True, "reason_given": req.reason})
        self.metrics.decisions.labels(decision.strategy).inc()
        await self.store.mutate_event(ev["id"], lambda d: {**d, **upd})
        if decision.strategy == "ignore" or adapter is None:
            why = decision.reason if adapter is not None else \
                self._adapter_errors.get(req.job, "no adapter configured for the job")
            raise RequestRefused(422, {"detail": f"nothing to do: {why}", "plan": decision.to_json(),
                                       "event_id": ev["id"]})
        action_id = new_id("act")
        if idempotency_key:
            bound = await self.store.idem_claim(idempotency_key, action_id, self.settings.dedupe_ttl_s)
            if bound != action_id:
                return {"action": await self.store.get_action(bound), "replayed": True}
        dry = (not self.auto) if req.dry_run is None else req.dry_run
        if suspects != ev_view.suspects:
            ev_view = replace(ev_view, suspects=suspects)
        action, created = await self._act(ev, decision, adapter, view, requested_by="manual", dry_run=dry,
                                          compute=_compute_basis(upd),
                                          reason=req.reason or f"manual: {decision.reason}", approve=req.approve,
                                          action_id=action_id)
        if not created:
            raise RequestRefused(409, {"detail": f"action {action['id']} of job {req.job} is {action['state']}",
                                       "action_id": action["id"], "action": action})
        await self.store.mutate_event(ev["id"], lambda d: {**d, "level": max(int(d.get("level") or 1),
                                                                               LEVEL[decision.strategy])})
        return {"action": await self.store.get_action(action["id"]) or action, "plan": decision.to_json(),
                "event_id": ev["id"]}

    async def approve(self, action_id: str, by: str) -> dict[str, Any]:
        """Approve a pending action and start it.

        Raises:
            RequestRefused: 404 unknown, 409 not pending approval.
        """
        action = await self.store.get_action(action_id)
        if action is None:
            raise RequestRefused(404, {"detail": f"no action {action_id}"})
        if action.get("state") != "pending_approval":
            raise RequestRefused(409, {"detail": f"action {action_id} is {action.get('state')}, not pending approval",
                                       "action": action})
        await self.store.update_action(action_id, lambda a: {**a, "approval": {"by": by, "at": self.clock(),
                                                                               "approved": True}})
        return await self._start(action_id, by)

    async def reject(self, action_id: str, by: str) -> dict[str, Any]:
        """Reject a pending action (the planner will not plan the same strategy again for this event).

        Raises:
            RequestRefused: 404 unknown, 409 not pending approval.
        """
        now = self.clock()
        action, changed = await self.store.transition(
            action_id, ("pending_approval",),
            lambda a: {**a, "state": "rejected", "ended_at": now, "approval": {"by": by, "at": now, "approved": False}},
            {"by": by})
        if action is None:
            raise RequestRefused(404, {"detail": f"no action {action_id}"})
        if not changed:
            raise RequestRefused(409, {"detail": f"action {action_id} is {action.get('state')}, not pending approval",
                                       "action": action})
        self.metrics.actions.labels(action["strategy"], "rejected").inc()
        self.kick(action["job"])
        return action


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}Z"


def replica_name(settings: Settings) -> str:
    """This replica's name in locks and the audit."""
    return settings.replica or f"{socket.gethostname()}:{os.getpid()}"


def build_service(settings: Settings, config: RemediatorConfig, metrics: RemediatorMetrics | None = None) -> Remediator:
    """A remediator wired to the Redis and Prometheus named in `settings`."""
    store = Store.from_url(settings.redis_url, settings.redis_prefix, replica_name(settings), settings.query_timeout_s,
                           settings.audit_max_entries)
    prom = Prometheus(settings.prometheus_url, settings.query_timeout_s)
    return Remediator(settings, config, store, prom, metrics or RemediatorMetrics())


"""The detector service loop: poll Prometheus, detect, analyse culprits, export, persist in Redis.

Failure policy: Prometheus or Redis away never kills the loop. A failed poll sets
``failslow_detector_prometheus_up``/``_last_poll_success`` to 0 and the next poll tries again; a failed
Redis write keeps the state in memory (``failslow_detector_redis_up`` 0) and retries on the next poll.
Until the stored state has been read once, no detection runs, so a restart can neither lose an open
event nor fire it again.

Sharding: with ``shards`` > 1 this replica watches only the jobs it owns (`detector.shard`): it asks
Prometheus for the job names, then queries the series of its own jobs only (a job regex), so each
replica's poll and detector state shrink with N. Stored state it does not own is ignored at load.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from detector.culprit import MIN_SETTLED_STEPS, analyse_job, suspects
from detector.engine import Engine, Key
from detector.metrics import DetectorMetrics
from detector.prom import PromClient, PromUnavailable
from detector.settings import Settings
from detector.shard import Shard, job_regex
from detector.store import RedisStore, StoreUnavailable, snapshot_name
from failslow.detect import JobChange, JobEvent
from failslow.detect.work import per_sample

log = logging.getLogger("failslow.detector")


class Detector:
    """One detector instance; dependencies are passed in (production defaults built in `main()`)."""

    def __init__(self, settings: Settings, prom: PromClient, store: RedisStore, metrics: DetectorMetrics,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.prom = prom
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.shard = Shard(settings.shard, settings.shards)
        metrics.shard.set(self.shard.index)
        metrics.shards.set(self.shard.count)
        self.engine = Engine(settings.method, settings.threshold, settings.quorum, settings.dtype)
        self.loaded = False
        self.polls = 0
        self._dirty: set[str] = set()
        self._last_ts: dict[Key, float] = {}
        self._culprit_due: dict[str, int] = {}
        self._shown: set[str] = set()
        self._fresh_at: dict[Key, float] = {}  # poll time of each series' last new sample
        self._job_seen: dict[str, float] = {}  # poll time a job last had a new sample
        self._work: dict[str, float] = {}  # samples per iteration a job last published
        self._new: list[Key] = []
        self._forget: set[str] = set()  # dropped jobs whose Redis event is still to delete
        self._snapshot_due = False

    # ------------------------------------------------------------------ state
    def load_state(self) -> bool:
        """Read events and the snapshot from Redis once; False while Redis is away."""
        try:
            snap = self.store.load_snapshot()
            events = self.store.load_events()
        except StoreUnavailable as exc:
            self.metrics.redis_up.set(0)
            log.warning("redis unavailable, waiting before detecting: %s", exc)
            return False
        self.metrics.redis_up.set(1)
        if snap is not None and not self.engine.restore(*snap):
            log.warning("snapshot taken with other settings; starting the detectors afresh")
        # A snapshot written under another shard count may hold jobs that are another replica's now.
        self.engine.drop([k for k in self.engine.keys if not self.shard.owns(k[0])])
        for job in [j for j in self.engine.jobs if not self.shard.owns(j)]:
            self.engine.forget_job(job)
        for job, doc in events.items():
            if self.shard.owns(job):  # the hash is shared by the replicas: the others' jobs are theirs
                self.engine.jobs[job] = JobEvent.from_json(doc)
        now = self.clock()
        for ev in self.engine.jobs.values():
            self._show(ev)
            self._job_seen[ev.job] = now  # gets the staleness period to show up again
            if ev.open:
                self._culprit_due[ev.job] = 0 if not ev.suspects else self.settings.culprit_every
        for k in self.engine.keys:
            self._fresh_at[k] = now
        self.loaded = True
        log.info("state loaded (shard %d of %d): %d series, %d jobs, %d open events", self.shard.index,
                 self.shard.count, self.engine.n_series, len(self.engine.jobs),
                 sum(e.open for e in self.engine.jobs.values()))
        return True

    def _persist(self, snapshot: bool) -> None:
        try:
            snapshot = snapshot or self._snapshot_due
            if not self._dirty and not snapshot and not self._forget:
                self.store.ping()  # nothing to write: still find out whether Redis is there
            self.store.save_events({j: self.engine.jobs[j].to_json() for j in self._dirty if j in self.engine.jobs})
            self._dirty.clear()
            if self._forget:
                self.store.delete_events(sorted(self._forget))
                self._forget.clear()
            if snapshot:
                self.store.save_snapshot(*self.engine.snapshot())
                self._snapshot_due = False
            self.metrics.redis_up.set(1)
        except StoreUnavailable as exc:
            self.metrics.redis_up.set(0)
            log.warning("redis unavailable, keeping state in memory: %s", exc)

    def _show(self, ev: JobEvent) -> None:
        self._shown.add(ev.job)
        self.metrics.show_job(ev.job, ev.open, ev.ratio, ev.onset_ts, ev.baseline, ev.suspects, ev.named)

    # ------------------------------------------------------------------ one poll
    def _samples(self, now: float) -> tuple[dict[Key, float], dict[Key, dict[str, str]], float | None]:
        metric = self.settings.metric
        self._new = []
        if self.shard.sharded:
            # One row per job, then only this replica's series: the per-rank queries (the bulk of a poll)
            # are split N ways instead of every replica reading every rank.
            owned = sorted({j for s in self.prom.query(f"group by (job) ({metric})")
                            if (j := s.labels.get("job", "")) and self.shard.owns(j)})
            if not owned:
                return {}, {}, None
            metric = f"{metric}{{job=~{job_regex(owned)}}}"
        # Only job and rank come back with every poll (a third of the JSON at 16k ranks); the other
        # labels (node, dp/pp/tp rank) are fetched once, when a series is new.
        values = self.prom.query(f"max by (job, rank) ({metric})")
        stamps = self.prom.query(f"max by (job, rank) (timestamp({metric}))")
        if any((s.labels.get("job", ""), s.labels.get("rank", "")) not in self.engine.labels for s in values):
            values_full = {(s.labels.get("job", ""), s.labels.get("rank", "")): s.labels
                           for s in self.prom.query(metric)}
        else:
            values_full = {}
        ts_of = {(s.labels.get("job", ""), s.labels.get("rank", "")): s.value for s in stamps}
        work = self._samples_per_iteration()
        samples: dict[Key, float] = {}
        labels: dict[Key, dict[str, str]] = {}
        fresh: list[float] = []
        for s in values:
            key = (s.labels.get("job", ""), s.labels.get("rank", ""))
            if not key[0] or not self.shard.owns(key[0]):
                continue
            stamp = ts_of.get(key, math.nan)
            if key not in self.engine.index and stamp == stamp and now - stamp > self.settings.stale_after_s:
                continue  # a dead series Prometheus still looks back to: not worth a detector row
            # A sample Prometheus already gave us is not new: feed it as missing.
            new = not (stamp == stamp and self._last_ts.get(key) == stamp)
            self._last_ts[key] = stamp
            if new:
                self._new.append(key)
            v = s.value if key[0] not in work else per_sample(s.value, work[key[0]])
            samples[key] = v if new and v > 0 and math.isfinite(v) else math.nan
            if new and stamp == stamp:
                fresh.append(stamp)
            if key not in self.engine.labels:
                full = values_full.get(key, s.labels)
                labels[key] = {k: v for k, v in full.items() if k != "__name__"}
        return samples, labels, (float(sorted(fresh)[len(fresh) // 2]) if fresh else None)

    def _samples_per_iteration(self) -> dict[str, float]:
        """The samples per iteration each job publishes (`Settings.samples_metric`), by job. A job keeps its
        last value while the gauge is away (a textfile that did not parse, a scrape that missed it): its
        series must not switch between seconds per sample and per iteration."""
        if not self.settings.samples_metric:
            return {}
        for s in self.prom.query(f"max by (job) ({self.settings.samples_metric})"):
            if (j := s.labels.get("job", "")) and s.value > 0 and math.isfinite(s.value):
                self._work[j] = s.value
        return self._work

    def poll_once(self) -> bool:
        """One poll; returns whether it succeeded."""
        t0 = time.perf_counter()
        if not self.loaded and not self.load_state():
            self.metrics.poll_ok.set(0)
            return False
        now = self.clock()
        try:
            samples, labels, sample_ts = self._samples(now)
        except PromUnavailable as exc:
            self.metrics.prom_up.set(0)
            self.metrics.poll_ok.set(0)
            log.warning("prometheus unavailable: %s", exc)
            return False
        self.metrics.prom_up.set(1)
        for k in self._new:
            self._fresh_at[k] = now
            self._job_seen[k[0]] = now
        # Nothing new anywhere (Prometheus restarting: empty answers, then the old samples again; the
        # exporters away): no step. A step would only age every series' history by one missing sample.
        fresh = any(v == v for v in samples.values())
        changes = self.engine.step(now, samples, labels, sample_ts) if fresh else []
        for ch in changes:
            self._on_change(ch)
        if changes:
            # An event that opened or closed is stored before the culprit analysis below (a few Prometheus
            # queries, seconds when Prometheus is slow): the verdict is already exported, and a replica that
            # dies meanwhile must not come back without the event.
            self._persist(snapshot=False)
        for ev in self.engine.jobs.values():
            if ev.open:
                self.metrics.ratio.labels(ev.job).set(ev.ratio)
            elif ev.job not in self._shown:
                self._show(ev)
        self._culprits(now)
        self._drop_stale(now)
        self.polls += 1
        self._persist(snapshot=self.polls % self.settings.snapshot_every == 0)
        self.metrics.series.set(self.engine.n_series)
        self.metrics.jobs.set(len(self.engine.jobs))
        self.metrics.poll_ok.set(1)
        self.metrics.poll_ts.set(now)
        self.metrics.poll_s.set(time.perf_counter() - t0)
        return True

    def _drop_stale(self, now: float) -> None:
        """Forget series without a new sample for ``stale_after_s``, and jobs left without series.

        A finished or crashed job must not keep its detector rows, its exported series (fail-slow,
        ratio, onset, suspects, events) or its Redis event forever: memory and series stay bounded by
        the jobs that are alive.
        """
        limit = self.settings.stale_after_s
        stale = [k for k in self.engine.keys if now - self._fresh_at.setdefault(k, now) > limit]
        dead = self.engine.drop(stale) if stale else []
        for k in stale:
            self._fresh_at.pop(k, None)
            self._last_ts.pop(k, None)
        alive = {k[0] for k in self.engine.keys}
        for job in list(self.engine.jobs):
            # Jobs without any series: known only from a stored event (the job ended while we were down).
            if job not in alive and now - self._job_seen.setdefault(job, now) > limit:
                self.engine.forget_job(job)
                dead.append(job)
        for job in dead:
            log.info("job %s has had no new sample for %.0f s: its state and series are dropped", job, limit)
            self.metrics.drop_job(job)
            self._forget.add(job)
            self._dirty.discard(job)
            self._culprit_due.pop(job, None)
            self._shown.discard(job)
            self._job_seen.pop(job, None)
            self._work.pop(job, None)
        if stale or dead:
            self._snapshot_due = True

    def _on_change(self, ch: JobChange) -> None:
        ev = ch.event
        self._dirty.add(ev.job)
        if ch.what == "opened":
            log.info("fail-slow opened: job=%s ratio=%.3f onset=%.3f", ev.job, ev.ratio, ev.onset_ts)
            self.metrics.events.labels(ev.job).inc()
            self._culprit_due[ev.job] = 0
        elif ch.what == "closed":
            log.info("fail-slow closed: job=%s", ev.job)
            self._culprit_due.pop(ev.job, None)
        self._show(ev)

    def _culprits(self, now: float) -> None:
        for job, due in list(self._culprit_due.items()):
            ev = self.engine.jobs.get(job)
            if ev is None or not ev.open:
                self._culprit_due.pop(job, None)
                continue
            if due > 0:
                self._culprit_due[job] = due - 1
                continue
            ranks: dict[int, dict[str, str]] = {}
            for (j, r), lab in self.engine.labels.items():
                if j == job and r.isdigit():
                    ranks[int(r)] = lab
            window = min(self.settings.culprit_window_s, max(now - ev.onset_ts, 3 * self.settings.poll_interval_s))
            try:
                done = analyse_job(self.prom, job, window, ranks,
                                   before_s=now - ev.onset_ts + self.settings.poll_interval_s,
                                   step_s=self.settings.poll_interval_s)
            except PromUnavailable as exc:
                log.warning("culprit analysis for %s postponed: %s", job, exc)
                continue
            except Exception:  # an analysis bug must not stop detection for every other job
                log.exception("culprit analysis for %s failed", job)
                self._culprit_due[job] = self.settings.culprit_every
                continue
            if done is None:  # the split or placement changed too recently: the suspects stand, look again soon
                log.info("culprit analysis for %s waits: its split or placement changed in the last %.0f s", job,
                         MIN_SETTLED_STEPS * self.settings.poll_interval_s)
                self._culprit_due[job] = MIN_SETTLED_STEPS // 2
                continue
            analysis, names = done
            ev.suspects = suspects(analysis, names, self.settings.max_suspects,
                                   {r: lab.get("node", "") for r, lab in ranks.items()})
            ev.named = [*ev.named, *([s["kind"], s["rank"], s["node"]] for s in ev.suspects
                                     if [s["kind"], s["rank"], s["node"]] not in ev.named)]
            self._culprit_due[job] = self.settings.culprit_every
            self._dirty.add(job)
            self._show(ev)
            log.info("culprits for %s: %s", job, ev.suspects)

    def save_now(self) -> None:
        """Persist everything (on shutdown)."""
        self._dirty.update(self.engine.jobs)
        self._persist(snapshot=True)

    def run(self, stop: Callable[[], bool]) -> None:
        """Poll every ``poll_interval_s`` until ``stop()``; a slow poll is followed at once by the next."""
        nxt = time.monotonic()
        while not stop():
            self.poll_once()
            nxt += self.settings.poll_interval_s
            delay = nxt - time.monotonic()
            if delay < 0:
                nxt = time.monotonic()
                continue
            end = time.monotonic() + delay
            while not stop() and time.monotonic() < end:
                time.sleep(min(0.05, max(0.0, end - time.monotonic())))


def build(settings: Settings, registry: Any = None) -> Detector:
    """A detector wired to the real Prometheus and Redis named in ``settings``."""
    return Detector(settings, PromClient(settings.prometheus_url, settings.query_timeout_s),
                    RedisStore(settings.redis_url, settings.redis_prefix, settings.query_timeout_s,
                               snapshot_key=snapshot_name(settings.redis_prefix, settings.shard, settings.shards)),
                    DetectorMetrics(registry))

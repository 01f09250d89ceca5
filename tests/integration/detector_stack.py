"""A small exporter endpoint for the detector tests, beside the real processes they run it with.

Nothing here is mocked, and every process comes from failslow_cli.stack.processes (started, stopped by PID,
restartable; re-exported here): `/usr/bin/prometheus` runs the shipped prometheus.yml and rules with the test's endpoint in
its exporter target file, and scrapes a prometheus-client HTTP endpoint that the test drives;
`/usr/bin/redis-server` keeps an append-only file in a temp dir so a restart keeps its data. A component
that cannot start raises, so the test fails.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

from failslow.period import CONFIDENCE_MIN
from failslow_cli.stack.processes import detector_service, free_port, prometheus_service, redis_service

__all__ = ["Endpoint", "FakeJob", "detector_service", "free_port", "prometheus_service", "redis_service"]


@dataclass(eq=False)  # hashable by identity: the registry keys collectors
class FakeJob:
    """What a node agent would publish for one job, driven by the test (values in seconds).

    ``slow_rank`` makes that rank compute ``factor`` times longer (its DP peer waits inside the all-reduce);
    ``slow_node`` makes every communicator spanning that node transfer ``factor`` times slower;
    ``slow_stage`` makes every rank of that pipeline stage compute ``factor`` times longer.
    ``work`` scales every iteration (a batch-size ramp's stair: more samples per iteration); ``samples``,
    when set, is published as the job's ``failslow_iteration_samples`` gauge. ``microbatches``, when set,
    is each DP replica's count (a rebalance makes them unequal): a rank's compute is then 0.1 s of optimizer
    step plus 0.7 s per mean count, scaled by its count, and the endpoint publishes what the exporter tells
    of it: one pipeline send per micro-batch (``failslow_comm_calls_total``, op Send), the iterations, the
    calls per iteration (``failslow_iteration_period_calls``: a send and a receive per micro-batch and the
    all-reduce) and the compute outside the pipeline (the step; a first stage's also one micro-batch). ``nodes`` moves ranks
    to other node labels (their old series end, as after a restart on another node). :meth:`relock` plays
    the exporter finding a rank's period again (after an onset or a split change, measured on the testbed):
    its iteration counter stops while its sends go on, its period gauge keeps the old value, then both catch up.
    ``period_calls``, when set and ``microbatches`` is not, is every rank's period (a job without a pipeline).
    ``confidence``, when set, is every rank's period confidence; below ``CONFIDENCE_MIN`` the period is hidden,
    as the exporter hides it.
    """

    job: str = "train"
    dp: int = 2
    pp: int = 2
    base: float = 1.0
    slow_rank: int | None = None
    slow_node: int | None = None
    slow_stage: int | None = None
    factor: float = 1.5
    comm_metrics: bool = True
    work: float = 1.0
    samples: int | None = None
    microbatches: tuple[int, ...] | None = None
    nodes: dict[int, str] = field(default_factory=dict)  # rank -> node label, where not f"node{rank}"
    tick: int = 0
    counts: dict[tuple[int, str], float] = field(default_factory=dict)
    sums: dict[tuple[int, str], float] = field(default_factory=dict)
    sends: dict[int, float] = field(default_factory=dict)
    iterations: dict[int, float] = field(default_factory=dict)
    stalled: dict[int, int] = field(default_factory=dict)  # rank -> steps left until its period is found again
    missed: dict[int, float] = field(default_factory=dict)
    period: dict[int, float] = field(default_factory=dict)
    period_calls: float | None = None
    confidence: float | None = None

    @property
    def world(self) -> int:
        return self.dp * self.pp

    def coords(self, r: int) -> tuple[int, int]:
        return r % self.dp, r // self.dp  # (dp_rank, pp_rank), tp = 1

    def comms(self) -> dict[str, tuple[str, list[int]]]:
        out: dict[str, tuple[str, list[int]]] = {}
        for pp in range(self.pp):
            out[f"dp{pp}"] = ("dp", [pp * self.dp + d for d in range(self.dp)])
        for d in range(self.dp):
            out[f"pp{d}"] = ("pp", [p * self.dp + d for p in range(self.pp)])
        return out

    def relock(self, ranks: Iterable[int], steps: int) -> None:
        """The exporter loses the period of `ranks` for `steps` steps (from the next one)."""
        for r in ranks:
            self.stalled[r] = steps

    def step(self) -> None:
        """One exporter window: per-call means and the resulting iteration times."""
        self.tick += 1
        jitter = 1.0 + 0.01 * ((self.tick * 7919) % 13 - 6) / 6.0
        slowed = {r: self.factor if r == self.slow_rank or self.coords(r)[1] == self.slow_stage else 1.0
                  for r in range(self.world)}
        mbs = self.microbatches
        if mbs is None:
            compute = {r: 0.8 * slowed[r] for r in range(self.world)}
        else:
            mean = sum(mbs) / len(mbs)
            share = {r: mbs[self.coords(r)[0]] / mean for r in range(self.world)}
            compute = {r: (0.1 + 0.7 * share[r]) * slowed[r] for r in range(self.world)}
            self._outside_pipeline = {r: (0.1 + (0.7 / mean if self.coords(r)[1] == 0 else 0.0)) * slowed[r]
                                      for r in range(self.world)}
            for r in range(self.world):
                self.sends[r] = self.sends.get(r, 0.0) + mbs[self.coords(r)[0]]
                if self.stalled.get(r, 0) > 0:
                    self.stalled[r] -= 1
                    self.missed[r] = self.missed.get(r, 0.0) + 1
                    continue
                self.iterations[r] = self.iterations.get(r, 0.0) + 1 + self.missed.pop(r, 0.0)
                self.period[r] = 2.0 * mbs[self.coords(r)[0]] + 1
        slowest = max(compute.values())
        for name, (_kind, ranks) in self.comms().items():
            link = self.factor if self.slow_node is not None and self.slow_node in ranks else 1.0
            transfer = 0.05 * link
            arrive = {r: compute[r] for r in ranks}
            last = max(arrive.values())
            for r in ranks:
                self.sums[(r, name)] = self.sums.get((r, name), 0.0) + (last - arrive[r]) + 10 * transfer
                self.counts[(r, name)] = self.counts.get((r, name), 0.0) + 10
        link_extra = 0.3 * (self.factor - 1) if self.slow_node is not None else 0.0
        # Swap whole dicts: the HTTP thread may be reading the previous ones.
        self._compute = compute
        self._iter = {r: (slowest + 0.2 + link_extra) * self.base * self.work * jitter for r in range(self.world)}

    def rank_labels(self, r: int) -> list[str]:
        """Rank `r`'s label values in the exporter's order (job, rank, dp_rank, pp_rank, tp_rank, node)."""
        d, p = self.coords(r)
        return [self.job, str(r), str(d), str(p), "0", self.nodes.get(r, f"node{r}")]

    def _every_rank(self, name: str, value: float, lab: list[str]) -> GaugeMetricFamily:
        fam = GaugeMetricFamily(name, name, labels=lab)
        for r in range(self.world):
            fam.add_metric(self.rank_labels(r), value)
        return fam

    def collect(self) -> Iterable[object]:
        lab = ["job", "rank", "dp_rank", "pp_rank", "tp_rank", "node"]
        it = GaugeMetricFamily("failslow_iteration_duration_seconds", "iteration time", labels=lab)
        cs = GaugeMetricFamily("failslow_iteration_compute_seconds", "outside calls", labels=lab)
        for r in range(self.world):
            labels = self.rank_labels(r)
            it.add_metric(labels, self._iter[r])
            cs.add_metric(labels, self._compute[r])
        yield it
        yield cs
        shown = self.confidence is None or self.confidence >= CONFIDENCE_MIN
        if self.confidence is not None:
            yield self._every_rank("failslow_iteration_period_confidence_ratio", self.confidence, lab)
        if self.microbatches is None and self.period_calls is not None and shown:
            yield self._every_rank("failslow_iteration_period_calls", self.period_calls, lab)
        if self.microbatches is not None:
            op = GaugeMetricFamily("failslow_iteration_outside_pipeline_compute_seconds", "step", labels=lab)
            its = CounterMetricFamily("failslow_iterations", "iterations", labels=lab)
            period = GaugeMetricFamily("failslow_iteration_period_calls", "calls per iteration", labels=lab)
            calls = CounterMetricFamily("failslow_comm_calls", "calls", labels=["job", "rank", "comm", "op", "nranks"])
            for r in range(self.world):
                d = self.coords(r)[0]
                labels = self.rank_labels(r)
                op.add_metric(labels, self._outside_pipeline[r])
                its.add_metric(labels, self.iterations[r])
                if r in self.period and shown:
                    period.add_metric(labels, self.period[r])
                calls.add_metric([self.job, str(r), f"pp{d}", "Send", str(self.pp)], self.sends[r])
            yield op
            yield its
            yield period
            yield calls
        if self.samples is not None:
            fam = GaugeMetricFamily("failslow_iteration_samples", "samples per iteration", labels=["job"])
            fam.add_metric([self.job], float(self.samples))
            yield fam
        if not self.comm_metrics:
            return
        summ = SummaryMetricFamily("failslow_comm_call_duration_seconds", "calls",
                                   labels=["job", "rank", "comm", "op", "nranks"])
        info = GaugeMetricFamily("failslow_comm_info", "comms",
                                 labels=["job", "rank", "comm", "nranks", "comm_rank", "group"])
        for name, (kind, ranks) in self.comms().items():
            for i, r in enumerate(ranks):
                summ.add_metric([self.job, str(r), name, "AllReduce" if kind == "dp" else "Send",
                                 str(len(ranks))], count_value=self.counts[(r, name)],
                                sum_value=self.sums[(r, name)])
                info.add_metric([self.job, str(r), name, str(len(ranks)), str(i), kind], 1.0)
        yield summ
        yield info


class Endpoint:
    """A real prometheus-client HTTP endpoint serving FakeJobs, re-stepped every ``period`` seconds."""

    def __init__(self, jobs: list[FakeJob], period: float = 0.2) -> None:
        self.jobs = jobs
        self.port = free_port()
        self.registry = CollectorRegistry()
        for j in jobs:
            j.step()
            self.registry.register(j)  # type: ignore[arg-type]
        self.server, self._thread = start_http_server(self.port, "127.0.0.1", registry=self.registry)
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._run, args=(period,), daemon=True)
        self._ticker.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _run(self, period: float) -> None:
        while not self._stop.wait(period):
            for j in self.jobs:
                j.step()

    def remove(self, job: FakeJob) -> None:
        """The job ends: its series vanish from the endpoint (Prometheus marks them stale)."""
        self.jobs = [j for j in self.jobs if j is not job]
        self.registry.unregister(job)  # type: ignore[arg-type]

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()

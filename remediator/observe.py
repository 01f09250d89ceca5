"""What the remediator reads from Prometheus about one job: its pace, its ranks' compute, the detector's onset.

Queries (``J`` = the job label):

* pace: ``quantile(0.5, failslow_iteration_duration_seconds{job=J})`` — the ranks of a job synchronise
  every iteration, so their median is the job's iteration time; the series' newest sample time
  (``max(failslow_last_iteration_timestamp_seconds{job=J})``) says whether it is current (a job paused
  for a restart, or gone, has no current pace);
* ranks: ``failslow_iteration_compute_seconds{job=J}`` with its ``rank``/``dp_rank``/``pp_rank``/``node``
  labels (the pace model's input), or its ``avg_over_time`` over a window the service chooses (from a clean
  reading after the onset or the last action to now), and likewise the part of it outside the pipeline,
  ``failslow_iteration_outside_pipeline_compute_seconds{job=J}``, where the exporter tells it;
* onset: ``max(failslow_detector_onset_timestamp_seconds{job=J})`` and the healthy level the detector
  measures the slowdown against, ``max(failslow_detector_baseline_seconds{job=J})``;
* iterations since an action: ``quantile(0.5, C - min_over_time(C[Ns]))`` with
  ``C = failslow_iterations_total{job=J}`` and ``N`` the seconds since the action ended: each rank's
  iterations counted from its first scrape after the action (a counter that restarted with the job counts
  from its restart), their median;
* healthy pace: ``quantile(0.5, quantile_over_time(0.5, failslow_iteration_duration_seconds{job=J}[2m]))``
  evaluated just before the onset (medians: the slow first iterations after a start or a restart, and
  checkpoint spikes, do not lift it as they lift an average); the window is shortened so that it starts after the job's previous event closed
  (the service falls back to that event's healthy pace when too little is left).

Reading (HTTP) is separated from parsing (:func:`parse_vector`, pure).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import urllib3

from failslow.plan.pace import RankCompute


class PromUnavailable(RuntimeError):
    """Prometheus did not answer or answered with an error."""


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"')


def parse_vector(doc: dict[str, Any]) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of each element of an instant-vector answer.

    Raises:
        PromUnavailable: an error answer or a malformed one.
    """
    if doc.get("status") != "success":
        raise PromUnavailable(f"query failed: {doc.get('errorType')}: {doc.get('error')}")
    data = doc.get("data") or {}
    if data.get("resultType") != "vector":
        raise PromUnavailable(f"expected a vector, got {data.get('resultType')!r}")
    out = []
    for item in data.get("result", []):
        try:
            out.append((dict(item["metric"]), float(item["value"][1])))
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise PromUnavailable(f"malformed sample {item!r}: {exc}") from exc
    return out


@dataclass
class RankSample:
    """One rank's labels and compute time per iteration (and the part of it outside the pipeline, if told)."""

    rank: int
    dp: int
    pp: int
    tp: int
    node: str
    compute_s: float
    outside_s: float | None = None

    def compute(self) -> RankCompute:
        """The rank as the pace model wants it."""
        return RankCompute(self.rank, self.dp, self.pp, self.compute_s, self.outside_s)


@dataclass
class JobObservation:
    """One reading of a job (every field None / empty when Prometheus has nothing for it)."""

    at: float
    pace_s: float | None = None
    last_iteration_ts: float | None = None
    ranks: list[RankSample] = field(default_factory=list)
    onset_ts: float | None = None
    detector_baseline_s: float | None = None

    @property
    def computes(self) -> list[RankCompute]:
        """The ranks as the pace model wants them."""
        return [r.compute() for r in self.ranks]

    def current(self, stale_after_s: float) -> bool:
        """Whether the pace is current (the job finished an iteration within `stale_after_s`)."""
        return (self.pace_s is not None and self.last_iteration_ts is not None
                and self.at - self.last_iteration_ts <= stale_after_s)


class Prometheus:
    """Instant queries against one Prometheus (blocking, thread-safe; the service calls it from worker threads).

    Over urllib3's connection pool rather than a requests session: the planner makes a dozen queries per open
    event per tick, and requests spent 1.4 ms of CPU on each where urllib3 spends 0.44 ms (on the machine of
    docs/BENCHMARKS.md), CPU the webhook shares. No retries: a query that fails is an unavailable Prometheus
    for this tick.
    """

    def __init__(self, base_url: str, timeout_s: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._pool = urllib3.PoolManager(maxsize=8, retries=False)

    def query(self, expr: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """Evaluate `expr` now (or at Unix time `at`)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        try:
            resp = self._pool.request("POST", f"{self.base_url}/api/v1/query", fields=params,
                                      encode_multipart=False, timeout=self.timeout_s)
            doc = json.loads(resp.data)
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise PromUnavailable(f"{self.base_url}: {exc}") from exc
        if not isinstance(doc, dict):
            raise PromUnavailable(f"{self.base_url}: answered {type(doc).__name__}, not a JSON object")
        return parse_vector(doc)

    def scalar(self, expr: str, at: float | None = None) -> float | None:
        """The single value of `expr`, or None when it has none (or it is not finite)."""
        vals = [v for _l, v in self.query(expr, at) if math.isfinite(v)]
        return vals[0] if vals else None

    def observe(self, job: str, now: float) -> JobObservation:
        """Read the job's pace, ranks and detector state now."""
        sel = f'job="{_esc(job)}"'
        obs = JobObservation(at=now)
        obs.pace_s = self.scalar(f"quantile(0.5, failslow_iteration_duration_seconds{{{sel}}})")
        obs.last_iteration_ts = self.scalar(f"max(failslow_last_iteration_timestamp_seconds{{{sel}}})")
        obs.ranks = self.ranks(job)
        obs.onset_ts = self.scalar(f"max(failslow_detector_onset_timestamp_seconds{{{sel}}})")
        obs.detector_baseline_s = self.scalar(f"max(failslow_detector_baseline_seconds{{{sel}}})")
        return obs

    def ranks(self, job: str, at: float | None = None, window_s: float | None = None,
              median: bool = False) -> list[RankSample]:
        """Every rank's compute time per iteration now (or at Unix time `at`), with its coordinates and its
        compute outside the pipeline where the exporter tells it; with `window_s`, each rank's mean reading over
        that many seconds (whole seconds, at least 1) before, or with `median` its median reading there (a few
        readings unlike the rest do not move it)."""
        over = "quantile_over_time(0.5, " if median else "avg_over_time("

        def expr(metric: str) -> str:
            e = f'{metric}{{job="{_esc(job)}"}}'
            return e if window_s is None else f"{over}{e}[{max(1, int(window_s))}s])"

        outside = {}
        for labels, value in self.query(expr("failslow_iteration_outside_pipeline_compute_seconds"), at):
            if "rank" in labels and math.isfinite(value):
                outside[labels["rank"]] = value
        out = []
        for labels, value in self.query(expr("failslow_iteration_compute_seconds"), at):
            try:
                out.append(RankSample(int(labels["rank"]), int(labels.get("dp_rank", "0")),
                                      int(labels.get("pp_rank", "0")), int(labels.get("tp_rank", "0")),
                                      labels.get("node", ""), value, outside.get(labels["rank"])))
            except (KeyError, ValueError):
                continue
        return out

    def iterations_since(self, job: str, since: float, now: float) -> float | None:
        """Iterations the job's ranks (their median) reported between the first scrape after Unix time `since`
        and `now`: a lower bound on those they finished since then. None when no rank's counter was scraped
        in that span."""
        c = f'failslow_iterations_total{{job="{_esc(job)}"}}'
        span = max(1, math.ceil(now - since))
        return self.scalar(f"quantile(0.5, {c} - min_over_time({c}[{span}s]))", at=now)

    def healthy_pace(self, job: str, onset_ts: float, window_s: float = 120.0) -> float | None:
        """The job's iteration time over the `window_s` seconds (two minutes by default) before `onset_ts`."""
        sel = f'job="{_esc(job)}"'
        win = f"{max(1, int(window_s))}s"
        return self.scalar(f"quantile(0.5, quantile_over_time(0.5, "
                           f"failslow_iteration_duration_seconds{{{sel}}}[{win}]))", at=onset_ts)

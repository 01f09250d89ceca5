"""The single metric catalogue: every series failslow exposes, with type, help and labels.

The exporter and the detector build their collectors from these entries, the Prometheus rule
tests and the dashboard checks read them, and docs/METRICS.md is generated from them. A metric
that is not here does not exist. Label sets are bounded: no per-step or per-call labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MetricType = Literal["gauge", "counter", "summary", "histogram", "info"]

RANK_LABELS = ("job", "rank", "dp_rank", "pp_rank", "tp_rank", "node")
COMM_LABELS = ("job", "rank", "comm", "op", "nranks")


@dataclass(frozen=True)
class Metric:
    """One metric family as exposed to Prometheus."""

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...]
    source: str  # which component exposes it: exporter | detector | remediator | whatif


CATALOGUE: tuple[Metric, ...] = (
    # --- exporter: ring collector -------------------------------------------------------------
    Metric("failslow_iteration_duration_seconds", "gauge",
           "Mean iteration time of the rank over the last window, inferred from its call stream (ACF period).",
           RANK_LABELS, "exporter"),
    Metric("failslow_iterations_total", "counter",
           "Iterations completed by the rank, as inferred from its call stream.", RANK_LABELS, "exporter"),
    Metric("failslow_ring_dropped_records_total", "counter",
           "Records the producer overwrote before the exporter read them (ring overflow).",
           ("job", "rank"), "exporter"),
    # --- detector ------------------------------------------------------------------------------
    Metric("failslow_detector_failslow", "gauge", "1 while the detector holds an open fail-slow event for the job.",
           ("job",), "detector"),
    Metric("failslow_detector_slowdown_ratio", "gauge",
           "Mean iteration time after the change point over the mean before it (1 when healthy).", ("job",),
           "detector"),
    Metric("failslow_detector_onset_timestamp_seconds", "gauge",
           "Unix time of the first slow iteration of the open event.", ("job",), "detector"),
    # --- what-if -------------------------------------------------------------------------------
    Metric("failslow_whatif_worker_slowdown_ratio", "gauge",
           "What-if slowdown attributable to one worker (S_w): simulated step time with only this worker straggling (all else idealised) over the ideal step time.",
           ("job", "dp_rank", "pp_rank"), "whatif"),
)


def by_name() -> dict[str, Metric]:
    """The catalogue indexed by metric name."""
    return {m.name: m for m in CATALOGUE}

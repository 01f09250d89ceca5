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
    Metric("failslow_last_iteration_timestamp_seconds", "gauge",
           "Unix time the rank last completed an iteration (from its call stream); a hang stops it.",
           RANK_LABELS, "exporter"),
    Metric("failslow_iteration_period_calls", "gauge",
           "Communication calls per iteration of the rank (the inferred ACF period).", RANK_LABELS, "exporter"),
    Metric("failslow_iteration_period_confidence_ratio", "gauge",
           "Confidence in the rank's inferred period (0-1); below 0.5 its iteration time, period and split are "
           "not shown.", RANK_LABELS, "exporter"),
    Metric("failslow_iteration_comm_seconds", "gauge",
           "Mean time per iteration the rank spent inside communication calls, over the last window.",
           RANK_LABELS, "exporter"),
    Metric("failslow_iteration_compute_seconds", "gauge",
           "Mean time per iteration the rank spent outside communication calls (compute, data, host), "
           "over the last window.", RANK_LABELS, "exporter"),
    Metric("failslow_iteration_outside_pipeline_compute_seconds", "gauge",
           "Mean time per iteration the rank spent outside communication calls between its pipeline's last "
           "send/receive of one iteration and its first of the next (optimizer step, gradient copies, host work: "
           "what does not scale with micro-batches; a first stage's also holds one micro-batch's forward and "
           "backward), over the last window; absent where it cannot be told (no pipeline, no data-parallel "
           "collective).", RANK_LABELS, "exporter"),
    Metric("failslow_comm_calls_total", "counter", "Communication calls the rank issued on one communicator.",
           COMM_LABELS, "exporter"),
    Metric("failslow_comm_bytes_total", "counter", "Payload bytes of the rank's calls on one communicator.",
           COMM_LABELS, "exporter"),
    Metric("failslow_comm_call_duration_seconds", "summary",
           "Time inside the rank's calls on one communicator (GPU time when profiled, else host time): "
           "waiting for peers plus transfer.", COMM_LABELS, "exporter"),
    Metric("failslow_comm_info", "gauge",
           "1 for every communicator a rank uses: its size, the rank's position in it and the parallel group "
           "kind it was matched to (tp, cp, dp, pp, world, p2p or unknown).",
           ("job", "rank", "comm", "nranks", "comm_rank", "group"), "exporter"),
    Metric("failslow_exporter_rings", "gauge", "Rings of live processes the exporter follows, by producer.",
           ("producer",), "exporter"),
    # --- exporter: NVML collector ----------------------------------------------------------------
    Metric("failslow_gpu_info", "gauge", "1 per GPU with its UUID and product name.",
           ("node", "gpu", "uuid", "name"), "exporter"),
    Metric("failslow_gpu_sm_clock_hertz", "gauge", "Current SM clock.", ("node", "gpu"), "exporter"),
    Metric("failslow_gpu_sm_clock_max_hertz", "gauge", "Maximum SM clock.", ("node", "gpu"), "exporter"),
    Metric("failslow_gpu_temperature_celsius", "gauge", "GPU die temperature.", ("node", "gpu"), "exporter"),
    Metric("failslow_gpu_power_watts", "gauge", "Power draw.", ("node", "gpu"), "exporter"),
    Metric("failslow_gpu_utilization_ratio", "gauge", "Fraction of the last sample period a kernel ran.",
           ("node", "gpu"), "exporter"),
    Metric("failslow_gpu_clock_event_active", "gauge",
           "1 while NVML reports this clock event (throttle) reason as active, else 0.",
           ("node", "gpu", "reason"), "exporter"),
    Metric("failslow_gpu_xid_errors_total", "counter", "XID errors NVML reported since the exporter started.",
           ("node", "gpu"), "exporter"),
    Metric("failslow_gpu_last_xid", "gauge", "Code of the most recent XID error (0 = none seen).",
           ("node", "gpu"), "exporter"),
    # --- exporter: self-metrics ------------------------------------------------------------------
    Metric("failslow_exporter_collector_success", "gauge", "1 if the collector's last scrape succeeded, else 0.",
           ("collector",), "exporter"),
    Metric("failslow_exporter_collector_duration_seconds", "gauge", "How long the collector's last scrape took.",
           ("collector",), "exporter"),
    # --- detector ------------------------------------------------------------------------------
    Metric("failslow_detector_failslow", "gauge", "1 while the detector holds an open fail-slow event for the job.",
           ("job",), "detector"),
    Metric("failslow_detector_slowdown_ratio", "gauge",
           "Mean iteration time after the change point over the mean before it (1 when healthy).", ("job",),
           "detector"),
    Metric("failslow_detector_baseline_seconds", "gauge",
           "The job's healthy iteration time the open event's slowdown ratio is measured against "
           "(removed when the event closes).", ("job",), "detector"),
    Metric("failslow_detector_onset_timestamp_seconds", "gauge",
           "Unix time of the first slow iteration of the open event.", ("job",), "detector"),
    Metric("failslow_detector_suspect", "gauge",
           "Confidence (0-1) that a rank (kind=compute) or a node's link (kind=link) causes the open event; "
           "0 for one named earlier in the event and not any more; at most a few per job, removed when the event "
           "closes.", ("job", "kind", "rank", "node"), "detector"),
    Metric("failslow_detector_events_total", "counter", "Fail-slow events the detector opened for the job.",
           ("job",), "detector"),
    Metric("failslow_detector_up", "gauge", "1 while the detector process runs.", (), "detector"),
    Metric("failslow_detector_last_poll_success", "gauge", "1 if the last poll of Prometheus succeeded.", (),
           "detector"),
    Metric("failslow_detector_last_poll_timestamp_seconds", "gauge", "Unix time of the last successful poll.",
           (), "detector"),
    Metric("failslow_detector_poll_duration_seconds", "gauge", "How long the last poll (query + detection) took.",
           (), "detector"),
    Metric("failslow_detector_prometheus_up", "gauge", "1 if Prometheus answered the last query.", (), "detector"),
    Metric("failslow_detector_redis_up", "gauge", "1 if Redis answered the last state read or write.", (),
           "detector"),
    Metric("failslow_detector_series", "gauge", "Per-rank series the detector tracks.", (), "detector"),
    Metric("failslow_detector_jobs", "gauge",
           "Training jobs the detector watches: all of them, or this replica's share when sharded.", (), "detector"),
    Metric("failslow_detector_shard", "gauge",
           "This replica's shard: it watches the jobs whose hashmod of the job label (Prometheus relabel "
           "hashmod: MD5, last 8 bytes, modulo failslow_detector_shards) equals this value.", (), "detector"),
    Metric("failslow_detector_shards", "gauge", "Detector replicas the jobs are split over (1: not sharded).", (),
           "detector"),
    # --- remediator ----------------------------------------------------------------------------
    Metric("failslow_remediator_deliveries_total", "counter",
           "Webhook deliveries by outcome: accepted (something new stored), duplicate (every alert seen "
           "before), stale (older than what was seen), unauthorized, malformed, unavailable (Redis down: 503).",
           ("outcome",), "remediator"),
    Metric("failslow_remediator_decisions_total", "counter",
           "Planner decisions by strategy (ignore, validate, rebalance, topology, restart), counted when a "
           "job's decision changes.", ("strategy",), "remediator"),
    Metric("failslow_remediator_actions_total", "counter",
           "Actions that ended, by strategy and result (succeeded, failed, rejected, dry_run).",
           ("strategy", "result"), "remediator"),
    Metric("failslow_remediator_action_duration_seconds", "histogram",
           "Wall time of an action, from the adapter call to its answer.", ("strategy",), "remediator"),
    Metric("failslow_remediator_decision_latency_seconds", "histogram",
           "From the first delivery of an event to the adapter call of its action.", ("strategy",),
           "remediator"),
    Metric("failslow_remediator_actions_in_flight", "gauge", "Actions this replica is executing now.", (),
           "remediator"),
    Metric("failslow_remediator_open_events", "gauge", "Open fail-slow events (shared state, as last read).", (),
           "remediator"),
    Metric("failslow_remediator_auto_mode", "gauge", "1 when the remediator acts (mode auto), 0 in dry-run.", (),
           "remediator"),
    Metric("failslow_remediator_redis_up", "gauge", "1 if Redis answered the remediator's last request.", (),
           "remediator"),
    Metric("failslow_remediator_prometheus_up", "gauge", "1 if Prometheus answered the remediator's last query.",
           (), "remediator"),
    # --- what-if -------------------------------------------------------------------------------
    Metric("failslow_whatif_worker_slowdown_ratio", "gauge",
           "What-if slowdown attributable to one worker (S_w): simulated step time with only this worker straggling (all else idealised) over the ideal step time.",
           ("job", "dp_rank", "pp_rank"), "whatif"),
)


def by_name() -> dict[str, Metric]:
    """The catalogue indexed by metric name."""
    return {m.name: m for m in CATALOGUE}

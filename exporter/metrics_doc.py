"""Generates docs/METRICS.md from the metric catalogue, with series counts per node and per 10k GPUs.

What it is for: one table of every series failslow exposes, always in step with `failslow.catalogue`
(a test checks that every exporter metric of the catalogue is in the committed file), plus the cardinality budget an operator needs
before pointing Prometheus at a large cluster. Regenerate with ``python -m exporter.metrics_doc``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from failslow.catalogue import CATALOGUE

DOC = Path(__file__).resolve().parent.parent / "docs" / "METRICS.md"


@dataclass(frozen=True)
class Scale:
    """The cluster the series counts are computed for.

    Attributes:
        gpus_per_node: Ranks (one per GPU) and GPUs on each node.
        comm_ops: Distinct (communicator, op) pairs per rank: e.g. TP all-reduce + reduce-scatter +
            all-gather, DP all-reduce (or reduce-scatter + all-gather), pipeline send + recv to each
            neighbour, a world barrier.
        comms: Communicators per rank (TP, DP, PP neighbours, embedding, world).
        clock_reasons: NVML clock-event reasons exposed per GPU.
        collectors: Collectors per exporter.
        jobs_per_10k: Concurrent jobs on 10k GPUs (detector series are per job).
        gpus: GPUs in the large cluster.
    """

    gpus_per_node: int = 8
    comm_ops: int = 10
    comms: int = 6
    clock_reasons: int = 9
    collectors: int = 3
    jobs_per_10k: int = 20
    gpus: int = 10_000


# metric -> (formula shown in the doc, series per node, or per job for job-level metrics)
Count = Callable[[Scale], int]
_PER_NODE: dict[str, tuple[str, Count]] = {
    "failslow_iteration_duration_seconds": ("R", lambda s: s.gpus_per_node),
    "failslow_iterations_total": ("R", lambda s: s.gpus_per_node),
    "failslow_last_iteration_timestamp_seconds": ("R", lambda s: s.gpus_per_node),
    "failslow_iteration_period_calls": ("R", lambda s: s.gpus_per_node),
    "failslow_iteration_comm_seconds": ("R", lambda s: s.gpus_per_node),
    "failslow_iteration_compute_seconds": ("R", lambda s: s.gpus_per_node),
    "failslow_iteration_outside_pipeline_compute_seconds": ("R", lambda s: s.gpus_per_node),
    "failslow_ring_dropped_records_total": ("R", lambda s: s.gpus_per_node),
    "failslow_comm_calls_total": ("R x CO", lambda s: s.gpus_per_node * s.comm_ops),
    "failslow_comm_bytes_total": ("R x CO", lambda s: s.gpus_per_node * s.comm_ops),
    "failslow_comm_call_duration_seconds": ("2 x R x CO (_sum, _count)", lambda s: 2 * s.gpus_per_node * s.comm_ops),
    "failslow_comm_info": ("R x C", lambda s: s.gpus_per_node * s.comms),
    "failslow_exporter_rings": ("1 per producer kind (<= 3)", lambda s: 1),
    "failslow_gpu_info": ("G", lambda s: s.gpus_per_node),
    "failslow_gpu_sm_clock_hertz": ("G", lambda s: s.gpus_per_node),
    "failslow_gpu_sm_clock_max_hertz": ("G", lambda s: s.gpus_per_node),
    "failslow_gpu_temperature_celsius": ("G", lambda s: s.gpus_per_node),
    "failslow_gpu_power_watts": ("G", lambda s: s.gpus_per_node),
    "failslow_gpu_utilization_ratio": ("G", lambda s: s.gpus_per_node),
    "failslow_gpu_clock_event_active": ("G x 9 reasons", lambda s: s.gpus_per_node * s.clock_reasons),
    "failslow_gpu_xid_errors_total": ("G", lambda s: s.gpus_per_node),
    "failslow_gpu_last_xid": ("G", lambda s: s.gpus_per_node),
    "failslow_exporter_collector_success": ("collectors (3)", lambda s: s.collectors),
    "failslow_exporter_collector_duration_seconds": ("collectors (3)", lambda s: s.collectors),
    # served by the exporter's textfile collector: one per (DP, PP) cell of each analysed job
}


# Label values of the per-process families without a job label (the remediator's): bounded enums.
_ENUM_SIZES: dict[str, int] = {"outcome": 6, "strategy": 5, "result": 4}
_HISTOGRAM_SERIES = 15  # per label set: at most 12 buckets, +Inf, _sum and _count


def _per_process(labels: tuple[str, ...], type_: str) -> int | None:
    """Series of a family with only enum labels, per process; None when a label is not a bounded enum."""
    n = 1
    for lab in labels:
        if lab not in _ENUM_SIZES:
            return None
        n *= _ENUM_SIZES[lab]
    if labels == ("strategy", "result"):
        n = (_ENUM_SIZES["strategy"] - 1) * _ENUM_SIZES["result"]  # "ignore" is a decision, never an action
    elif labels == ("strategy",) and type_ == "histogram":
        n = (_ENUM_SIZES["strategy"] - 1) * _HISTOGRAM_SERIES
    return n


def _per_10k(per_node: int, s: Scale) -> int:
    return per_node * (s.gpus // s.gpus_per_node)


def render(scale: Scale | None = None) -> str:
    """The whole of docs/METRICS.md as text (pure)."""
    s = scale or Scale()
    nodes = s.gpus // s.gpus_per_node
    lines = [
        "# Metrics",
        "",
        "Every series failslow exposes, generated from `failslow/catalogue.py` by "
        "`python -m exporter.metrics_doc` (a test fails when an exporter metric is missing here). Label sets are bounded: no "
        "per-iteration, per-call or per-step labels.",
        "",
        f"Series counts assume {s.gpus_per_node} GPUs (= ranks) per node (R = G = {s.gpus_per_node}), "
        f"C = {s.comms} communicators per rank and CO = {s.comm_ops} distinct (communicator, op) pairs per rank "
        f"(TP all-reduce/reduce-scatter/all-gather, DP all-reduce, pipeline send/recv to each neighbour, a world "
        f"barrier); 10k GPUs = {nodes} nodes. Detector series are per job ({s.jobs_per_10k} jobs assumed on 10k "
        "GPUs). What-if series come from textfiles: DP x PP per analysed job.",
        "",
        "| metric | type | labels | exposed by | series per node | per node (count) | per 10k GPUs | help |",
        "|---|---|---|---|---|---|---|---|",
    ]
    tot_node = 0
    tot_10k = 0
    for m in CATALOGUE:
        if m.name in _PER_NODE:
            formula, fn = _PER_NODE[m.name]
            n = fn(s)
            big = _per_10k(n, s)
            node_cell, count_cell, big_cell = formula, str(n), f"{big:,}"
        elif not m.labels:
            n, big = 0, 1
            node_cell, count_cell, big_cell = f"1 per {m.source} process", "-", "1"
        elif "job" not in m.labels and (k := _per_process(m.labels, m.type)) is not None:
            n, big = 0, k
            node_cell, count_cell, big_cell = f"{k} per {m.source} process", "-", f"{k:,}"
        elif set(m.labels) <= {"job"}:
            n, big = 0, s.jobs_per_10k
            node_cell, count_cell, big_cell = f"1 per job ({m.source})", "-", f"{big:,}"
        else:
            n, big = 0, 0
            dims = ", ".join(x for x in m.labels if x != "job")
            node_cell, count_cell, big_cell = f"per job and {dims} ({m.source})", "-", "-"
        tot_node += n
        tot_10k += big
        labels = ", ".join(f"`{x}`" for x in m.labels)
        lines.append(f"| `{m.name}` | {m.type} | {labels} | {m.source} | {node_cell} | {count_cell} | {big_cell} | "
                     f"{m.help} |")
    lines += [
        "",
        f"**Total per node: {tot_node} series** from the node exporter; **about {tot_10k:,} series for 10k GPUs** "
        f"(plus per-job detector and what-if series). The per-communicator families "
        "(`failslow_comm_*`) are {:.0%} of that: drop them at scrape time with a `metric_relabel_configs` rule if "
        "only iteration times and GPU health are wanted.".format(
            sum(fn(s) for k, (_, fn) in _PER_NODE.items() if k.startswith("failslow_comm_")) / max(tot_node, 1)),
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    """Write docs/METRICS.md."""
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(render())
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

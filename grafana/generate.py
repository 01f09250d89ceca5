"""Dashboards as code: builds grafana/dashboards/*.json from the panel lists below.

Edit this file, then run `python grafana/generate.py` to rewrite the JSON (the JSON is committed so that
Grafana's file provisioning picks it up as is); `python grafana/generate.py --check` exits 1 when the
committed JSON is stale. tests/integration/test_dashboards.py checks the structure and runs every panel
query against a real Prometheus.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
DS_UID = "failslow-prometheus"  # provisioning/datasources/prometheus.yml


@dataclass
class Q:
    """One PromQL query of a panel."""

    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False


@dataclass
class P:
    """One panel: title, visualisation, queries and the bits of options that differ between panels."""

    title: str
    kind: str
    queries: list[Q]
    w: int = 12
    h: int = 8
    unit: str = ""
    description: str = ""
    thresholds: list[tuple[float | None, str]] = field(default_factory=list)
    mappings: list[dict[str, Any]] = field(default_factory=list)
    transformations: list[dict[str, Any]] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    custom: dict[str, Any] = field(default_factory=dict)


J = 'job=~"$job"'
N = 'node=~"$node"'
RATIO_STEPS: list[tuple[float | None, str]] = [(None, "green"), (1.1, "yellow"), (1.2, "orange"), (1.5, "red")]


def _matrix(row: str, col: str) -> list[dict[str, Any]]:
    """Turn an instant table with `row`, `col` and Value columns into a row x col grid (the heatmap)."""
    return [{"id": "groupingToMatrix",
             "options": {"columnField": col, "rowField": row, "valueField": "Value", "emptyValue": "null"}}]


def _grid_options() -> dict[str, Any]:
    return {"showHeader": True, "cellHeight": "lg", "footer": {"show": False}}


def _bars() -> dict[str, Any]:
    """Horizontal bars of the last value of each series (the bar gauge's counts over the time range)."""
    return {"orientation": "horizontal", "displayMode": "basic", "showUnfilled": True,
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}


OVERVIEW: list[tuple[str, list[P]]] = [
    ("Jobs", [
        P("Fail-slow state", "stat", [Q(f"max by (job) (failslow_detector_failslow{{{J}}})", "{{job}}")], w=4,
          description="The detector's verdict per job (BOCD + verification).",
          mappings=[{"type": "value", "options": {"0": {"text": "healthy", "color": "green"},
                                                  "1": {"text": "FAIL-SLOW", "color": "red"}}}],
          thresholds=[(None, "green"), (1, "red")]),
        P("Slowdown ratio", "stat", [Q(f"max by (job) (failslow_detector_slowdown_ratio{{{J}}})", "{{job}}")],
          w=4, description="Mean iteration time since the change point over the mean before it.",
          thresholds=RATIO_STEPS, options={"graphMode": "area"}),
        P("Throughput (iterations/s)", "stat", [Q(f"job:failslow_iterations:rate1m{{{J}}}", "{{job}}")], w=2,
          unit="short", options={"graphMode": "area"}),
        P("Fail-slow events (24h)", "stat",
          [Q(f"sum by (job) (increase(failslow_detector_events_total{{{J}}}[24h]))", "{{job}}")], w=2,
          unit="short", thresholds=[(None, "green"), (1, "orange")]),
        P("Suspects", "table",
          [Q(f"failslow_detector_suspect{{{J}}} > 0", instant=True, table=True)], w=6,
          description="Culprits the detector named for open events: kind (compute or link) and where."),
        P("Component health", "stat", [Q('up{job=~"failslow-.*"}', "{{job}} {{instance}}"),
                                       Q("failslow_detector_last_poll_success", "detector polls Prometheus"),
                                       Q('count(count_values("shard", failslow_detector_shard)) '
                                         '/ max(failslow_detector_shards)',
                                         "detector shards with a replica (1 = all)")], w=6,
          description="`up` of every failslow scrape target (exporters, detector replicas, remediator), whether "
                      "the detector's last poll of Prometheus succeeded, and the share of detector shards some "
                      "replica runs (below 1: a shard's jobs are not watched; DetectorShardMissing).",
          mappings=[{"type": "value", "options": {"0": {"text": "DOWN", "color": "red"},
                                                  "1": {"text": "up", "color": "green"}}}],
          thresholds=[(None, "red"), (1, "green")], options={"textMode": "value_and_name"}),
    ]),
    ("Stragglers", [
        P("DP×PP straggler heatmap", "table",
          [Q(f"max by (dp_rank, pp_rank) (job_rank:failslow_iteration_compute_seconds:ratio_stage_quantile25{{{J}}})",
             instant=True, table=True)],
          description="Per-rank slowdown ratio: compute time per iteration over its pipeline stage's lower quartile "
                      "(max over TP ranks). Rows: pp_rank, columns: dp_rank. 1 = healthy; RankStraggler fires "
                      "above 1.2 (2-minute median) for 2m.",
          thresholds=RATIO_STEPS, transformations=_matrix("pp_rank", "dp_rank"), options=_grid_options(),
          custom={"cellOptions": {"type": "color-background"}, "align": "center"}),
        P("What-if worker slowdown S_w (DP×PP)", "table",
          [Q(f"max by (dp_rank, pp_rank) (failslow_whatif_worker_slowdown_ratio{{{J}}})", instant=True, table=True)],
          description="From `failslow whatif`: the job's simulated step time with only this worker straggling "
                      "(everything else idealised) over the ideal step time.",
          thresholds=RATIO_STEPS, transformations=_matrix("pp_rank", "dp_rank"), options=_grid_options(),
          custom={"cellOptions": {"type": "color-background"}, "align": "center"}),
        P("Per-rank slowdown ratio over time", "status-history",
          [Q(f"job_rank:failslow_iteration_compute_seconds:ratio_stage_quantile25{{{J}}}",
             "rank {{rank}} (dp {{dp_rank}}, pp {{pp_rank}}, tp {{tp_rank}})")],
          thresholds=RATIO_STEPS, options={"showValue": "never", "rowHeight": 0.9}),
        P("Compute vs communication per iteration", "timeseries",
          [Q(f"failslow_iteration_compute_seconds{{{J}}}", "compute r{{rank}}"),
           Q(f"failslow_iteration_comm_seconds{{{J}}}", "comm r{{rank}}"),
           Q(f"failslow_iteration_outside_pipeline_compute_seconds{{{J}}}", "outside pipeline r{{rank}}")],
          unit="s",
          description="A straggler computes longer; its peers spend the same extra time waiting in collectives. "
                      "Outside pipeline: the part of the compute done once per iteration (optimizer step, host "
                      "work), which a micro-batch split does not move."),
    ]),
    ("Iteration time", [
        P("Iteration time per rank (detector onsets marked)", "timeseries",
          [Q(f"failslow_iteration_duration_seconds{{{J}}}", "r{{rank}} (dp {{dp_rank}}, pp {{pp_rank}})"),
           Q(f"job:failslow_iteration_duration_seconds:median{{{J}}}", "median {{job}}")], unit="s",
          description="Exporter's per-rank iteration time (mean over its window). Annotations: detector onsets "
                      "and firing alerts."),
        P("Iteration time / job median", "timeseries",
          [Q(f"job_rank:failslow_iteration_duration_seconds:ratio_job_median{{{J}}}", "r{{rank}}")],
          unit="short"),
        P("Detector slowdown ratio", "timeseries",
          [Q(f"failslow_detector_slowdown_ratio{{{J}}}", "{{job}}")], unit="short", thresholds=RATIO_STEPS),
        P("Seconds since last iteration", "timeseries",
          [Q(f"time() - max by (job) (failslow_last_iteration_timestamp_seconds{{{J}}})", "{{job}}")], unit="s",
          description="Grows without bound in a hang (TrainingStalled); saw-tooth below the iteration time when "
                      "healthy."),
    ]),
    ("Links / communicators", [
        P("Time in collectives per rank", "timeseries",
          [Q(f"sum by (rank) (rate(failslow_comm_call_duration_seconds_sum{{{J}}}[$__rate_interval]))",
             "r{{rank}}")], unit="percentunit",
          description="Fraction of wall time each rank spends inside communication calls (waiting plus transfer)."),
        P("Achieved bandwidth per communicator", "timeseries",
          [Q(f"sum by (comm, op) (rate(failslow_comm_bytes_total{{{J}}}[$__rate_interval]))"
             f" / sum by (comm, op) (rate(failslow_comm_call_duration_seconds_sum{{{J}}}[$__rate_interval]))",
             "{{op}} comm {{comm}}")], unit="Bps",
          description="Payload bytes over time inside the calls; a link fault drops it on the communicators "
                      "crossing that link."),
        P("Mean call duration per op", "timeseries",
          [Q(f"sum by (op) (rate(failslow_comm_call_duration_seconds_sum{{{J}}}[$__rate_interval]))"
             f" / sum by (op) (rate(failslow_comm_call_duration_seconds_count{{{J}}}[$__rate_interval]))",
             "{{op}}")], unit="s"),
        P("Communicators", "table",
          [Q(f"max by (comm, group, nranks) (failslow_comm_info{{{J}}})", instant=True, table=True)],
          description="Every communicator of the job and the parallel group kind the exporter matched it to."),
    ]),
    ("GPUs", [
        P("SM clock / max clock", "timeseries",
          [Q(f"failslow_gpu_sm_clock_hertz{{{N}}} / failslow_gpu_sm_clock_max_hertz{{{N}}}",
             "{{node}} gpu{{gpu}}")], unit="percentunit", w=8),
        P("GPU temperature", "timeseries",
          [Q(f"failslow_gpu_temperature_celsius{{{N}}}", "{{node}} gpu{{gpu}}")], unit="celsius", w=8),
        P("GPU power", "timeseries", [Q(f"failslow_gpu_power_watts{{{N}}}", "{{node}} gpu{{gpu}}")], unit="watt",
          w=8),
        P("GPU utilisation", "timeseries",
          [Q(f"failslow_gpu_utilization_ratio{{{N}}}", "{{node}} gpu{{gpu}}")], unit="percentunit", w=8),
        P("Clock event (throttle) reasons", "status-history",
          [Q(f"failslow_gpu_clock_event_active{{{N}}}", "{{node}} gpu{{gpu}} {{reason}}")], w=8,
          thresholds=[(None, "green"), (1, "red")], options={"showValue": "never"}),
        P("XID errors (last hour)", "stat",
          [Q(f"sum by (node, gpu) (increase(failslow_gpu_xid_errors_total{{{N}}}[1h]))", "{{node}} gpu{{gpu}}")],
          w=8, thresholds=[(None, "green"), (1, "red")]),
    ]),
    ("Actions", [
        P("Alerts sent to the remediator", "table",
          [Q('ALERTS{remediate="true", alertstate="firing"}', instant=True, table=True)],
          description="Alerts Alertmanager routes to the remediator webhook (remediate=\"true\")."),
        P("Firing alerts", "timeseries",
          [Q('count by (alertname, severity) (ALERTS{alertstate="firing"})', "{{alertname}} ({{severity}})")],
          unit="short"),
        # The remediator's own metrics carry no training job (all jobs, all replicas): counters are summed
        # over replicas, its shared state (open events) is the max, per-replica health stays per instance.
        P("Actions in flight", "stat", [Q("sum(failslow_remediator_actions_in_flight)", "in flight")], w=6, h=4,
          unit="short", description="Actions the remediator replicas are executing now (adapter calls running).",
          thresholds=[(None, "green"), (1, "blue")]),
        P("Open events (remediator)", "stat", [Q("max(failslow_remediator_open_events)", "open events")], w=6, h=4,
          unit="short", description="Open fail-slow events in the remediator's shared state (Redis), as its "
                                    "replicas last read it.",
          thresholds=[(None, "green"), (1, "orange")]),
        P("Remediator mode", "stat", [Q("max by (instance) (failslow_remediator_auto_mode)", "{{instance}}")],
          w=6, h=4, description="auto: the remediator acts; dry-run (the default): it plans and audits only. "
                                "Replicas should agree.",
          mappings=[{"type": "value", "options": {"0": {"text": "dry-run", "color": "blue"},
                                                  "1": {"text": "auto", "color": "green"}}}],
          thresholds=[(None, "blue"), (1, "green")], options={"textMode": "value_and_name"}),
        P("Remediator dependencies (Redis, Prometheus)", "stat",
          [Q("max by (instance) (failslow_remediator_redis_up)", "{{instance}} Redis"),
           Q("max by (instance) (failslow_remediator_prometheus_up)", "{{instance}} Prometheus")], w=6, h=4,
          description="Whether each replica's last request to Redis (all its state) and to Prometheus (the job's "
                      "pace) was answered. Redis down for 2 minutes fires RemediationFailing. A replica queries "
                      "Prometheus only while an event is open, and reads DOWN until its first query.",
          mappings=[{"type": "value", "options": {"0": {"text": "DOWN", "color": "red"},
                                                  "1": {"text": "up", "color": "green"}}}],
          thresholds=[(None, "red"), (1, "green")], options={"textMode": "value_and_name"}),
        P("Remediator actions by strategy and result", "bargauge",
          [Q("sum by (strategy, result) (increase(failslow_remediator_actions_total[$__range]))",
             "{{strategy}} {{result}}", instant=True)], w=8, unit="short",
          description="Actions that ended in the time range, all replicas: succeeded, failed (RemediationFailing), "
                      "rejected by a person, dry_run (planned only, the remediator is in dry-run mode).",
          options=_bars()),
        P("Remediator decisions by strategy", "bargauge",
          [Q("sum by (strategy) (increase(failslow_remediator_decisions_total[$__range]))", "{{strategy}}",
             instant=True)], w=8, unit="short",
          description="Planner decisions in the time range, counted when a job's decision changes: ignore (wait: "
                      "ski rental, cooldown, cap), validate, rebalance, topology, restart.",
          options=_bars()),
        P("Webhook deliveries by outcome (per minute)", "timeseries",
          [Q("60 * sum by (outcome) (rate(failslow_remediator_deliveries_total[$__rate_interval]))", "{{outcome}}")],
          w=8, unit="short",
          description="Alertmanager deliveries to the remediator: accepted (something new), duplicate, stale, "
                      "unauthorized (wrong token: never retried, the alert is lost), malformed, unavailable "
                      "(Redis away: answered 503, Alertmanager retries)."),
        P("Decision latency p50 / p90", "timeseries",
          [Q(f"histogram_quantile({q}, sum by (le) "
             f"(rate(failslow_remediator_decision_latency_seconds_bucket[1h])))", f"p{round(q * 100)}")
           for q in (0.5, 0.9)], unit="s",
          description="From the first delivery of an event to the adapter call of its action (ski-rental wait and "
                      "approval included), over the trailing hour; gaps: no action in that hour."),
        P("Action duration p90 by strategy", "timeseries",
          [Q("histogram_quantile(0.9, sum by (strategy, le) "
             "(rate(failslow_remediator_action_duration_seconds_bucket[1h])))", "{{strategy}}")], unit="s",
          description="Wall time of an action, adapter call to answer, over the trailing hour; gaps: no action of "
                      "that strategy in that hour."),
        P("Ring records dropped", "timeseries",
          [Q(f"sum by (job, rank) (rate(failslow_ring_dropped_records_total{{{J}}}[$__rate_interval]))",
             "{{job}} r{{rank}}")], unit="short",
          description="Records per second the producers overwrote before the exporter read them."),
        P("Exporter collectors", "timeseries",
          [Q("failslow_exporter_collector_success", "{{instance}} {{collector}} ok"),
           Q("failslow_exporter_collector_duration_seconds", "{{instance}} {{collector}} s")], unit="short"),
    ]),
]


def _panel(p: P, pid: int, x: int, y: int) -> dict[str, Any]:
    targets = []
    for i, q in enumerate(p.queries):
        t: dict[str, Any] = {"datasource": DS, "expr": q.expr, "refId": chr(ord("A") + i),
                             "legendFormat": q.legend or "__auto", "range": not q.instant, "instant": q.instant}
        if q.table:
            t["format"] = "table"
        targets.append(t)
    defaults: dict[str, Any] = {}
    if p.unit:
        defaults["unit"] = p.unit
    if p.thresholds:
        defaults["thresholds"] = {"mode": "absolute",
                                  "steps": [{"color": c, "value": v} for v, c in p.thresholds]}
        defaults["color"] = {"mode": "thresholds"}
    if p.mappings:
        defaults["mappings"] = p.mappings
    if p.custom:
        defaults["custom"] = p.custom
    panel: dict[str, Any] = {"id": pid, "type": p.kind, "title": p.title, "datasource": DS,
                             "gridPos": {"h": p.h, "w": p.w, "x": x, "y": y}, "targets": targets,
                             "fieldConfig": {"defaults": defaults, "overrides": []}, "options": p.options}
    if p.description:
        panel["description"] = p.description
    if p.transformations:
        panel["transformations"] = p.transformations
    return panel


def _variables() -> list[dict[str, Any]]:
    def query_var(name: str, label: str, query: str, *, multi: bool) -> dict[str, Any]:
        return {"name": name, "label": label, "type": "query", "datasource": DS,
                "query": {"query": query, "refId": f"{name}-var"}, "definition": query, "refresh": 2,
                "includeAll": multi, "multi": multi, "allValue": ".*" if multi else None, "sort": 1,
                "current": {}, "options": [], "hide": 0}

    return [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {"text": "Prometheus (failslow)", "value": DS_UID}, "hide": 0, "options": [], "refresh": 1},
        query_var("job", "Training job", "label_values(failslow_iteration_duration_seconds, job)", multi=False),
        query_var("node", "Node (GPU panels)",
                  'label_values(failslow_iteration_duration_seconds{job=~"$job"}, node)', multi=True),
    ]


def _annotations() -> list[dict[str, Any]]:
    return [
        {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
         "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"},
        # The detector's onset timestamp as an annotation at that time (value used as the time).
        {"name": "Fail-slow onsets", "datasource": DS, "enable": True, "iconColor": "red",
         "expr": f"max by (job) (failslow_detector_onset_timestamp_seconds{{{J}}} > 0) * 1000",
         "useValueForTime": True, "step": "30s", "titleFormat": "fail-slow onset", "textFormat": "job {{job}}",
         "tagKeys": "job"},
        {"name": "Alerts", "datasource": DS, "enable": True, "iconColor": "orange",
         "expr": f'ALERTS{{alertstate="firing", {J}}}', "step": "30s", "titleFormat": "{{alertname}}",
         "textFormat": "{{severity}}", "tagKeys": "alertname,severity"},
    ]


def build_overview() -> dict[str, Any]:
    """The overview dashboard: jobs, stragglers, iteration time, links, GPUs, actions."""
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for row_title, row in OVERVIEW:
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y, x, row_h = pid + 1, y + 1, 0, 0
        for p in row:
            if x + p.w > 24:
                x, y, row_h = 0, y + row_h, 0
            panels.append(_panel(p, pid, x, y))
            pid, x, row_h = pid + 1, x + p.w, max(row_h, p.h)
        y += row_h
    return {
        "uid": "failslow-overview", "title": "failslow — overview", "tags": ["failslow"],
        "description": "Fail-slow detection for hybrid-parallel training: detector state, DP×PP stragglers, "
                       "iteration time with change points, communicators, GPUs and actions.",
        "editable": False, "graphTooltip": 1, "schemaVersion": 39, "version": 1, "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"}, "timepicker": {}, "timezone": "utc", "links": [],
        "templating": {"list": _variables()}, "annotations": {"list": _annotations()}, "panels": panels,
    }


DASHBOARDS = {"failslow-overview.json": build_overview}


def render(name: str) -> str:
    """The JSON text of dashboard `name` as committed."""
    return json.dumps(DASHBOARDS[name](), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed JSON differs")
    args = ap.parse_args(argv)
    stale = []
    for name in DASHBOARDS:
        path, text = OUT / name, render(name)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {stale}; run python grafana/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

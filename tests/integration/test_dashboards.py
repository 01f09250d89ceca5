"""Grafana dashboards: structure, and every query run against a real Prometheus holding data.

There is no Grafana here, so the test checks what Grafana would need (valid JSON, unique panel ids, grid,
datasource references matching the provisioned datasource) and runs every panel, annotation, variable and
runbook query against a real /usr/bin/prometheus that scrapes three small prometheus-client endpoints
served by the test (node agent, detector, remediator). The endpoints expose every metric of failslow/catalogue.py with the catalogue's labels,
so a dashboard that queries a metric or label the catalogue does not have comes back empty and fails.
Prometheus runs the shipped config and rules (1s intervals instead of 5s to have data sooner).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import requests
import yaml
from prometheus_client import CollectorRegistry, MetricsHandler
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.utils import floatToGoString

from failslow.catalogue import CATALOGUE, by_name
from failslow_cli.stack.processes import (
    GRAFANA_DIR,
    PROMETHEUS_DIR,
    RUNBOOKS_DIR,
    alert_rules,
    free_port,
    prometheus,
    recording_rules,
    render_prometheus,
)

DASHBOARDS = sorted((GRAFANA_DIR / "dashboards").glob("*.json"))
# $__rate_interval: Grafana's is >= 4 scrape intervals; 30s keeps rate() fed when a loaded machine delays
# scrapes of the 1s test interval.
TEMPLATE_VALUES = {"$job": "llm", "$node": ".*", "$__rate_interval": "30s", "$__interval": "1s", "$__range": "1h"}
BUILTIN_METRICS = {"up", "ALERTS", "ALERTS_FOR_STATE", "time"}


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grafana_generate", GRAFANA_DIR / "generate.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def _queries(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expr) for every panel target and annotation query."""
    qs = [(f"panel {p['title']!r}", t["expr"]) for p in _panels(dash) for t in p.get("targets", [])]
    qs += [(f"annotation {a['name']!r}", a["expr"]) for a in dash["annotations"]["list"] if "expr" in a]
    return qs


def _runbook_queries() -> list[tuple[str, str]]:
    return [(p.name, q.strip()) for p in sorted(RUNBOOKS_DIR.glob("*.md"))
            for q in re.findall(r"```promql\n(.*?)```", p.read_text(), flags=re.S)]


def _substitute(expr: str) -> str:
    for k in sorted(TEMPLATE_VALUES, key=len, reverse=True):
        expr = expr.replace(k, TEMPLATE_VALUES[k])
    return expr


# --- structure ------------------------------------------------------------------------------------------


def test_dashboards_exist_and_generator_is_in_sync() -> None:
    assert [p.name for p in DASHBOARDS] == ["failslow-overview.json"]
    gen = _generator()
    for path in DASHBOARDS:
        assert path.read_text() == gen.render(path.name), f"{path.name} is stale: run python grafana/generate.py"
    assert gen.main(["--check"]) == 0


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_structure(path: Path) -> None:
    dash = _load(path)
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    panels = _panels(dash)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(i for i in ids if ids.count(i) > 1)}"
    titles = [p["title"] for p in panels]
    assert len(titles) == len(set(titles)), "duplicate panel titles"
    occupied: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, f"{p['title']}: gridPos {g}"
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & occupied, f"{p['title']} overlaps another panel"
        occupied |= cells
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(refs) == len(set(refs)), f"{p['title']}: targets/refIds"
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"] and t["expr"].strip()


def test_datasource_variable_matches_provisioning() -> None:
    prov = yaml.safe_load((GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uids = {d["uid"] for d in prov["datasources"] if d["type"] == "prometheus"}
    dprov = yaml.safe_load((GRAFANA_DIR / "provisioning" / "dashboards" / "failslow.yml").read_text())
    assert dprov["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"  # docker-compose.yml mount
    for path in DASHBOARDS:
        variables = {v["name"]: v for v in _load(path)["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["current"]["value"] in uids
        used = set(re.findall(r"\$(\w+)", path.read_text())) - {"__rate_interval", "__interval", "__range"}
        assert used <= set(variables), f"{path.name}: undefined variables {used - set(variables)}"


def test_required_panels_present() -> None:
    titles = {p["title"] for path in DASHBOARDS for p in _panels(_load(path))}
    for want in ("DP×PP straggler heatmap", "What-if worker slowdown S_w (DP×PP)",
                 "Iteration time per rank (detector onsets marked)", "Time in collectives per rank",
                 "SM clock / max clock", "Alerts sent to the remediator",
                 "Remediator actions by strategy and result", "Webhook deliveries by outcome (per minute)",
                 "Decision latency p50 / p90"):
        assert want in titles
    heat = next(p for path in DASHBOARDS for p in _panels(_load(path)) if p["title"] == "DP×PP straggler heatmap")
    t = heat["transformations"][0]
    assert t["id"] == "groupingToMatrix"
    assert (t["options"]["rowField"], t["options"]["columnField"]) == ("pp_rank", "dp_rank")
    annotations = {a["name"]: a for path in DASHBOARDS for a in _load(path)["annotations"]["list"]}
    assert "failslow_detector_onset_timestamp_seconds" in annotations["Fail-slow onsets"]["expr"]
    assert annotations["Fail-slow onsets"]["useValueForTime"] is True


def test_runbooks_reference_existing_panels() -> None:
    """Every bold name in a runbook's Diagnosis is the dashboard or one of its panel titles."""
    dashboards = {_load(p)["title"] for p in DASHBOARDS}
    titles = {p["title"] for path in DASHBOARDS for p in _panels(_load(path))}
    checked = 0
    runbooks = [p for p in sorted(RUNBOOKS_DIR.glob("*.md")) if p.stem != "README"]
    for rb in runbooks:
        diag = rb.read_text().split("## Diagnosis", 1)[-1].split("## Mitigation", 1)[0]
        for name in re.findall(r"\*\*(.+?)\*\*", diag, flags=re.S):
            name = " ".join(name.split())
            assert name in titles | dashboards, f"{rb.name}: panel {name!r} is not on any dashboard"
            checked += 1
    assert checked >= 2 * len(runbooks)  # the dashboard and at least one panel each


# --- metric names -------------------------------------------------------------------------------------


def _names(expr: str) -> set[str]:
    """Metric and recording-rule names an expression reads (identifiers not followed by '(' or in {...})."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # drop string literals
    expr = re.sub(r"\{[^}]*\}", "", expr)  # drop label matchers
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # drop range selectors
    toks = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?!\s*\()", expr))
    return {t for t in toks if t.startswith(("failslow_", "ALERTS", "up")) or ":" in t}


def _catalogued(name: str) -> bool:
    cat = by_name()
    if name in cat:
        return True
    for suffix in ("_sum", "_count", "_bucket"):
        base = name.removesuffix(suffix)
        if base != name and base in cat and cat[base].type in {"summary", "histogram"}:
            return True
    return False


def _all_exprs() -> list[tuple[str, str]]:
    exprs = [(f"rule {r.get('alert') or r.get('record')}", r["expr"]) for r in alert_rules() + recording_rules()]
    for r in alert_rules():
        for k, v in r.get("annotations", {}).items():
            exprs += [(f"{r['alert']} {k}", q) for q in re.findall(r'printf "(.*?)"\s', v) if "failslow_" in q]
    for path in DASHBOARDS:
        exprs += _queries(_load(path))
        exprs += [(f"variable {v['name']}", v["definition"]) for v in _load(path)["templating"]["list"]
                  if "definition" in v]
    return exprs + _runbook_queries()


def test_every_referenced_metric_is_in_the_catalogue() -> None:
    recorded = {r["record"] for r in recording_rules()}
    missing = []
    for where, expr in _all_exprs():
        for name in _names(expr.replace("label_values", "")):
            if ":" in name:
                if name not in recorded:
                    missing.append(f"{where}: recording rule {name} not defined")
            elif name not in BUILTIN_METRICS and not _catalogued(name):
                missing.append(f"{where}: {name} not in failslow/catalogue.py")
    assert not missing, "\n".join(missing)


def test_name_extraction_is_not_vacuous() -> None:
    assert _names('sum by (job) (rate(failslow_x_total{job=~"$job"}[5m])) / on (job) a:b:c') == {
        "failslow_x_total", "a:b:c"}
    assert not _catalogued("failslow_no_such_metric")
    assert _catalogued("failslow_comm_call_duration_seconds_sum") == (
        by_name()["failslow_comm_call_duration_seconds"].type in {"summary", "histogram"})


# --- queries against a real Prometheus ----------------------------------------------------------------

RANKS = [{"job": "llm", "rank": str(r), "dp_rank": str(r % 2), "pp_rank": str(r // 2), "tp_rank": "0",
          "node": f"n{r // 2}"} for r in range(4)]
GPUS = [{"node": f"n{n}", "gpu": str(g)} for n in range(2) for g in range(2)]
SPECIAL: dict[str, dict[str, list[str]]] = {
    "comm": {"comm": ["0", "1"]}, "op": {"op": ["AllReduce"]}, "nranks": {"nranks": ["2"]},
    "comm_rank": {"comm_rank": ["0"]}, "group": {"group": ["dp"]}, "kind": {"kind": ["compute", "link"]},
    "reason": {"reason": ["hw_thermal_slowdown", "sw_power_cap"]}, "collector": {"collector": ["ring", "nvml"]},
    "producer": {"producer": ["torch"]}, "uuid": {"uuid": ["GPU-0"]}, "name": {"name": ["H100"]},
    "strategy": {"strategy": ["rebalance", "restart"]}, "result": {"result": ["succeeded", "failed"]},
    "outcome": {"outcome": ["accepted", "unavailable"]},
}
# Upper bounds of the histograms served: sub-second to minutes covers action durations and decision
# latencies alike; what matters is that histogram_quantile has finite buckets to interpolate in.
HISTOGRAM_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def _label_sets(labels: tuple[str, ...]) -> list[dict[str, str]]:
    """Concrete label sets for a catalogue entry: its rank, GPU or grid part, times every other label."""
    if "rank" in labels:
        base = [{k: v for k, v in r.items() if k in labels} for r in RANKS]
    elif "gpu" in labels:
        base = [dict(g) for g in GPUS]
    elif "dp_rank" in labels:
        base = [{"job": "llm", "dp_rank": str(d), "pp_rank": str(p)} for d in range(2) for p in range(2)]
    else:
        base = [{"job": "llm"} if "job" in labels else {}]
    for lab in labels:
        if lab in base[0]:
            continue
        values = SPECIAL.get(lab, {}).get(lab, ["x"])
        base = [{**b, lab: v} for b in base for v in values]
    return base


class CatalogueCollector:
    """Serves every catalogue metric of the given sources with plausible, time-varying values."""

    def __init__(self, sources: set[str]) -> None:
        self.sources = sources
        self.t0 = time.time()

    def collect(self) -> Iterable[Metric]:
        now = time.time()
        el = now - self.t0
        for m in CATALOGUE:
            if m.source not in self.sources:
                continue
            sets = _label_sets(m.labels)
            names = list(sets[0])
            if m.type == "counter":
                fam: Metric = CounterMetricFamily(m.name.removesuffix("_total"), m.help, labels=names)
            elif m.type == "summary":
                fam = SummaryMetricFamily(m.name, m.help, labels=names)
            elif m.type == "histogram":
                fam = HistogramMetricFamily(m.name, m.help, labels=names)
            else:
                fam = GaugeMetricFamily(m.name, m.help, labels=names)
            for i, ls in enumerate(sets):
                vals = list(ls.values())
                if m.type == "counter":
                    fam.add_metric(vals, (1 + i) * 10 * el)
                elif m.type == "summary":
                    fam.add_metric(vals, count_value=int(100 * el) + 1, sum_value=(0.2 + 0.01 * i) * el)
                elif m.type == "histogram":
                    fam.add_metric(vals, buckets=self._buckets(i, el), sum_value=(2.0 + i) * (10 * el + 1))
                else:
                    fam.add_metric(vals, self._gauge(m.name, i, now))
            yield fam

    @staticmethod
    def _buckets(i: int, el: float) -> list[tuple[str, float]]:
        """Cumulative bucket counts growing with time: a fixed share le / (le + 1 + i) of all observations
        at or below each bound (median about 1 + i seconds), the rest above the last bound."""
        n = 10 * el + 1
        return [(floatToGoString(le), n * le / (le + 1 + i)) for le in HISTOGRAM_BUCKETS] + [("+Inf", n)]

    @staticmethod
    def _gauge(name: str, i: int, now: float) -> float:
        if name.endswith("_timestamp_seconds"):
            return now - 60 if "onset" in name else now - 0.5
        if name.endswith("_max_hertz"):
            return 1980e6
        if name.endswith("_hertz"):
            return 1500e6 + 50e6 * i
        return 1.0 + 0.1 * i  # ratios > 1, the fail-slow flag 1, active clock events 1, seconds, ...


@dataclass
class Endpoint:
    server: ThreadingHTTPServer
    addr: str


def _serve(sources: set[str]) -> Endpoint:
    reg = CollectorRegistry()
    reg.register(CatalogueCollector(sources))  # type: ignore[arg-type]
    server = ThreadingHTTPServer(("127.0.0.1", 0), MetricsHandler.factory(reg))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return Endpoint(server, f"127.0.0.1:{server.server_address[1]}")


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus with the shipped config and rules, scraping exporter-, detector- and remediator-like
    endpoints."""
    node, det, rem = _serve({"exporter", "whatif"}), _serve({"detector"}), _serve({"remediator"})
    port = free_port()
    cfg = render_prometheus(tmp_path_factory.mktemp("prom"), prometheus=f"127.0.0.1:{port}",
                            exporters=[node.addr], detector=[det.addr], remediator=[rem.addr],
                            scrape_interval="1s", evaluation_interval="1s")
    try:
        with prometheus(cfg, port) as svc:
            # Wait until the remediable alert (for: 10s) fires and rate() windows hold samples.
            deadline = time.monotonic() + 90  # for: 10s; much longer only on a heavily loaded machine
            while time.monotonic() < deadline:
                r = requests.get(f"{svc.url}/api/v1/query", params={"query": 'ALERTS{alertstate="firing"}'},
                                 timeout=5).json()
                if any(s["metric"].get("remediate") == "true" for s in r["data"]["result"]):
                    break
                time.sleep(0.5)
            yield svc.url
    finally:
        for ep in (node, det, rem):
            ep.server.shutdown()
            ep.server.server_close()


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    r = requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr}\n{body.get('error')}"
    return list(body["data"]["result"])


def test_every_dashboard_query_returns_data(prom: str) -> None:
    empty = []
    for path in DASHBOARDS:
        for where, expr in _queries(_load(path)):
            q = _substitute(expr)
            # An empty answer is retried for a few seconds (a scrape or rule evaluation running late on a
            # loaded machine); a query on a metric or label nobody exposes stays empty and fails.
            tries = 0
            while not _query(prom, q) and tries < 10:
                tries += 1
                time.sleep(1.0)
            if tries == 10:
                empty.append(f"{path.name} {where}: {q}")
            end = time.time()
            r = requests.get(f"{prom}/api/v1/query_range", timeout=10,
                             params={"query": q, "start": end - 10, "end": end, "step": 1}).json()
            assert r["status"] == "success", f"{where}: {r.get('error')}"
    assert not empty, "queries returned no data:\n" + "\n".join(empty)


def test_histogram_panels_give_finite_quantiles(prom: str) -> None:
    """histogram_quantile over the served _bucket series interpolates within the buckets (not NaN/+Inf)."""
    exprs = [(where, _substitute(e)) for path in DASHBOARDS for where, e in _queries(_load(path))
             if "histogram_quantile" in e]
    assert exprs, "no histogram panel"
    for where, q in exprs:
        rows = _query(prom, q)
        assert rows, f"{where}: {q} is empty"
        for s in rows:
            v = float(s["value"][1])
            assert 0 < v <= HISTOGRAM_BUCKETS[-1], f"{where}: {q} -> {v}"


def test_dashboard_variables_resolve(prom: str) -> None:
    for path in DASHBOARDS:
        for v in _load(path)["templating"]["list"]:
            if v["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["definition"])
            assert m, f"{v['name']}: unsupported variable query {v['definition']}"
            r = requests.get(f"{prom}/api/v1/label/{m[2]}/values",
                             params={"match[]": _substitute(m[1])}, timeout=10).json()
            assert r["status"] == "success" and r["data"], f"variable {v['name']} has no values"


def test_runbook_queries_parse_and_run(prom: str) -> None:
    queries = _runbook_queries()
    assert len(queries) >= 11
    for where, q in queries:
        assert isinstance(_query(prom, q), list), where  # _query raises on a parse error


def test_heatmap_query_gives_a_dp_by_pp_grid(prom: str) -> None:
    heat = next(p for path in DASHBOARDS for p in _panels(_load(path)) if p["title"] == "DP×PP straggler heatmap")
    rows = _query(prom, _substitute(heat["targets"][0]["expr"]))
    cells = {(s["metric"]["dp_rank"], s["metric"]["pp_rank"]) for s in rows}
    assert cells == {("0", "0"), ("1", "0"), ("0", "1"), ("1", "1")}
    assert all(float(s["value"][1]) > 0 for s in rows)


def test_shipped_config_scrapes_with_the_training_job_label(prom: str) -> None:
    """honor_labels keeps job="llm" from the exporter; `up` keeps the scrape job for ExporterDown."""
    assert _query(prom, 'failslow_iteration_duration_seconds{job="llm"}')
    assert not _query(prom, "failslow_iteration_duration_seconds{exported_job!=\"\"}")
    assert _query(prom, 'up{job="failslow-exporter"} == 1')
    assert _query(prom, 'up{job="failslow-detector"} == 1')
    # The remediator exposes no job label: its series keep the scrape job, one instance per replica.
    assert _query(prom, 'up{job="failslow-remediator"} == 1')
    assert _query(prom, 'failslow_remediator_redis_up{job="failslow-remediator"}')
    rules = requests.get(f"{prom}/api/v1/rules", timeout=10).json()["data"]["groups"]
    health = [r.get("health") for g in rules for r in g["rules"]]
    assert health and all(h == "ok" for h in health), [
        (r["name"], r.get("lastError")) for g in rules for r in g["rules"] if r.get("health") != "ok"]
    assert {r["name"] for g in rules for r in g["rules"] if r["type"] == "alerting"} == {
        r["alert"] for r in alert_rules()}
    assert (PROMETHEUS_DIR / "prometheus.yml").exists()

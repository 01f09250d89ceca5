"""Alerting latency: how long from a fault (or from the detector's verdict) to the remediator's webhook.

Two measurements with the shipped prometheus.yml, rules and alertmanager.yml, real Prometheus and
Alertmanager on loopback:

1. Alert chain alone: a stand-in detector endpoint (prometheus-client) flips `failslow_detector_failslow`
   to 1 for several jobs at staggered times; measured: flip -> FailSlowDetected at a real HTTP receiver.
   Compared with the budget the settings imply (scrape + evaluation + for + group_wait).
2. Whole path on the testbed (failslow_cli/stack/alert_path.py, the harness the loop test shares): a
   0.4 s pause every iteration on one rank of a DP2xPP2 job -> exporter -> Prometheus -> detector -> Alertmanager -> webhook.
"""

from __future__ import annotations

import statistics
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from tempfile import TemporaryDirectory

REPO = Path(__file__).resolve().parent.parent

TITLE = "Alerting: fault → remediator webhook latency"
JOBS = 4


def _chain(tmp: Path) -> tuple[list[float], dict[str, str]]:
    from prometheus_client import CollectorRegistry, Gauge, MetricsHandler

    from failslow_cli.stack.alert_path import shipped_settings
    from failslow_cli.stack.processes import (
        WebhookReceiver,
        alertmanager,
        free_port,
        prometheus,
        render_alertmanager,
        render_prometheus,
    )

    reg = CollectorRegistry()
    flag = Gauge("failslow_detector_failslow", "fail-slow", ["job"], registry=reg)
    ratio = Gauge("failslow_detector_slowdown_ratio", "ratio", ["job"], registry=reg)
    onset = Gauge("failslow_detector_onset_timestamp_seconds", "onset", ["job"], registry=reg)
    for j in range(JOBS):
        flag.labels(f"bench{j}").set(0)
        ratio.labels(f"bench{j}").set(1.0)
        onset.labels(f"bench{j}").set(0)
    server = ThreadingHTTPServer(("127.0.0.1", 0), MetricsHandler.factory(reg))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    receiver = WebhookReceiver()
    pp, ap = free_port(), free_port()
    try:
        am_cfg = render_alertmanager(tmp / "am", remediator_url=receiver.url, token="bench")
        prom_cfg = render_prometheus(tmp / "prom", prometheus=f"127.0.0.1:{pp}", alertmanager=f"127.0.0.1:{ap}",
                                     detector=[f"127.0.0.1:{server.server_address[1]}"])
        with alertmanager(am_cfg, ap), prometheus(prom_cfg, pp):
            time.sleep(12)  # a couple of healthy scrapes first
            flips: dict[str, float] = {}
            for j in range(JOBS):  # staggered so the flips land at different phases of scrape/eval
                job = f"bench{j}"
                ratio.labels(job).set(1.5)
                onset.labels(job).set(time.time())
                flag.labels(job).set(1)
                flips[job] = time.time()
                time.sleep(1.7)
            deadline = time.monotonic() + 120
            got: dict[str, float] = {}
            while time.monotonic() < deadline and len(got) < JOBS:
                for job in flips:
                    hits = receiver.alerts("FailSlowDetected", "firing", job)
                    if hits and job not in got:
                        got[job] = min(t for t, _a in hits) - flips[job]
                time.sleep(0.2)
    finally:
        receiver.close()
        server.shutdown()
        server.server_close()
    return sorted(got.values()), shipped_settings()


def run() -> str:
    """Measure both; return the Markdown section."""
    from failslow_cli.stack.alert_path import run_alert_path

    with TemporaryDirectory(prefix="bench-alerting-") as d:
        lat, s = _chain(Path(d))
    budget_max = sum(float(s[k].rstrip("s")) for k in ("scrape_interval", "evaluation_interval", "for",
                                                       "group_wait"))
    budget_min = float(s["for"].rstrip("s")) + float(s["group_wait"].rstrip("s"))
    lines = [
        "Command: `.venv/bin/python -m bench alerting` (real Prometheus 2.42 and Alertmanager 0.25 from Debian, "
        "shipped configs).",
        "",
        f"Settings: scrape {s['scrape_interval']}, rule evaluation {s['evaluation_interval']}, FailSlowDetected "
        f"`for: {s['for']}`, remediator route group_wait {s['group_wait']}.",
        "",
        "| Measurement | n | min | median | max | peer: budget from the settings |",
        "|---|---|---|---|---|---|",
    ]
    if lat:
        lines.append(f"| detector verdict → FailSlowDetected at webhook (alert chain alone) | {len(lat)} | "
                     f"{lat[0]:.1f} s | {statistics.median(lat):.1f} s | {lat[-1]:.1f} s | "
                     f"{budget_min:.0f}–{budget_max:.0f} s (for + group_wait … + scrape + eval); median / max budget "
                     f"= {statistics.median(lat) / budget_max:.2f} |")
    else:
        lines.append("| detector verdict → FailSlowDetected at webhook | 0 | – | – | – | no alert arrived |")
    with TemporaryDirectory(prefix="bench-alertpath-") as d:
        try:
            res = run_alert_path(Path(d))
        except Exception as exc:  # report what failed rather than nothing
            res = None
            err = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    if res is not None and res.detect_latency_s is not None:
        tail = (f" → resolved {res.resolve_latency_s:.1f} s after the fault ended"
                if res.resolve_latency_s is not None else "; no resolved notification within the wait")
        lines.append(f"| testbed DP2×PP2, `{res.fault_spec}` → FailSlowDetected at webhook (whole path) | 1 | "
                     f"– | {res.detect_latency_s:.1f} s | – | detector poll {res.settings['poll_s']:g} s{tail} |")
    elif res is not None:
        lines.append(f"| testbed whole path (`{res.fault_spec}`) | 0 | – | – | – | FailSlowDetected did not reach "
                     "the webhook in this run |")
    else:
        lines.append(f"| testbed whole path | 0 | – | – | – | could not run: {err} |")
    return "\n".join(lines)

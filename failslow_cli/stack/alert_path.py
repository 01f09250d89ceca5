"""Run the whole alert path once: testbed job -> exporter -> Prometheus -> detector -> Alertmanager -> webhook.

Used by bench/bench_alerting.py (the latency figure); the behaviour is tested in tests/integration/test_remediator_loop.py.
Every component is the real thing started on free loopback ports and stopped by PID; any that cannot
start raises.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml

from failslow_cli.stack.processes import (
    ALERTMANAGER_DIR,
    PROMETHEUS_DIR,
    Webhook,
    WebhookReceiver,
    alertmanager,
    failslow_cli,
    free_port,
    prometheus,
    redis_server,
    render_alertmanager,
    render_prometheus,
    start_process,
    stop_process,
    wait_http,
)


@dataclass
class AlertPathResult:
    """What one run observed: fault times (wall clock), webhook deliveries, logs for diagnosis."""

    job: str
    fault_spec: str
    fault_rank: int
    token: str
    fault_start: float | None = None
    fault_end: float | None = None
    job_stopped: float | None = None
    receiver_posts: list[Webhook] = field(default_factory=list)
    testbed_log: str = ""
    logs: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    prometheus_state: str = ""
    timeline: list[str] = field(default_factory=list)

    def _alerts(self, status: str) -> list[tuple[float, dict[str, Any]]]:
        return sorted(((h.t, a) for h in self.receiver_posts for a in h.body.get("alerts", [])
                       if a["labels"].get("alertname") == "FailSlowDetected" and a["status"] == status
                       and a["labels"].get("job") == self.job), key=lambda x: x[0])

    @property
    def firing(self) -> list[tuple[float, dict[str, Any]]]:
        """FailSlowDetected firing deliveries for the job, in arrival order."""
        return self._alerts("firing")

    @property
    def resolved(self) -> list[tuple[float, dict[str, Any]]]:
        """Notifications that the job's whole FailSlowDetected group resolved (every suspect's alert), which
        arrived after the fault ended and while the job still ran, as (arrival, first alert of the group).

        One suspect's alert resolving while others still fire is not a resolution; and stopping the job
        removes its series, which resolves the alert too, so later notifications do not count.
        """
        end, stop = self.fault_end or float("inf"), self.job_stopped or float("inf")
        return [(h.t, h.body["alerts"][0]) for h in self.receiver_posts
                if h.body.get("status") == "resolved" and h.body.get("alerts")
                and h.body.get("groupLabels", {}).get("alertname") == "FailSlowDetected"
                and h.body.get("groupLabels", {}).get("job") == self.job and end <= h.t < stop]

    @property
    def detect_latency_s(self) -> float | None:
        """Fault start -> first FailSlowDetected at the webhook, seconds."""
        if self.fault_start is None or not self.firing:
            return None
        return self.firing[0][0] - self.fault_start

    @property
    def resolve_latency_s(self) -> float | None:
        """Fault end -> resolved FailSlowDetected at the webhook, seconds."""
        if self.fault_end is None or not self.resolved:
            return None
        return self.resolved[0][0] - self.fault_end

    def summary(self) -> str:
        """One paragraph with the settings and the measured latencies."""
        def fmt(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.1f} s"

        s = self.settings
        return (f"alert path: fault {self.fault_spec}; detector poll {s.get('poll_s')} s; scrape/eval {s.get('scrape_interval')}/"
                f"{s.get('evaluation_interval')}, FailSlowDetected for: {s.get('for')}, remediator group_wait "
                f"{s.get('group_wait')}; fault start -> FailSlowDetected at webhook {fmt(self.detect_latency_s)}; "
                f"fault end -> resolved at webhook {fmt(self.resolve_latency_s)}")

    def diagnostics(self) -> str:
        """Logs and state to understand a failure."""
        parts = [self.summary(), f"webhook posts: {[(h.t, h.body.get('status'), [a['labels'] for a in h.body.get('alerts', [])]) for h in self.receiver_posts]}",
                 f"prometheus: {self.prometheus_state}", "timeline:\n" + "\n".join(self.timeline),
                 f"testbed log:\n{self.testbed_log[-3000:]}"]
        parts += [f"{k} log:\n{v[-3000:]}" for k, v in self.logs.items()]
        return "\n\n".join(parts)


def shipped_settings() -> dict[str, Any]:
    prom = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())["global"]
    rules = yaml.safe_load((PROMETHEUS_DIR / "rules" / "alerts.yml").read_text())
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "FailSlowDetected")
    am = yaml.safe_load((ALERTMANAGER_DIR / "alertmanager.yml").read_text())["route"]
    route = next(r for r in am["routes"] if r["receiver"] == "remediator")
    return {"scrape_interval": prom["scrape_interval"], "evaluation_interval": prom["evaluation_interval"],
            "for": rule["for"], "group_wait": route.get("group_wait", am["group_wait"]),
            "group_interval": route.get("group_interval", am["group_interval"])}


# A stop-the-world pause of 0.4 s in every iteration of one rank (GC-like, in the trainer). Chosen over a
# CPU quota because its effect does not depend on how busy the shared 2-core machine is: with a dozen
# other processes competing, a 0.3-core quota on one rank barely changes the iteration time.
DEFAULT_FAULT = "gc:rank=3,every=1,pause=0.4"


def run_alert_path(tmp: Path, *, dp: int = 2, pp: int = 2, fault: str = DEFAULT_FAULT, fault_rank: int = 3,
                   warmup_s: float = 40.0, fault_s: float = 40.0, max_after_s: float = 100.0,
                   iterations: int = 2000, poll_s: float = 5.0, wait_resolved: bool = True,
                   max_detect_s: float = 120.0, say: Callable[[str], None] | None = None,
                   on_testbed_line: Callable[[str], None] | None = None) -> AlertPathResult:
    """Start everything, inject `fault` (on `fault_rank`) after `warmup_s` of training for `fault_s`.

    With `wait_resolved`, returns once the job's FailSlowDetected group resolved, or `max_after_s` after the
    fault ended, or the job ended; without, once FailSlowDetected for the job arrived (plus a few seconds for
    further suspects) or `max_detect_s` after the fault started. The job is given more iterations than it
    can run and is stopped (SIGTERM) at the end. `say`, when given, is told where the UIs listen, when the
    fault switches, and every notification as Alertmanager delivers it (the demo mode of `main`).
    `on_testbed_line`, when given, makes the job print one line per rank and iteration (`--progress`) and
    receives every line the job prints (`failslow demo` draws its per-rank table from them).
    """
    job = f"alertpath{os.getpid()}"
    token = secrets.token_hex(16)
    spec = f"{fault},at={warmup_s:g},for={fault_s:g}"
    res = AlertPathResult(job=job, fault_spec=spec, fault_rank=fault_rank, token=token,
                          settings={**shipped_settings(), "poll_s": poll_s})
    rings = tmp / "rings"
    rings.mkdir(parents=True)
    receiver = WebhookReceiver()
    resolved_evt = threading.Event()
    t_start = time.time()

    def on_post(h: Webhook) -> None:
        if say is not None:
            for a in h.body.get("alerts", []):
                extra = {k: v for k, v in a["labels"].items() if k in ("kind", "rank", "node", "dp_rank", "pp_rank")}
                say(f"[{h.t - t_start:6.1f}s] webhook: {a['labels'].get('alertname')} {a['status'].upper()} "
                    f"job={a['labels'].get('job')} {extra}\n           {a['annotations'].get('description', '')}")
        if (h.body.get("status") == "resolved" and h.body.get("groupLabels", {}).get("alertname") == "FailSlowDetected"
                and h.body.get("groupLabels", {}).get("job") == job):
            resolved_evt.set()

    receiver.on_post = on_post
    ports = {k: free_port() for k in ("redis", "prom", "am", "exporter", "detector")}
    with ExitStack() as stack:
        stack.callback(receiver.close)
        redis = stack.enter_context(redis_server(tmp / "redis", ports["redis"]))
        am_cfg = render_alertmanager(tmp / "am", remediator_url=receiver.url, token=token)
        stack.enter_context(alertmanager(am_cfg, ports["am"]))
        prom_cfg = render_prometheus(tmp / "prom", prometheus=f"127.0.0.1:{ports['prom']}",
                                     alertmanager=f"127.0.0.1:{ports['am']}",
                                     exporters=[f"127.0.0.1:{ports['exporter']}"],
                                     detector=[f"127.0.0.1:{ports['detector']}"])
        prom = stack.enter_context(prometheus(prom_cfg, ports["prom"]))
        if say is not None:
            say(f"Prometheus UI:   {prom.url}  (alerts: {prom.url}/alerts)\n"
                f"Alertmanager UI: http://127.0.0.1:{ports['am']}\n"
                f"webhook (stand-in remediator): {receiver.url}\n"
                f"job {job}: DP{dp}xPP{pp}, fault {spec}")
        cli = failslow_cli()

        exp_log = tmp / "exporter.log"
        exporter = start_process([*cli, "exporter", "--port", str(ports["exporter"]), "--address", "127.0.0.1",
                           "--ring-dir", str(rings), "--node", "testbed", "--collectors", "ring"], exp_log)
        stack.callback(stop_process, exporter)
        stack.callback(lambda: res.logs.__setitem__("exporter", exp_log.read_text()))
        wait_http(f"http://127.0.0.1:{ports['exporter']}/metrics", exporter, exp_log)

        det_log = tmp / "detector.log"
        detector = start_process([*cli, "detector"], det_log, env={
            "FAILSLOW_DETECTOR_PORT": str(ports["detector"]), "FAILSLOW_DETECTOR_ADDRESS": "127.0.0.1",
            "FAILSLOW_DETECTOR_PROMETHEUS_URL": prom.url, "FAILSLOW_DETECTOR_REDIS_URL": redis.url,
            # one poll per Prometheus scrape (the detector's own default, 15s, is for large fleets)
            "FAILSLOW_DETECTOR_POLL_INTERVAL_S": str(poll_s)})
        stack.callback(stop_process, detector)
        stack.callback(lambda: res.logs.__setitem__("detector", det_log.read_text()))
        wait_http(f"http://127.0.0.1:{ports['detector']}/metrics", detector, det_log)

        tb = subprocess.Popen([*cli, "testbed", "run", "--dp", str(dp), "--pp", str(pp), "--iterations",
                               str(iterations), "--torch-hook", "--ring-dir", str(rings), "--job", job,
                               "--inject", spec, "--report", str(tmp / "report.json"),
                               *(["--progress"] if on_testbed_line is not None else [])],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        stack.callback(stop_process, tb)
        lines: list[str] = []

        def follow() -> None:
            assert tb.stdout is not None
            for line in tb.stdout:
                lines.append(line)
                if on_testbed_line is not None:
                    on_testbed_line(line)
                if say is not None and ("fault on" in line or "fault off" in line):
                    say(f"[{time.time() - t_start:6.1f}s] {line.strip()}")
                if "fault on:" in line and res.fault_start is None:
                    res.fault_start = time.time()
                elif "fault off:" in line and res.fault_end is None:
                    res.fault_end = time.time()

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        stop_sampling = threading.Event()
        stack.callback(stop_sampling.set)
        t0 = time.time()
        probes = {
            "iter": f'max(failslow_iteration_duration_seconds{{job="{job}"}})',
            "ranks": f'count(failslow_iteration_duration_seconds{{job="{job}"}})',
            "cratio": f'max(job_rank:failslow_iteration_compute_seconds:ratio_stage_quantile25{{job="{job}"}})',
            "det": f'max(failslow_detector_failslow{{job="{job}"}})',
            "ratio": f'max(failslow_detector_slowdown_ratio{{job="{job}"}})',
            "susp": f'failslow_detector_suspect{{job="{job}"}}',
            "alerts": f'ALERTS{{job="{job}"}}',
        }

        def sample() -> None:
            while not stop_sampling.wait(5.0):
                row = [f"t={time.time() - t0:5.0f}s"]
                for k, q in probes.items():
                    try:
                        r = requests.get(f"{prom.url}/api/v1/query", params={"query": q}, timeout=3).json()
                        vals = [(f'{x["metric"].get("alertname", "")}/{x["metric"].get("alertstate", "")}'
                                 f'/{x["metric"].get("kind", "")}/r{x["metric"].get("rank", "")}'
                                 if "alertname" in x["metric"] or "kind" in x["metric"] else "", x["value"][1])
                                for x in r["data"]["result"]]
                        row.append(f"{k}={vals if len(vals) != 1 or vals[0][0] else vals[0][1][:6]}")
                    except (requests.RequestException, ValueError, KeyError):
                        row.append(f"{k}=?")
                if res.fault_start and not res.fault_end:
                    row.append("FAULT")
                res.timeline.append(" ".join(row))

        threading.Thread(target=sample, daemon=True).start()
        deadline = time.monotonic() + warmup_s + fault_s + max_after_s + 120  # + start-up of the ranks
        while time.monotonic() < deadline and tb.poll() is None:
            if not wait_resolved and res.fault_start is not None:
                res.receiver_posts = list(receiver.posts)
                if res.firing:
                    time.sleep(5.0)  # suspects named a moment later arrive in the same group
                    break
                if time.time() - res.fault_start > max_detect_s:
                    break
            elif res.fault_end is not None:
                res.receiver_posts = list(receiver.posts)
                if res.resolved or time.time() - res.fault_end > max_after_s:
                    break
            resolved_evt.wait(1.0)
            resolved_evt.clear()
        try:
            res.prometheus_state = str(requests.get(f"{prom.url}/api/v1/alerts", timeout=5).json()["data"])
        except (requests.RequestException, ValueError, KeyError) as e:
            res.prometheus_state = f"unavailable: {e}"
        res.job_stopped = time.time()
        stop_process(tb)
        reader.join(timeout=10)
        res.testbed_log = "".join(lines)
    res.receiver_posts = list(receiver.posts)
    return res


def main() -> int:
    """Demo: run the whole path once on a temporary directory, printing alerts as they are delivered."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="failslow-alertpath-") as d:
        res = run_alert_path(Path(d), say=lambda m: print(m, flush=True))
    print(res.summary())
    return 0 if res.firing else 1


if __name__ == "__main__":
    raise SystemExit(main())

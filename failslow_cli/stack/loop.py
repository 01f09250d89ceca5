"""The closed loop, for real: a fault slows a testbed job, the detector confirms it, Alertmanager calls the real
remediator, which decides and acts through the testbed adapter, and the job's pace comes back.

Used by `failslow demo`, tests/integration/test_remediator_loop.py and bench/bench_remediator.py. Every
component is the real thing from the shipped configs on free loopback ports (Redis with an append-only
file, Prometheus, Alertmanager, the exporter, the detector, the remediator, a `failslow testbed run` job with
`--run-dir` so the adapter can reach it) and is stopped by PID; any that cannot start raises.

While it runs, a :class:`LoopState` (what every rank's last iterations took, the remediator's events,
actions and last decision, the phase of the loop) is kept up to date for the caller's live view.
"""

from __future__ import annotations

import os
import re
import secrets
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from failslow_cli.stack.processes import (
    Remediator,
    alertmanager,
    failslow_cli,
    free_port,
    prometheus,
    redis_server,
    render_alertmanager,
    render_prometheus,
    start_process,
    start_remediator,
    stop_process,
    wait_http,
)

PROGRESS = re.compile(r"^rank\s+(\d+)\s+it\s+(\d+)\s+([\d.]+) ms")

# A CPU quota of 0.12 on rank 1 while every rank runs as a device of speed 0.4 (the testbed's dedicated-
# device emulation): rank 1 computes 3.3x slower, its DP replica paces the job, and moving micro-batches to
# the other replica pays off (a GC-like pause per iteration would not: it does not shrink with the split).
DEFAULT_FAULT = "cpu:rank=1,quota=0.12"
# CFS period of the ranks' cgroups, which CPU faults set their quota in. At the kernel's 100 ms a throttled
# rank that idles while its peers catch up runs its next burst at full speed until the period's quota is
# spent, so its time per micro-batch depends on how busy a split keeps it (fewer micro-batches read faster
# each); at 10 ms the quota binds within one micro-batch's compute and the rank is a device uniformly slower,
# as a throttled GPU is.
CPU_PERIOD_US = 10_000
# The remediator waits after each action until the exporters' readings show it (their iteration counters moved
# past their 20-iteration window); the cooldown is only the floor in seconds, three scrapes.
DEFAULT_POLICY = {"cooldown_s": 15.0, "horizon_min_s": 60.0}


@dataclass
class Iteration:
    """One iteration once every rank reported it: arrival time of the last report and each rank's time."""

    t: float
    it: int
    dt: dict[int, float]

    @property
    def period(self) -> float:
        """The job's iteration time: the mean of its ranks' times. Each rank's time runs from its previous
        iteration's end to this one's, so in a synchronous job every rank takes the same time on average and
        one iteration's times differ only by how much later or earlier each rank ended it than the last: the
        slowest of them reads high by that jitter (1-9% on the testbed, most with uneven splits and deeper
        pipelines), their mean is the period of the ranks' mean end time."""
        return sum(self.dt.values()) / len(self.dt)


@dataclass
class LoopState:
    """What the loop has seen so far (updated by its threads; read by live views and stop conditions)."""

    job: str
    world: int
    t0: float = field(default_factory=time.time)
    fault_start: float | None = None
    fault_end: float | None = None
    iterations: list[Iteration] = field(default_factory=list)
    last_dt: dict[int, float] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    remediator_up: bool = False
    notes: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    faults_on: list[tuple[float, str]] = field(default_factory=list)  # (time, spec) of each fault switched on
    _pending: dict[int, dict[int, float]] = field(default_factory=dict)

    def on_line(self, line: str) -> None:
        """Feed one line the testbed job printed."""
        m = PROGRESS.match(line.strip())
        now = time.time()
        if m is None:
            if "fault on:" in line:
                self.faults_on.append((now, line.split("fault on:", 1)[1].split("(")[0].strip()))
                if self.fault_start is None:
                    self.fault_start = now
            elif "fault off:" in line and self.fault_end is None:
                self.fault_end = now
            return
        rank, it, ms = int(m.group(1)), int(m.group(2)), float(m.group(3))
        with self.lock:
            self.last_dt[rank] = ms / 1000.0
            row = self._pending.setdefault(it, {})
            row[rank] = ms / 1000.0
            if len(row) == self.world:
                self.iterations.append(Iteration(now, it, self._pending.pop(it)))

    def pace(self, t0: float, t1: float) -> float | None:
        """Median iteration time of the iterations completed between `t0` and `t1` (wall clock)."""
        with self.lock:
            xs = [i.period for i in self.iterations if t0 <= i.t < t1]
        return statistics.median(xs) if len(xs) >= 3 else None

    @property
    def event(self) -> dict[str, Any] | None:
        """The remediator's first event of the job after the fault started (else its newest)."""
        evs = sorted((e for e in self.events if e.get("job") == self.job), key=lambda e: e.get("opened_at") or 0)
        after = [e for e in evs if self.fault_start is not None and (e.get("opened_at") or 0) >= self.fault_start]
        return after[0] if after else (evs[-1] if evs else None)

    def acted(self, strategy: str | None = None, state: str = "succeeded") -> list[dict[str, Any]]:
        """The job's actions in `state` (of `strategy`), oldest first."""
        return sorted((a for a in self.actions if a.get("job") == self.job and a.get("state") == state
                       and (strategy is None or a.get("strategy") == strategy)),
                      key=lambda a: a.get("created_at") or 0)

    def phase(self) -> str:
        """Where the loop is, in a few words."""
        ev = self.event
        running = [a for a in self.actions if a.get("state") in ("running", "pending_approval")]
        if running:
            a = running[-1]
            return f"acting: {a['strategy']} {a['state']}"
        if ev is not None and ev.get("state") == "open":
            last = ev.get("last_decision") or {}
            return f"event open ({'firing' if ev.get('firing') else 'resolved, confirming'}): plan {last.get('strategy', '-')}"
        if ev is not None:
            return "event closed: recovered" if "confirmed back" in str(ev.get("close_reason")) else "event closed"
        if self.fault_start and not self.fault_end:
            return "fault on: waiting for the alert"
        return "healthy" if self.iterations else "starting"


@dataclass
class LoopResult:
    """What one run of the loop saw, with the remediator's own record of it."""

    state: LoopState
    fault_spec: str
    token: str
    remediator_url: str
    audit: list[dict[str, Any]] = field(default_factory=list)
    microbatches_final: list[int] | None = None
    logs: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def times(self) -> dict[str, float | None]:
        """Fault → alert (event opened) → first action started → first action done, as seconds since the fault."""
        s = self.state
        ev = s.event
        acts = sorted((a for a in s.actions if a.get("job") == s.job and not a.get("dry_run")),
                      key=lambda a: a.get("created_at") or 0)
        f0 = s.fault_start
        if f0 is None:
            return {}

        def rel(x: Any) -> float | None:
            return None if x is None else float(x) - f0

        return {"alert": rel(ev.get("opened_at")) if ev else None,
                "action_started": rel(acts[0].get("started_at")) if acts else None,
                "action_done": rel(acts[0].get("ended_at")) if acts else None,
                "fault_end": rel(s.fault_end),
                "event_closed": rel(ev.get("closed_at")) if ev else None}

    def summary(self) -> str:
        """One paragraph: the times and the paces."""
        s = self.state
        t = self.times()

        def f(x: float | None, unit: str = " s") -> str:
            return "n/a" if x is None else f"{x:.1f}{unit}"

        healthy = s.pace(s.t0, s.fault_start) if s.fault_start else None
        acts = s.acted()
        slow = s.pace(s.fault_start + 20, float(acts[0]["started_at"])) if acts and s.fault_start else None
        mitig = s.pace(float(acts[0]["ended_at"]) + 20, s.fault_end or time.time()) if acts and acts[0].get("ended_at") else None
        return (f"loop: fault {self.fault_spec}; fault -> alert {f(t.get('alert'))}, -> action started "
                f"{f(t.get('action_started'))}, -> done {f(t.get('action_done'))}; fault ended {f(t.get('fault_end'))}, "
                f"event closed {f(t.get('event_closed'))} after the fault started; iteration healthy {f(healthy)}, "
                f"with the fault {f(slow)}, mitigated {f(mitig)}")


def _poll_remediator(rem: Remediator, state: LoopState, stop: threading.Event, every_s: float = 1.0) -> None:
    while not stop.wait(every_s):
        try:
            evs, acts = rem.get("/events"), rem.get("/actions")
        except (requests.RequestException, ValueError):
            state.remediator_up = False
            continue
        with state.lock:
            state.events, state.actions, state.remediator_up = evs, acts, True


def run_loop(tmp: Path, *, dp: int = 2, pp: int = 2, fault: str | Sequence[str] = DEFAULT_FAULT,
             warmup_s: float = 40.0,
             fault_s: float = 150.0, max_s: float = 600.0, mode: str = "auto", micro_batches: int = 4,
             micro_batch_size: int | None = None,
             device_speed: float | None = 0.4, cpu_period_us: int = CPU_PERIOD_US, poll_s: float = 5.0,
             policy: dict[str, Any] | None = None,
             costs: dict[str, Any] | None = None, iterations: int = 100_000, spare_nodes: int = 0,
             stop_when: Callable[[LoopState], bool] | None = None,
             on_tick: Callable[[LoopState], None] | None = None,
             say: Callable[[str], None] | None = None) -> LoopResult:
    """Start everything, inject `fault` (one spec or several) after `warmup_s` of training for `fault_s` (a spec
    with its own ``at=`` or ``start_iter=`` keeps its schedule), with `spare_nodes` idle nodes, run until
    `stop_when(state)`
    (checked every second; default: the remediator closed the job's event after the fault ended and put the
    job's own split back, or 60 s passed since the close) or `max_s`.

    `on_tick(state)` is called every second (the demo's live view). `micro_batches` per DP replica of
    `micro_batch_size` sequences each (None: the testbed's default size). CPU faults throttle in CFS periods
    of `cpu_period_us` (see `CPU_PERIOD_US`).
    """
    job = f"loop{os.getpid()}"
    token = secrets.token_hex(16)
    specs = [f if re.search(r"[:,](at|start_iter)=", f) else f"{f},at={warmup_s:g},for={fault_s:g}"
             for f in ([fault] if isinstance(fault, str) else fault)]
    spec = " + ".join(specs)
    state = LoopState(job=job, world=dp * pp)
    ports = {k: free_port() for k in ("redis", "prom", "am", "exporter", "detector", "remediator")}
    rings, run_dir = tmp / "rings", tmp / "run"
    rings.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    pol = {**DEFAULT_POLICY, **(policy or {})}
    config = {"jobs": [{"match": re.escape(job), "adapter": "testbed", "options": {"run_dir": str(run_dir)}}],
              "policy": pol, **({"costs": costs} if costs else {})}
    res = LoopResult(state=state, fault_spec=spec, token=token, remediator_url=f"http://127.0.0.1:{ports['remediator']}",
                     settings={"mode": mode, "policy": pol, "device_speed": device_speed,
                               "micro_batches": micro_batches, "micro_batch_size": micro_batch_size})
    cli = failslow_cli()
    stop = threading.Event()
    with ExitStack() as stack:
        redis = stack.enter_context(redis_server(tmp / "redis", ports["redis"], persist=True))
        prom_cfg = render_prometheus(tmp / "prom", prometheus=f"127.0.0.1:{ports['prom']}",
                                     alertmanager=f"127.0.0.1:{ports['am']}",
                                     exporters=[f"127.0.0.1:{ports['exporter']}"],
                                     detector=[f"127.0.0.1:{ports['detector']}"],
                                     remediator=[f"127.0.0.1:{ports['remediator']}"])
        prom = stack.enter_context(prometheus(prom_cfg, ports["prom"]))
        rem = start_remediator(tmp / "remediator", ports["remediator"], redis_url=redis.url, prometheus_url=prom.url,
                               token=token, config=config, mode=mode)
        stack.callback(lambda: res.logs.__setitem__("remediator", rem.log.read_text()))
        stack.callback(stop_process, rem.proc)
        am_cfg = render_alertmanager(tmp / "am", remediator_url=f"{rem.url}/api/v1/alerts", token=token)
        stack.enter_context(alertmanager(am_cfg, ports["am"]))
        if say is not None:
            say(f"Prometheus {prom.url} · Alertmanager http://127.0.0.1:{ports['am']} · "
                f"remediator status page {rem.url}/ (token in {rem.workdir / 'remediator.token'})")
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
            "FAILSLOW_DETECTOR_POLL_INTERVAL_S": str(poll_s)})
        stack.callback(stop_process, detector)
        stack.callback(lambda: res.logs.__setitem__("detector", det_log.read_text()))
        wait_http(f"http://127.0.0.1:{ports['detector']}/metrics", detector, det_log)

        argv = [*cli, "testbed", "run", "--dp", str(dp), "--pp", str(pp), "--iterations", str(iterations),
                "--micro-batches", str(micro_batches), "--torch-hook", "--ring-dir", str(rings), "--job", job,
                "--run-dir", str(run_dir), *(x for sp in specs for x in ("--inject", sp)),
                "--report", str(tmp / "report.json"), "--progress", "--cpu-period-us", str(cpu_period_us)]
        if device_speed is not None:
            argv += ["--device-speed", f"{device_speed:g}"]
        if micro_batch_size is not None:
            argv += ["--micro-batch-size", str(micro_batch_size)]
        if spare_nodes:
            argv += ["--spare-nodes", str(spare_nodes)]
        tb = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        stack.callback(stop_process, tb)
        lines: list[str] = []

        def follow() -> None:
            assert tb.stdout is not None
            for line in tb.stdout:
                lines.append(line)
                state.on_line(line)
                if say is not None and ("fault on" in line or "fault off" in line or "restarted" in line):
                    say(f"[{time.time() - state.t0:6.1f}s] {line.strip()}")

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        poller = threading.Thread(target=_poll_remediator, args=(rem, state, stop), daemon=True)
        poller.start()
        stack.callback(stop.set)

        default = [micro_batches] * dp

        def done(s: LoopState) -> bool:
            """The event closed after the fault ended, and the job's own split is back: the remediator restores
            it before the event closes or, when the pace came back first, just after (up to 60 s waited)."""
            ev = s.event
            if s.fault_end is None or ev is None or ev.get("state") != "closed":
                return False
            with s.lock:
                splits = sorted((a for a in s.actions if a.get("job") == s.job and a.get("strategy") == "rebalance"
                                 and a.get("state") == "succeeded" and not a.get("dry_run")),
                                key=lambda a: float(a.get("ended_at") or 0.0))
            back = not splits or list((splits[-1].get("params") or {}).get("counts") or []) == default
            return back or time.time() > float(ev.get("closed_at") or 0.0) + 60.0

        cond = stop_when or done
        deadline = time.monotonic() + max_s
        while time.monotonic() < deadline and tb.poll() is None:
            if on_tick is not None:
                on_tick(state)
            if cond(state):
                break
            time.sleep(1.0)
        try:
            from failslow.control import RunDirClient

            res.microbatches_final = list(RunDirClient(run_dir, 10).request("status")["microbatches"])
        except Exception as exc:  # the job may be gone; the caller sees None
            state.notes.append(f"final status: {exc}")
        try:
            res.audit = rem.get("/audit", limit=2000)
            with state.lock:
                state.events, state.actions = rem.get("/events"), rem.get("/actions")
        except (requests.RequestException, ValueError) as exc:
            state.notes.append(f"final remediator read: {exc}")
        stop.set()
        stop_process(tb)
        reader.join(timeout=10)
        res.logs["testbed"] = "".join(lines)
    return res

"""The compound case on the testbed, with the remediator deciding: FALCON's Fig. 17.

One real closed loop (failslow_cli/stack/loop.py, as in the ``mitigate`` section) on DP2xPP2, one rank per
node, devices of 0.4 CPU, one spare node. After 40 s of healthy training a ``tc`` path fault throttles the
path between node 0 and node 1 (stage 0's gradient ring) to 20 Mbit/s; the remediator validates the link
suspects and answers with S3. At 300 s a CPU fault slows rank 1's device (quota 0.2 on a device of 0.4): the
remediator first answers with S2 and, as the loss keeps accruing, escalates to S4 (validated, then a restart
with the slow node's ranks on the spare). Restarts need no approval here. The costs are the defaults until
measured: the S3 move's measured cost (a checkpoint-restart) stands for the restart's (docs/remediator.md).

Phases: the link phase from the path fault to the CPU fault, the compute phase from the CPU fault to the end.
Each phase's fail-slow pace is the median over 20 s after its fault to its first action, its mitigated pace the
median over the last 40 s of the phase. Overall reduction = 1 - (sum of the phases' mitigated excess over
healthy) / (sum of their fail-slow excess).
"""

from __future__ import annotations

import time
from typing import Any

from bench.bench_mitigate import AFTER_S, fmt, row

TITLE = "Mitigation on the testbed: a congested link, then a slow device, up to S4 (FALCON Fig. 17)"
RATE = "20mbit"
CPU_AT_S = 300.0  # the CPU fault, seconds after training started


def _restart_after_cpu_fault(s: Any) -> bool:
    """50 s after a restart that started once the CPU fault was on."""
    on = [t for t, spec in s.faults_on if spec.startswith("cpu:")]
    if not on:
        return False
    done = [float(a["ended_at"]) for a in s.actions if a.get("job") == s.job and a.get("strategy") == "restart"
            and not a.get("dry_run") and a.get("ended_at") and float(a.get("started_at") or 0.0) > on[0]]
    return bool(done) and time.time() > min(done) + AFTER_S


def _compound() -> dict[str, Any]:
    """The Fig. 17 row: path fault, then CPU fault; stops 50 s after a restart for the CPU fault (or at 900 s)."""
    faults = [f"path:a=0,b=1,rate={RATE}", f"cpu:rank=1,quota=0.2,at={CPU_AT_S:g},for=900"]
    return row(2, 2, faults, stop=_restart_after_cpu_fault, max_s=900.0, spare_nodes=1,
               policy={"approval": []})


def _phases(r: dict[str, Any]) -> list[str]:
    """One line per phase of the compound row: each fault and each action, with the pace around it."""
    s = r["res"].state
    t0 = s.t0
    out = ["| t (s) | what | pace before | pace after |", "|---|---|---|---|"]
    events: list[tuple[float, str, float | None, float | None]] = []
    for t, spec in s.faults_on:
        events.append((t, f"fault on: `{spec.split(',at=')[0]}`", s.pace(t - 30.0, t), s.pace(t + 20.0, t + 60.0)))
    for a in r["actions"] + r["validations"]:
        if not a.get("started_at"):
            continue
        start, end = float(a["started_at"]), float(a.get("ended_at") or a["started_at"])
        what = a["strategy"]
        p = a.get("params") or {}
        if what == "rebalance":
            what += f" {p.get('counts')}"
        elif not a.get("outcome"):
            what += ", in flight when the run stopped"
        elif what in ("topology", "restart"):
            res = ((a.get("outcome") or {}).get("result") or {})
            what += f" → placement {res.get('placement') or p.get('placement')}"
            if res.get("counts") or p.get("counts"):
                what += f", split {res.get('counts') or p.get('counts')}"
            if res.get("moved"):
                what += f", moved {res['moved']}"
        if not (a.get("outcome") or {}).get("ok", True):
            what += " — failed: " + str((a.get("outcome") or {}).get("detail", ""))[:80]
        meas = a.get("measured") or {}
        if meas.get("pause_s") is not None:
            what += f" (pause {float(meas['pause_s']):.2f} s)"
        events.append((start, what, s.pace(start - 30.0, start), s.pace(end + 20.0, end + 60.0)))
    for t, what, before, after in sorted(events):
        out.append(f"| {t - t0:.0f} | {what} | {fmt(before)} | {fmt(after)} |")
    return out


def _summary(r: dict[str, Any]) -> list[str]:
    """The two phases' healthy / fail-slow / mitigated paces and the overall reduction."""
    s = r["res"].state
    on = sorted(s.faults_on)
    healthy = r.get("healthy")
    if len(on) < 2 or healthy is None:
        return ["(the run did not reach both faults)"]
    acts = sorted((a for a in r["actions"] if a.get("started_at")), key=lambda a: float(a["started_at"]))
    bounds = [(on[0][0], on[1][0], "link (path fault)"), (on[1][0], r["end"], "compute (CPU fault)")]
    out = ["| phase | healthy | fail-slow | mitigated | slowdown reduced | actions |", "|---|---|---|---|---|---|"]
    excess_slow = excess_left = 0.0
    for t0, t1, name in bounds:
        mine = [a for a in acts if t0 <= float(a["started_at"]) < t1]
        first = float(mine[0]["started_at"]) if mine else t1
        slow = s.pace(t0 + 20.0, first)
        left = s.pace(t1 - 40.0, t1)
        red = "–"
        if slow is not None and left is not None and slow > healthy:
            red = f"{(slow - left) / (slow - healthy):.0%}"
            excess_slow += slow - healthy
            excess_left += max(0.0, left - healthy)
        names = ", ".join(a["strategy"] for a in mine) or "none"
        out.append(f"| {name} | {fmt(healthy)} | {fmt(slow)} | {fmt(left)} | {red} | {names} |")
    if excess_slow > 0:
        out += ["", f"Overall slowdown reduced: {1.0 - excess_left / excess_slow:.0%} (FALCON 60.1%)."]
    return out


def run() -> str:
    """Measure; return the Markdown section."""
    comp = _compound()
    lines = ["Command: `.venv/bin/python -m bench mitigate_compound` (one run).", "",
             *_summary(comp), "", "Every fault and action, with the trainer's pace (median) over 30 s before it "
             "and from 20 s to 60 s after it:", "", *_phases(comp)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(run())

"""Mitigation on the testbed, with the remediator deciding: FALCON's Fig. 13 and Fig. 14 for S2.

Every row is one real closed loop (failslow_cli/stack/loop.py): a testbed job (gloo, one network namespace
per node, every rank a device of speed 0.4 of a CPU; CPU faults throttle in 10 ms CFS periods, see
`failslow_cli.stack.loop.CPU_PERIOD_US`), the exporter, Prometheus with the shipped rules, the
detector, Alertmanager and the remediator in auto mode with the testbed adapter. After 40 s of healthy
training CPU quota faults slow one or more ranks; the detector opens an event, the remediator plans (pace
model, exact S2 solver, ski-rental gate) and acts. Each row ends 50 s after the first action finished.
Each Fig. 13 case runs `REPEATS` times (the cases in turns) and its row shows the median run beside every
run's reduction: on this shared host the same case varies between runs, by tens of points for the weak
faults, whose slowdown is close to the host's own drift.
Set ``FAILSLOW_BENCH_KEEP`` to a directory to keep every row's files there (`row`).

* Fig. 13 — one slow rank (so one slow DP replica), weak / medium / severe: quota 0.3 / 0.2 / 0.12 CPU on
  a device of 0.4 (1.3x / 2x / 3.3x slower compute), on DP2xPP2 and DP4xPP1 (4 ranks each: the most this
  2-core machine runs without the ranks starving each other).
* Fig. 14 — DP4xPP1 with 1, 2, 3 and all 4 DP replicas slowed (medium). With all slowed there is nothing
  to move: the remediator must not act.

Every replica runs 8 micro-batches of 2 sequences per iteration (the testbed's default is 4 of 4: the same
global batch). A split moves whole micro-batches, so how much of a slowdown S2 can take back depends on how
many there are: with 4 per replica the best split of DP2xPP2 takes back 25% of a 1.33x slowdown, with 8 50%.
The "best split" column says what S2 could reach at most: the exact solver's split if the slowed stage were
exactly device / quota times slower and nothing else changed (1F1B: a replica of m micro-batches takes
(m-1) max tau + sum tau), and the share of the slowdown it removes (the fixed per-iteration time cancels).

Columns: iteration time healthy (before the fault), with the fault (until the first action) and mitigated
(from 25 s after the action until the row ends), all medians of the trainer's own per-iteration times
(each iteration the mean of its ranks' times, `Iteration.period`);
slowdown reduced = (slow - mitigated) / (slow - healthy); fault -> action = from the fault to the adapter
call (detection, alerting, decision); decision = the delivery that opened the event to the adapter call;
the action's measured cost; the pace model's prediction made before each action beside the pace measured
after it (from `SETTLE_S` after it until the next action, or the row's end).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import numpy as np

from failslow.plan import rebalance
from failslow.plan.pace import PaceModel
from failslow.topology import Layout

TITLE = "Mitigation on the testbed: S2 with the remediator deciding (FALCON Fig. 13, Fig. 14)"
DEVICE = 0.4
SEVERITY = {"weak": 0.3, "medium": 0.2, "severe": 0.12}
MICRO_BATCHES, MICRO_BATCH_SIZE = 8, 2  # per replica per iteration; sequences per micro-batch
REPEATS = 3  # runs of each Fig. 13 case, taken in turns so that a drift of the host reaches every case alike
SETTLE_S = 25.0  # after the action, before the mitigated pace is measured
AFTER_S = 50.0  # the row ends this long after the first action finished
QUIET_S = 200.0  # a row without any action ends this long after the fault
KEEP_ENV = "FAILSLOW_BENCH_KEEP"  # a directory: every row keeps its loop's files there (see `row`)


def _acts(s: Any) -> list[dict[str, Any]]:
    """The job's executed actions (validations are measurements, not mitigations)."""
    return sorted((a for a in s.actions if a["job"] == s.job and not a.get("dry_run")
                   and a["strategy"] != "validate"), key=lambda a: a["created_at"])


def stop_after(after_s: float = AFTER_S) -> Callable[[Any], bool]:
    """A row's stop condition: `after_s` after its first action finished, or `QUIET_S` after the fault
    without one."""
    def stop(s: Any) -> bool:
        acts = [a for a in _acts(s) if a.get("ended_at")]
        if acts:
            return time.time() > min(float(a["ended_at"]) for a in acts) + after_s
        return s.fault_start is not None and time.time() > s.fault_start + QUIET_S

    return stop


_stop = stop_after()


def _record(d: Path, res: Any) -> None:
    """Write what a loop saw next to its services' data and logs (which the loop keeps there already):
    ``record.json`` (the trainer's iterations, the remediator's events, actions and audit, the fault's times)
    and ``testbed.out``, the trainer's output, which the loop holds only in memory."""
    s = res.state
    (d / "record.json").write_text(json.dumps({
        "job": s.job, "t0": s.t0, "fault": res.fault_spec, "fault_start": s.fault_start, "fault_end": s.fault_end,
        "iterations": [{"t": i.t, "it": i.it, "dt": i.dt} for i in s.iterations], "events": s.events,
        "actions": s.actions, "audit": res.audit, "notes": s.notes, "settings": res.settings}, default=str))
    (d / "testbed.out").write_text(res.logs.get("testbed", ""))


def row(dp: int, pp: int, faults: list[str], *, device: float = DEVICE, stop: Any = _stop, max_s: float = 480.0,
        **loop: Any) -> dict[str, Any]:
    """One closed loop with `faults` on a DPxPP job; the paces and actions of its mitigation.

    ``slow`` is measured from 20 s after the first fault to the first action, ``mitigated`` from `SETTLE_S`
    after the first action ended to the end; ``res`` keeps the loop's result for rows that look further.

    With ``FAILSLOW_BENCH_KEEP`` set to a directory, the loop runs in a new directory under it (named by the
    time and the layout) that stays after the row: Prometheus's data, the services' files, the logs and
    ``record.json`` (:func:`_record`), to look into a run afterwards.
    """
    from failslow_cli.stack.loop import run_loop

    keep = os.environ.get(KEEP_ENV)
    if keep:
        kept = Path(keep) / f"{time.strftime('%Y%m%dT%H%M%S')}-dp{dp}pp{pp}"
        kept.mkdir(parents=True)
    with nullcontext(str(kept)) if keep else TemporaryDirectory(prefix="bench-mitigate-") as d:
        res = run_loop(Path(d), dp=dp, pp=pp, fault=faults, device_speed=device, fault_s=600.0, max_s=max_s,
                       stop_when=stop, **loop)
        if keep:
            _record(Path(d), res)
    s = res.state
    acts = _acts(s)
    first = next((a for a in acts if a.get("started_at")), None)
    end = time.time() if s.fault_end is None else s.fault_end
    out: dict[str, Any] = {"dp": dp, "pp": pp, "faults": faults, "actions": acts, "first": first,
                           "healthy": s.pace(s.t0 + 15.0, s.fault_start or end),
                           "alert": (res.times() or {}).get("alert"), "res": res, "end": end,
                           "validations": [a for a in s.actions if a["job"] == s.job and a["strategy"] == "validate"
                                           and not a.get("dry_run")]}
    if first is not None and s.fault_start is not None:
        out["slow"] = s.pace(s.fault_start + 20.0, float(first["started_at"]))
        out["mitigated"] = s.pace(float(first.get("ended_at") or first["started_at"]) + SETTLE_S, end + 1e9)
        out["fault_to_action"] = float(first["started_at"]) - s.fault_start
    elif s.fault_start is not None:
        out["slow"] = s.pace(s.fault_start + 20.0, end + 1e9)
    return out


def fmt(x: Any, d: int = 3, unit: str = " s") -> str:
    """A number for the tables, or an en dash."""
    return "–" if x is None else f"{float(x):.{d}f}{unit}"


def reduced(r: dict[str, Any]) -> float | None:
    """The share of the slowdown a row's mitigation removed, (slow - mitigated) / (slow - healthy)."""
    h, s, m = r.get("healthy"), r.get("slow"), r.get("mitigated")
    return (s - m) / (s - h) if h and s and m and s > h else None


def paces(r: dict[str, Any]) -> str:
    """A row's healthy, fail-slow and mitigated cells and the share of the slowdown removed."""
    red = reduced(r)
    return f"{fmt(r.get('healthy'))} | {fmt(r.get('slow'))} | {fmt(r.get('mitigated'))} | " \
           f"{'–' if red is None else f'{red:.0%}'}"


def median_run(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The run whose reduction is the median of the runs' (a run without one counts as the lowest)."""
    def key(r: dict[str, Any]) -> float:
        red = reduced(r)
        return -1.0 if red is None else red

    return sorted(runs, key=key)[(len(runs) - 1) // 2]


def prediction(r: dict[str, Any]) -> str:
    """Each action's predicted pace beside its error against the pace measured after it: from `SETTLE_S` after
    it ended to the next action's start (to the row's end for the last; "–" for a stretch of fewer than three
    iterations). With one action, the error is against the row's mitigated pace."""
    s = r["res"].state
    acts = [a for a in r["actions"] if a.get("started_at")]
    out = []
    for i, a in enumerate(acts):
        pred = (a.get("predicted") or {}).get("pace_s")
        until = float(acts[i + 1]["started_at"]) if i + 1 < len(acts) else r["end"] + 1e9
        m = s.pace(float(a.get("ended_at") or a["started_at"]) + SETTLE_S, until)
        out.append(f"{fmt(pred)} / {f'{(float(pred) - m) / m:+.1%}' if pred and m else '–'}")
    return ", ".join(out) or "– / –"


def actions(r: dict[str, Any], param: str) -> str:
    """The row's actions, each with its parameter `param` (the split, the placement)."""
    return ", ".join(f"{a['strategy']} {a.get('params', {}).get(param, '')}".strip() for a in r["actions"]) \
        or "none"


def line(name: str, r: dict[str, Any]) -> str:
    first = r.get("first") or {}
    meas = first.get("measured") or {}
    return (f"| {name} | {paces(r)} | {actions(r, 'counts')} | {fmt(r.get('fault_to_action'), 1)} | "
            f"{fmt(first.get('decision_latency_s'))} | {fmt(meas.get('duration_s'))} | {prediction(r)} |")


HEADER = ["| case | healthy | fail-slow | mitigated | slowdown reduced | actions | fault → action | decision | "
          "action cost | predicted / error |",
          "|---|---|---|---|---|---|---|---|---|---|"]
S2_HEADER = [HEADER[0] + " best split / reduction | reduced, each run |", HEADER[1] + "---|---|"]


def best_split(dp: int, pp: int, slowed: Sequence[int], factor: float, per_replica: int) -> tuple[list[int], float]:
    """The split S2 could reach at most and the share of the slowdown it removes: the first stage of each
    `slowed` replica exactly `factor` times slower, every other stage as healthy, in the remediator's own
    pipeline model (:class:`failslow.plan.pace.PaceModel`: a 1F1B replica of m micro-batches takes
    ``(m-1) max tau + sum tau``) with no fixed part, which cancels in the share."""
    tau = np.ones((dp, pp))
    tau[list(slowed), 0] = factor
    even = (per_replica,) * dp
    slow = PaceModel(tau, even, 0.0, 0.0)
    res = rebalance(slow.times, dp * per_replica, 1, offsets=slow.offsets)
    healthy = float(PaceModel(np.ones((dp, pp)), even, 0.0, 0.0).replica_s(even).max())
    before = float(slow.replica_s(even).max())
    gain = (before - float(res.makespan)) / (before - healthy) if before > healthy else 0.0
    return [int(c) for c in res.counts], gain


def _unreduced(r: dict[str, Any]) -> str:
    """Why a run has no reduction to show."""
    s = r["res"].state
    if r.get("first") is None:
        if s.event is None:
            return "no alert" if s.fault_start is None else f"no alert in {r['end'] - s.fault_start:.0f} s"
        return "no action"
    h, sl, m = r.get("healthy"), r.get("slow"), r.get("mitigated")
    if sl is None and s.fault_start is not None:
        # the fail-slow pace runs from 20 s after the fault to the first action
        return f"first action {float(r['first']['started_at']) - s.fault_start:+.0f} s from the fault"
    if not (h and sl and m):
        return "pace not measured"
    return f"not slower than healthy ({sl:.3f} vs {h:.3f} s)"


def s2_line(name: str, runs: Sequence[dict[str, Any]], best: tuple[list[int], float]) -> str:
    """A Fig. 13 / 14 row: :func:`line` of the median run, the best split and every run's reduction."""
    each = " / ".join(f"– ({_unreduced(r)})" if reduced(r) is None else f"{reduced(r):.0%}" for r in runs)
    return line(name, median_run(runs)) + f" {best[0]} / {best[1]:.0%} | {each} |"


def run() -> str:
    """Measure; return the Markdown section."""
    mb = {"micro_batches": MICRO_BATCHES, "micro_batch_size": MICRO_BATCH_SIZE}
    cases = []
    for dp, pp in ((2, 2), (4, 1)):
        for sev, quota in SEVERITY.items():
            # the replica rank 1 is in (replica 1 in both layouts: ranks go through DP first)
            rep = Layout(dp=dp, pp=pp).coords(1).dp
            cases.append((f"DP{dp}xPP{pp}, {sev} (quota {quota:g})", dp, pp, [f"cpu:rank=1,quota={quota:g}"],
                          best_split(dp, pp, [rep], DEVICE / quota, MICRO_BATCHES)))
    runs: list[list[dict[str, Any]]] = [[] for _ in cases]
    for _ in range(REPEATS):
        for i, (_, dp, pp, faults, _) in enumerate(cases):
            runs[i].append(row(dp, pp, faults, **mb))
    fig13 = [(name, runs[i], best) for i, (name, _, _, _, best) in enumerate(cases)]
    fig14: list[tuple[str, list[dict[str, Any]], tuple[list[int], float]]] = []
    for k in (2, 3, 4):  # k = 1 is the medium DP4 row of Fig. 13
        fig14.append((f"DP4xPP1, {k} of 4 replicas slowed",
                      [row(4, 1, [f"cpu:rank={r},quota={SEVERITY['medium']:g}" for r in range(k)], **mb)],
                      best_split(4, 1, list(range(k)), DEVICE / SEVERITY["medium"], MICRO_BATCHES)))
    lines = ["Command: `.venv/bin/python -m bench mitigate` (each Fig. 13 case run "
             f"{REPEATS} times, the cases in turns; each Fig. 14 case once; {MICRO_BATCHES} micro-batches of "
             f"{MICRO_BATCH_SIZE} sequences per replica).", "",
             "**Fig. 13 — one slow DP replica, three severities**", "", *S2_HEADER,
             *(s2_line(*x) for x in fig13), "",
             "**Fig. 14 — DP4xPP1, several replicas slowed (medium)**", "", *S2_HEADER,
             s2_line("DP4xPP1, 1 of 4 replicas slowed", *fig13[4][1:]), *(s2_line(*x) for x in fig14), "",
             "Each row's cells are those of its median run (by slowdown reduced; the last column lists every "
             "run's, in the order they ran). "
             "Healthy / fail-slow / mitigated are the trainer's own iteration times (medians; each iteration the "
             "mean of its ranks' times); the action cost is "
             "the adapter call's duration (a split applies at an iteration boundary: no pause); the prediction is "
             "the pace model's, made before each action, against the pace after it until the next action; the best split is what S2 could reach at most "
             "(`best_split`: the slowed stage exactly device / quota times slower, the pipeline's 1F1B time); "
             "the weak DP2xPP2 case at 64 micro-batches per replica, where its bound is 56%, is the "
             "`mitigate_fine` section. FALCON reports 55.3-82.9% for S2 on one slow replica."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(run())

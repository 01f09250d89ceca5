"""S3 on the testbed against a congested link, with the remediator deciding: FALCON's Fig. 15.

Every row is one real closed loop (failslow_cli/stack/loop.py, as in the ``mitigate`` section): a testbed job
(gloo, one network namespace per node, one rank per node), the exporter, Prometheus with the shipped rules,
the detector, Alertmanager and the remediator in auto mode with the testbed adapter.

* Fig. 15 — S3 against a congested data-parallel link: after 40 s of healthy training a ``tc`` path fault
  (htb on both ends) throttles the path between node 0 and node 1, the two ends of stage 0's gradient
  ring, to `RATE`. The detector names the link suspects (both nodes); the remediator validates them (the
  O(1)-round point-to-point test, which tells a congested path from a slow NIC), plans S3 with the job's own
  traffic (its gradient bytes per stage, its activations per micro-batch, the measured healthy link
  bandwidth) calibrated on the healthy pace, and restarts the job from a checkpoint with the new placement.
  The fault stays on for the whole row: the path is still congested, it only carries less.
Columns as in ``mitigate``; the pause is the time no rank trained across the action (the restart's pause
as the testbed measures it, plus the validation's).
"""

from __future__ import annotations

import time
from typing import Any

from bench.bench_mitigate import AFTER_S, actions, fmt, paces, prediction, row

TITLE = "Mitigation on the testbed: S3 against a congested DP link (FALCON Fig. 15)"
RATE = "20mbit"


def _strategy_done(strategy: str, after_s: float = AFTER_S) -> Any:
    def stop(s: Any) -> bool:
        acts = [a for a in s.actions if a.get("job") == s.job and a.get("strategy") == strategy
                and not a.get("dry_run") and a.get("ended_at")]
        return bool(acts) and time.time() > min(float(a["ended_at"]) for a in acts) + after_s
    return stop


def _pauses(r: dict[str, Any]) -> tuple[float | None, float | None, int | None]:
    """Validation pause, the first restart's pause and the iterations it lost."""
    val = [float((a.get("measured") or {}).get("pause_s") or 0.0) for a in r["validations"]]
    first = r.get("first") or {}
    meas = first.get("measured") or {}
    return (sum(val) if val else None, meas.get("pause_s"), meas.get("iterations_lost"))


def _s3_line(name: str, r: dict[str, Any]) -> str:
    val, pause, lost = _pauses(r)
    return (f"| {name} | {paces(r)} | {actions(r, 'placement')} | {fmt(r.get('fault_to_action'), 1)} | "
            f"{fmt(val, 2)} | {fmt(pause, 2)} / {lost if lost is not None else '–'} | {prediction(r)} |")


S3_HEADER = ["| case | healthy | fail-slow | mitigated | slowdown reduced | actions (placement) | fault → action | "
             "validation pause | restart pause / iterations lost | predicted / error |",
             "|---|---|---|---|---|---|---|---|---|---|"]


def run() -> str:
    """Measure; return the Markdown section."""
    fig15 = [(f"DP2xPP{pp}, path 0-1 at {RATE} (stage 0's DP link)",
              row(2, pp, [f"path:a=0,b=1,rate={RATE}"], device=0.4 if pp == 2 else 0.2,
                  stop=_strategy_done("topology"), max_s=480.0)) for pp in (2, 4)]
    lines = ["Command: `.venv/bin/python -m bench mitigate_topology` (one run per row, rows one after another).", "",
             f"**Fig. 15 — S3 against a congested DP link (path fault at {RATE})**", "", *S3_HEADER,
             *(_s3_line(n, r) for n, r in fig15), "",
             "DP2xPP2 runs on devices of 0.4 CPU, DP2xPP4 (8 ranks on 2 cores) on devices of 0.2 CPU. "
             "FALCON reports a 53.7% reduction for a congested DP link at PP4."]
    return "\n".join(lines) + "\n"

if __name__ == "__main__":
    print(run())

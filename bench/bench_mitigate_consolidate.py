"""Straggler consolidation on the testbed, with the remediator deciding: FALCON's Fig. 16.

Every row is one real closed loop as in the ``mitigate`` section (one rank per node, devices of 0.4 CPU on
DP2xPP2, 0.25 CPU on DP2xPP3). After 40 s of healthy training CPU quota faults (medium: 0.5 of the device)
slow one GPU in each of 2 or 3 pipeline stages, alternating DP replicas, so that every replica is slow and S2
alone has little to shift (one slowed stage is the ``mitigate`` section's single slow replica, S2 alone). The remediator validates the suspects (GEMM) and
plans S3 with each placement scored under its own best micro-batch split: the slow GPUs are gathered into
one replica and the split applied with the restart. A CPU fault belongs to its device (a node's slot): after
the move it slows whichever rank the new placement puts there.

Columns as in ``mitigate``; the actions column gives the placement and the split the topology action applied.
"""

from __future__ import annotations

from typing import Any

from bench.bench_mitigate import HEADER, line, row
from bench.bench_mitigate_topology import _strategy_done

TITLE = "Mitigation on the testbed: straggler consolidation, S3 with S2 (FALCON Fig. 16)"

# (dp, pp, device, slowed ranks): rank = stage * dp + replica; one slowed GPU per stage, replicas alternating
CASES: list[tuple[int, int, float, list[int]]] = [
    (2, 2, 0.4, [1, 2]),
    (2, 3, 0.25, [1, 2, 5]),
]


def _stop(s: Any) -> bool:
    """50 s after a move; or 120 s after a split when nothing is in flight (S2 was all it took)."""
    busy = any(a.get("job") == s.job and not a.get("ended_at") for a in s.actions)
    return _strategy_done("topology")(s) or (_strategy_done("rebalance", 120.0)(s) and not busy)


def run() -> str:
    """Measure; return the Markdown section."""
    rows: list[tuple[str, dict[str, Any]]] = []
    for dp, pp, device, ranks in CASES:
        faults = [f"cpu:rank={r},quota={device / 2:g}" for r in ranks]
        rows.append((f"DP{dp}xPP{pp}, {len(ranks)} slowed stage(s) (ranks {', '.join(map(str, ranks))})",
                     row(dp, pp, faults, device=device, stop=_stop, max_s=600.0)))

    def actions(r: dict[str, Any]) -> dict[str, Any]:
        shown = []
        for a in r["actions"]:
            p = a.get("params") or {}
            if a["strategy"] == "topology":
                split = f" split {p['counts']}" if p.get("counts") else ""  # else the split stayed
                shown.append({**a, "params": {"counts": f"{p.get('placement')}{split}"}})
            else:
                shown.append(a)
        return {**r, "actions": shown}

    lines = ["Command: `.venv/bin/python -m bench mitigate_consolidate` (one run per row, rows one after another).",
             "", *HEADER, *(line(n, actions(r)) for n, r in rows), "",
             "A row ends 50 s after the topology action, 120 s after a split when nothing else is in flight, or after 600 s. "
             "One slowed stage is the single slow DP replica of the `mitigate` section (Fig. 13 rows, S2 alone). "
             "FALCON reports that consolidating the stragglers before S2 keeps the slowdown reduction of a single slow "
             "replica as stragglers spread."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(run())

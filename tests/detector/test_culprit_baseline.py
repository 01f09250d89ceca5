"""Stage suspects are judged against each stage's own healthy compute (detector/culprit.py)."""

from __future__ import annotations

from typing import Any

from detector.culprit import analyse_job
from detector.prom import Sample

# DP2xPP4, one rank per node: rank = stage * 2 + replica. The last stage (LM head, loss) computes 1.7x
# what the others do in a healthy job; a congested DP link of stage 0 then slows every iteration.
HEALTHY = {0: 0.19, 1: 0.19, 2: 0.18, 3: 0.18, 4: 0.18, 5: 0.18, 6: 0.31, 7: 0.31}


class FakeProm:
    """Answers the analysis' queries: compute per rank now (`now`), or before the onset (offset queries)."""

    def __init__(self, now: dict[int, float]) -> None:
        self.now = now
        self.queries: list[str] = []

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        self.queries.append(expr)
        lab = lambda r: {"job": "j", "rank": str(r), "pp_rank": str(r // 2), "dp_rank": str(r % 2),  # noqa: E731
                         "tp_rank": "0", "node": str(r)}
        if expr.startswith("avg_over_time(failslow_iteration_compute_seconds"):
            vals = HEALTHY if " offset " in expr else self.now
            return [Sample(lab(r), v) for r, v in vals.items()]
        return []


def _stages(an: Any) -> list[int]:
    return sorted(c.stage for c in an.culprits if getattr(c, "stage", None) is not None)


def test_a_naturally_heavier_last_stage_is_no_suspect_against_its_own_healthy_work() -> None:
    now = dict(HEALTHY)  # nothing computes slower than before: the slowdown is in a link
    # without the healthy reference the last stage looks 1.7x slower than the others and is named
    an, _ = analyse_job(FakeProm(now), "j", 60.0, {})
    assert _stages(an) == [3]
    prom = FakeProm(now)
    an, _ = analyse_job(prom, "j", 60.0, {}, before_s=90.0)
    assert _stages(an) == []
    assert any("offset 90000ms" in q and "[120000ms]" in q for q in prom.queries), prom.queries


def test_a_stage_that_did_slow_down_is_still_named() -> None:
    now = {r: v * (2.0 if r // 2 == 1 else 1.0) for r, v in HEALTHY.items()}  # stage 1 at half speed
    an, _ = analyse_job(FakeProm(now), "j", 60.0, {}, before_s=90.0)
    assert _stages(an) == [1]

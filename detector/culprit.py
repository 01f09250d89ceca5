"""Culprit analysis for a job with an open event, from the per-communicator series in Prometheus.

Queries (``W`` = the slow period so far, capped by ``culprit_window_s``):

* ``avg_over_time(failslow_iteration_compute_seconds{job=J}[W])``: time per iteration outside calls;
* ``sum by (rank, comm) (rate(failslow_comm_call_duration_seconds_sum{job=J}[W]))`` over the same for
  ``_count``: mean time per call of each rank on each communicator;
* ``failslow_comm_info{job=J}``: the parallel role of each communicator, so only like groups are compared;
* each rank's ``Send`` calls per iteration over ``W`` (the increase of ``failslow_comm_calls_total`` over
  that of ``failslow_iterations_total``) and
  ``avg_over_time(failslow_iteration_outside_pipeline_compute_seconds{job=J}[W])``: its micro-batches and
  the compute that does not scale with them, so DP peers running an uneven split (after a rebalance) are
  compared per micro-batch;
* ``changes(failslow_iteration_period_calls{job=J}[W])``, ``resets(failslow_iterations_total{job=J}[W])``
  and the series of each rank: ``W`` is cut after a change of the split or a restart (:func:`settled_window`).

Then :func:`failslow.culprit.analyse_aggregates` names the suspects; peers of a rank are the ranks with the
same ``pp_rank``/``tp_rank`` labels (its data-parallel group), stages come from ``pp_rank`` (a whole slow
stage is named rank by rank) and nodes from the ``node`` label.
"""

from __future__ import annotations

from typing import Any

from detector.prom import PromClient, Sample
from failslow.culprit import Analysis, analyse_aggregates
from failslow.period import CONFIDENCE_MIN


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"')


def _rank(s: Sample) -> int | None:
    try:
        return int(s.labels.get("rank", ""))
    except ValueError:
        return None


def _ms(seconds: float) -> str:
    """A PromQL duration of `seconds`, in whole milliseconds (at least 1)."""
    return f"{max(1, int(seconds * 1000))}ms"


def analyse_job(prom: PromClient, job: str, window_s: float,
                rank_labels: dict[int, dict[str, str]], before_s: float | None = None,
                healthy_window_s: float = 120.0, step_s: float = 15.0) -> tuple[Analysis, dict[int, str]] | None:
    """Query one job's aggregates and run the culprit analysis (raises PromUnavailable).

    `before_s`: how long ago the slowdown began; the stages' compute over the `healthy_window_s` before it is
    each stage's own work, so a stage is compared with the others relative to its healthy self (the last
    stage's LM head and loss make it heavier in any healthy job). Unknown: stages count as equal work.
    `step_s`: the poll interval, the resolution the window is cut at (:func:`settled_window`).

    Returns the analysis and the node names behind its node numbers; None while the job's micro-batch split
    or placement changed too recently to be analysed (:func:`settled_window`).
    """
    sel = f'job="{_esc(job)}"'
    settled = settled_window(prom, sel, window_s, step_s)
    if settled is None:
        return None
    window_s = settled
    w = _ms(window_s)
    outside: dict[int, float] = {}
    for s in prom.query(f"avg_over_time(failslow_iteration_compute_seconds{{{sel}}}[{w}])"):
        r = _rank(s)
        if r is not None and s.value == s.value:
            outside[r] = s.value
            rank_labels.setdefault(r, {}).update({k: v for k, v in s.labels.items() if k != "__name__"})
    num = prom.query(f"sum by (rank, comm) (rate(failslow_comm_call_duration_seconds_sum{{{sel}}}[{w}]))")
    den = prom.query(f"sum by (rank, comm) (rate(failslow_comm_call_duration_seconds_count{{{sel}}}[{w}]))")
    counts = {(s.labels.get("rank"), s.labels.get("comm")): s.value for s in den}
    groups: dict[str, dict[int, float]] = {}
    for s in num:
        key = (s.labels.get("rank"), s.labels.get("comm"))
        r = _rank(s)
        c = counts.get(key, 0.0)
        if r is None or not c or key[1] is None:
            continue
        groups.setdefault(key[1], {})[r] = s.value / c
    kinds: dict[str, str] = {}
    for s in prom.query(f"failslow_comm_info{{{sel}}}"):
        comm = s.labels.get("comm")
        if comm is not None:
            kinds[comm] = f"{s.labels.get('group', '')}:{s.labels.get('nranks', '')}"

    def peers(r: int) -> list[int]:
        me = rank_labels.get(r, {})
        key = (me.get("pp_rank"), me.get("tp_rank"))
        return [p for p, lab in rank_labels.items() if (lab.get("pp_rank"), lab.get("tp_rank")) == key]

    node_names: dict[int, str] = {r: lab.get("node", "") for r, lab in rank_labels.items()}
    node_ids = {n: i for i, n in enumerate(sorted(set(node_names.values())))}
    node_of: dict[int, int] = {r: node_ids[n] for r, n in node_names.items()}
    for r in outside:
        node_of.setdefault(r, -1)
        for g in groups.values():
            for rr in g:
                node_of.setdefault(rr, -1)
    stage_of: dict[int, int] = {}
    for r, lab in rank_labels.items():
        if lab.get("pp_rank", "").isdigit():
            stage_of[r] = int(lab["pp_rank"])
    # Stages are compared only when every rank's stage is known (a partial map would mis-pool ranks).
    use_stages = bool(outside) and all(r in stage_of for r in outside) and len(set(stage_of.values())) > 1
    work = _stage_work(prom, sel, stage_of, before_s, healthy_window_s) if use_stages else None
    # The sends per iteration only change with the split: counted over the longest window, up to the healthy
    # window before this one, that holds the newest split alone, as an onset stops the exporter's iteration
    # counters for a while (a window that starts inside such a stop counts iterations from before it).
    longest = settled_window(prom, sel, window_s + healthy_window_s, step_s) or 0.0
    sends, fixed = _pipeline(prom, sel, w, _ms(max(window_s, longest)))
    analysis = analyse_aggregates(outside, groups, group_kind=kinds, node_of=node_of, peers_of=peers,
                                  stage_of=stage_of if use_stages else None, stage_work=work,
                                  pipeline_sends=sends, fixed_s=fixed)
    return analysis, {i: n for n, i in node_ids.items()}


#: The fewest poll intervals a culprit window is cut down to when the job's split or placement changed in it.
MIN_SETTLED_STEPS = 6


def _sends(prom: PromClient, sel: str, w: str) -> dict[int, float]:
    """Each rank's pipeline sends per iteration (its micro-batches) over the window `w`: the increase of its
    ``Send`` calls over that of its iterations, to the nearest whole send, as every iteration of a fixed split
    makes the same number of them. Over a whole window rather than as a mean of short rates: the exporter's
    iteration counter stops while it finds a new period (at an onset, after a split change) and catches up
    once it has, so the ratio of two short rates jumps (36 sends per iteration for a 4-send rank, measured on
    the testbed), while over the window the catch-up restores the count."""
    expr = (f'sum by (rank) (increase(failslow_comm_calls_total{{{sel},op="Send"}}[{w}])) '
            f'/ sum by (rank) (increase(failslow_iterations_total{{{sel}}}[{w}]))')
    out: dict[int, float] = {}
    for s in prom.query(expr):
        r = _rank(s)
        if r is not None and s.value > 0 and s.value != float("inf"):
            out[r] = float(max(1, round(s.value)))
    return out


def _restarted(prom: PromClient, sel: str, step_s: float, window_s: float) -> bool:
    """Whether a rank of the job restarted inside the last `window_s` (its iteration counter reset) or moved
    (a series of it ended: its node label changed, as an S3 or S4 restart on another node does)."""
    w = _ms(window_s)
    if any(s.value > 0 for s in prom.query(f"sum by (rank) (resets(failslow_iterations_total{{{sel}}}[{w}]))")):
        return True
    def series(span: str) -> dict[str | None, float]:
        return {s.labels.get("rank"): s.value for s in
                prom.query(f"count by (rank) (last_over_time(failslow_iteration_compute_seconds{{{sel}}}[{span}]))")}
    now = series(_ms(2 * step_s))
    return any(n > now.get(r, 0.0) for r, n in series(w).items())


def _changed(prom: PromClient, sel: str, step_s: float, window_s: float) -> bool:
    """Whether the job changed inside the last `window_s`: the calls per iteration (the exporter's period) of a
    rank with pipeline sends changed, as a new micro-batch split changes its sends and receives, or the
    exporter was unsure of that period in the window (it hides the period then, so a change across the gap
    leaves no two samples to differ: on the testbed a rank's period went 3 -> hidden for 15 s -> 5), or a
    rank restarted or moved (:func:`_restarted`). Without pipeline sends a split leaves the calls as they
    were, and a change of period tells nothing the analysis needs."""
    w = _ms(window_s)
    expr = (f"(changes(failslow_iteration_period_calls{{{sel}}}[{w}]) > 0 "
            f"or min_over_time(failslow_iteration_period_confidence_ratio{{{sel}}}[{w}]) < {CONFIDENCE_MIN}) "
            f'and on (rank) failslow_comm_calls_total{{{sel},op="Send"}}')
    if prom.query(expr):
        return True
    return _restarted(prom, sel, step_s, window_s)


def settled_window(prom: PromClient, sel: str, window_s: float, step_s: float) -> float | None:
    """The window the culprit analysis may average over: `window_s`, unless the job changed inside it.

    A change (:func:`_changed`) is a new micro-batch split, seen as a change of a rank's calls per iteration
    (averages across it compare each rank's compute with a mix of two splits, and the rescaling to the mean
    work, not linear in the counts, misreads both sides: a healthy rank was named at 1.12x its peer), or a
    rank that restarted or moved (after an S3 or S4 move the slow device holds another rank, and a window
    across it names both). Then the window is halved until it holds the newest state alone, and halved once
    more, as the exporter's gauges are means over its last iterations and lag the change. None: the change is
    too recent for a window of ``MIN_SETTLED_STEPS`` poll intervals (the analysis waits)."""
    w = window_s
    while w == window_s or w >= MIN_SETTLED_STEPS * step_s:
        if not _changed(prom, sel, step_s, w):
            return w if w == window_s else max(w / 2, MIN_SETTLED_STEPS * step_s)
        w /= 2
    return None


def _pipeline(prom: PromClient, sel: str, w: str, sends_w: str) -> tuple[dict[int, float], dict[int, float]]:
    """Each rank's pipeline sends per iteration over `sends_w` (:func:`_sends`) and its outside-pipeline compute
    over the window `w` (empty where a rank has neither)."""
    sends = _sends(prom, sel, sends_w)
    fixed: dict[int, float] = {}
    for s in prom.query(f"avg_over_time(failslow_iteration_outside_pipeline_compute_seconds{{{sel}}}[{w}])"):
        r = _rank(s)
        if r is not None and s.value == s.value:
            fixed[r] = s.value
    return sends, fixed


def _stage_work(prom: PromClient, sel: str, stage_of: dict[int, int], before_s: float | None,
                healthy_window_s: float) -> dict[int, float] | None:
    """Each stage's compute per iteration before the slowdown (its fastest rank's), or None when unknown."""
    if before_s is None or before_s <= 0:
        return None
    h, off = _ms(healthy_window_s), _ms(before_s)
    best: dict[int, float] = {}
    for s in prom.query(f"avg_over_time(failslow_iteration_compute_seconds{{{sel}}}[{h}] offset {off})"):
        r = _rank(s)
        if r is None or r not in stage_of or not (s.value > 0):
            continue
        st = stage_of[r]
        best[st] = min(best.get(st, s.value), s.value)
    if set(best) != set(stage_of.values()):
        return None
    return best


def suspects(analysis: Analysis, names: dict[int, str], limit: int,
             rank_nodes: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """The top culprits as JSON-able dicts with the labels of the suspect metric.

    A stage suspect becomes one compute suspect per rank of the stage (``rank_nodes`` gives their node
    names), within the same ``limit``.
    """
    out: list[dict[str, Any]] = []
    for c in analysis.culprits:
        if c.stage is not None:
            # A whole pipeline stage: one compute suspect per rank of it, so the label set stays
            # (job, kind, rank, node) and alerts name ranks as for any compute suspect.
            for r in c.ranks:
                out.append({"kind": c.kind, "rank": str(r), "node": (rank_nodes or {}).get(r, ""),
                            "confidence": c.confidence, "evidence": c.evidence})
            continue
        node = names.get(c.node, "") if c.node is not None else ""
        out.append({"kind": c.kind, "rank": "" if c.rank is None else str(c.rank), "node": node,
                    "confidence": c.confidence, "evidence": c.evidence})
    return out[:limit]

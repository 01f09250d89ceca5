"""Scores the exporter's iteration times against a trainer's own measurements (testbed report).

What it is for: the accuracy target (exporter iteration time within 1.2% of the trainer's ground
truth) is checked by replaying each rank's ring through the exporter's per-rank logic, as successive
polls would see it, and comparing every value the ``failslow_iteration_duration_seconds`` gauge would
have shown (the mean over the last ``window`` iterations) with the trainer's mean over the same
iterations.

Alignment: the exporter marks an iteration at the end of its last communication call, the trainer at
the end of its optimizer step; both are once per iteration, so the exporter's marks sit a roughly
constant time ``c`` from the trainer's. ``c`` is found first (the offset that puts most marks closest
to a trainer end), then every exporter iteration is matched on its own to the trainer iteration whose
end is nearest to ``mark - c``. Matching each iteration (rather than assuming exporter iteration ``j``
is trainer iteration ``j + shift`` for one shift) keeps the comparison right when the exporter skips an
iteration, e.g. the one straddling a re-estimation: with one global shift every later iteration was
compared with its neighbour, which inflated the worst windows of the session-1 bench.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from failslow.errors import InputError
from failslow.period import replay_ring
from failslow.record import find_rings


@dataclass(frozen=True)
class RankAccuracy:
    """How well one rank's exporter series matched the trainer.

    Attributes:
        rank: Global rank.
        period: Calls per iteration found.
        iterations: Exporter iterations matched to trainer iterations.
        windows: Gauge values compared (one per iteration once ``window`` iterations exist).
        mean_abs_err_pct: Mean over those gauge values of ``|exporter / trainer - 1|`` in percent.
        median_abs_err_pct: Median of the same errors (robust to one hiccup of a loaded machine).
        max_abs_err_pct: Largest such error.
        run_err_pct: Error of the mean over all matched iterations (signed, percent).
        trainer_mean_s: Trainer's mean iteration time over the matched iterations.
    """

    rank: int
    period: int | None
    iterations: int
    windows: int
    mean_abs_err_pct: float
    median_abs_err_pct: float
    max_abs_err_pct: float
    run_err_pct: float
    trainer_mean_s: float


def score_rank(history: list[tuple[float, float]], truth_s: list[float], truth_end_unix_s: list[float], *,
               window: int = 20, skip: int = 2) -> tuple[int, int, float, float, float, float, float]:
    """Compare emitted iterations (duration, end time) with the trainer's (pure).

    Returns ``(iterations, windows, mean_abs_err_pct, median_abs_err_pct, max_abs_err_pct, run_err_pct,
    trainer_mean_s)``.
    The first ``skip`` trainer iterations (warm-up, compilation, first touches) are left out.

    Raises:
        InputError: nothing to compare.
    """
    if not history or not truth_s:
        raise InputError("score_rank: no iterations to compare")
    h = np.asarray(history, dtype=np.float64)
    gt = np.asarray(truth_s, dtype=np.float64)
    ge = np.asarray(truth_end_unix_s, dtype=np.float64)
    if h.ndim != 2 or h.shape[1] != 2 or len(gt) != len(ge):
        raise InputError("score_rank: history must be (duration, end) pairs; truth lists of equal length")
    k, c = match_iterations(h[:, 1], ge)
    resid = np.abs(h[:, 1] - c - ge[k])
    # One exporter iteration per trainer iteration: of several marks nearest to one trainer end (e.g.
    # the job's closing barrier after the last iteration) only the closest is that iteration.
    best = np.full(len(gt), np.inf)
    np.minimum.at(best, k, resid)
    ok = (k >= skip) & (resid <= best[k]) & (resid <= 0.5 * gt[k])
    est, tru = h[ok, 0], gt[k[ok]]
    if len(est) == 0:
        raise InputError("score_rank: no exporter iteration overlaps the trainer's")
    # One gauge value per emitted iteration once `window` exist: the mean of the last `window` emitted
    # durations against the trainer's mean over the very iterations they were matched to.
    cs_e = np.concatenate(([0.0], np.cumsum(est)))
    cs_t = np.concatenate(([0.0], np.cumsum(tru)))
    if len(est) >= window:
        e = np.abs((cs_e[window:] - cs_e[:-window]) / (cs_t[window:] - cs_t[:-window]) - 1) * 100
    else:
        e = np.asarray([abs(est.mean() / tru.mean() - 1) * 100])
    windows = max(0, len(est) - window + 1)
    return (len(est), windows, float(e.mean()), float(np.median(e)), float(e.max()),
            float((est.mean() / tru.mean() - 1) * 100), float(tru.mean()))


def match_iterations(marks: np.ndarray, truth_ends: np.ndarray) -> tuple[np.ndarray, float]:
    """Trainer iteration matched to each exporter mark, and the constant offset used (pure).

    The offset ``c`` is chosen among the candidates ``mark - nearest trainer end`` as the one whose
    median distance from shifted marks to their nearest trainer end is smallest: a plain median of
    the nearest offsets fails when the marks sit near half an iteration from the trainer's ends (then
    the nearest end flips between two iterations).

    Returns:
        ``(k, c)``: ``k[j]`` indexes ``truth_ends`` for mark ``j``; ``c`` in seconds.
    """
    m = np.asarray(marks, dtype=np.float64)
    e = np.asarray(truth_ends, dtype=np.float64)

    def nearest(x: np.ndarray) -> np.ndarray:
        i = np.clip(np.searchsorted(e, x), 1, len(e) - 1) if len(e) > 1 else np.zeros(len(x), dtype=np.int64)
        if len(e) > 1:
            i = np.where(np.abs(e[i - 1] - x) <= np.abs(e[i] - x), i - 1, i)
        return np.asarray(i, dtype=np.int64)

    cands = np.unique(np.round(m - e[nearest(m)], 6))
    cost = [float(np.median(np.abs(m - c - e[nearest(m - c)]))) for c in cands]
    c = float(cands[int(np.argmin(cost))])
    return nearest(m - c), c


def score_run(ring_dir: Path, report: dict[str, Any], *, window: int = 20, chunk: int = 256) -> list[RankAccuracy]:
    """Score every ring in ``ring_dir`` (kept after the job with ``FAILSLOW_KEEP_RINGS=1``) against ``report``.

    Raises:
        InputError: no rings, or a ring whose rank the report does not have.
    """
    rings = find_rings(ring_dir)
    if not rings:
        raise InputError(f"no rings in {ring_dir}")
    out = []
    for path in rings:
        tr = replay_ring(path, chunk=chunk, window=window)
        try:
            r = tr.header.rank
            truth = report["iteration_time_s"][str(r)]
            ends = report["iteration_end_unix_s"][str(r)]
        except KeyError:
            tr.close()
            raise InputError(f"report has no iterations of rank {tr.header.rank} ({path.name})") from None
        n, w, mean_e, med_e, max_e, run_e, tmean = score_rank(tr.history or [], truth, ends, window=window)
        out.append(RankAccuracy(rank=r, period=tr.period, iterations=n, windows=w, mean_abs_err_pct=mean_e,
                                median_abs_err_pct=med_e, max_abs_err_pct=max_e, run_err_pct=run_e,
                                trainer_mean_s=tmean))
        tr.close()
    return sorted(out, key=lambda a: a.rank)

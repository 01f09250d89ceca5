"""Iterations of a whole recorded call sequence (`infer_iterations`), with the confidence of the answer.

The batch use of period inference (`failslow period`, profiler traces): the gap split first, else a
`PeriodTracker` run over the calls as the exporter would see them arrive, its iteration times folded when
they cycle (the period found was a fraction of the iteration).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError
from failslow.period.confidence import CONFIDENCE_MIN, OUTLIER_FACTOR, find_cycle, regularity
from failslow.period.gaps import split_by_gaps
from failslow.period.numeric import FloatArray
from failslow.period.symbols import encode_symbols, symbols_repeat
from failslow.period.tracker import PeriodTracker

#: Confidence of an answer folded from a tracker period whose iteration times cycle (three whole cycles).
FOLD_CONFIDENCE: Final = 0.6


@dataclass(frozen=True)
class IterationResult:
    """Iterations found in a whole recorded call sequence (`infer_iterations`).

    Attributes:
        period: Calls per iteration at the end of the sequence (``None`` if never found; the median when
            the gap split found iterations of varying counts).
        periods: Every period adopted, in order (more than one when the pattern changed).
        iteration_s: Duration of every iteration found, in order.
        iteration_end_t: Time each of those iterations ended.
        confidence: In [0, 1]; below `CONFIDENCE_MIN` the period is not to be stated (see ``reason``).
        reason: Why the confidence is low (empty when it is not).
        method: ``"gaps"`` (split at the gaps between iterations, `split_by_gaps`) or ``"tracker"``
            (`PeriodTracker`, autocorrelation of symbols and gaps).
        fold: Parts per iteration when the answer was folded (a cycle in the split gaps or in the tracker's
            iteration times), else 1.
    """

    period: int | None
    periods: tuple[int, ...]
    iteration_s: FloatArray
    iteration_end_t: FloatArray
    confidence: float = 0.0
    reason: str = ""
    method: str = "tracker"
    fold: int = 1

    @property
    def median_s(self) -> float | None:
        """Median iteration time, or ``None`` when no iteration was found."""
        return float(np.median(self.iteration_s)) if len(self.iteration_s) else None


def infer_iterations(
    t_start: npt.ArrayLike,
    *features: npt.ArrayLike,
    chunk: int = 256,
    buffer: int = 8192,
    min_repeats: int = 4,
    sync: npt.ArrayLike | None = None,
) -> IterationResult:
    """Iterations of a complete call sequence, with the confidence of the answer.

    First the gap split (`split_by_gaps`: iterations separated by gaps far longer than any other, decisive
    from two iterations on, folded when its gaps cycle). Otherwise a `PeriodTracker` runs over the
    calls as the exporter would see them arrive; its iteration times are then checked for a cycle: a
    period that is a fraction of the true one reports parts of iterations, in a repeating pattern. They
    are folded (summed ``cycle`` at a time, the longest part last) when the folded iterations are regular,
    and the answer is refused (confidence below `CONFIDENCE_MIN`) otherwise.

    Args:
        t_start: Call start times in seconds, in call order.
        *features: Integer per-call features (op, communicator, bytes, ...).
        chunk: Calls per update (the exporter's reads arrive in chunks too).
        buffer: Tracker buffer (largest period detectable is ``buffer // min_repeats``).
        min_repeats: Iterations needed before a period is trusted.
        sync: Optional per-call flags: a collective over a group, not a Send/Recv (see
            `PeriodTracker.update`: a period holding one once is not replaced by a multiple of itself).

    Raises:
        InputError: features and times differ in length.
    """
    t = np.asarray(t_start, dtype=np.float64)
    feats = [np.asarray(f, dtype=np.int64) for f in features]
    if any(len(f) != len(t) for f in feats):
        raise InputError("infer_iterations: features and t_start differ in length")
    sy = None if sync is None else np.asarray(sync, dtype=bool).reshape(-1)
    if sy is not None and len(sy) != len(t):
        raise InputError("infer_iterations: sync and t_start differ in length")
    sym = encode_symbols(*feats) if feats and len(t) else None
    split = split_by_gaps(t, sym) if np.isfinite(t).all() else None
    if split is not None and split.confidence >= CONFIDENCE_MIN \
            and (not split.exact or symbols_repeat(sym, split.period)):
        return IterationResult(period=split.period, periods=(split.period,), iteration_s=split.iteration_s,
                               iteration_end_t=t[split.starts[1:]], confidence=split.confidence, method="gaps",
                               fold=split.fold)
    tr = PeriodTracker(buffer=buffer, min_repeats=min_repeats, window=max(1, len(t)))
    periods: list[int] = []
    out_s: list[FloatArray] = []
    out_t: list[FloatArray] = []
    for i in range(0, len(t), chunk):
        v = tr.update(t[i:i + chunk], *(f[i:i + chunk] for f in feats), sync=None if sy is None else sy[i:i + chunk])
        if v.changed and v.period is not None and (not periods or periods[-1] != v.period):
            periods.append(v.period)  # a false alarm (period lost, then the same one found) is no change
        out_s.append(v.iteration_s)
        out_t.append(v.iteration_end_t)
    v = tr.flush()
    if v.changed and v.period is not None and (not periods or periods[-1] != v.period):
        periods.append(v.period)
    out_s.append(v.iteration_s)
    out_t.append(v.iteration_end_t)
    its = np.concatenate(out_s) if out_s else np.empty(0)
    ends = np.concatenate(out_t) if out_t else np.empty(0)
    p = tr.period
    if p is None or len(its) == 0:
        return IterationResult(period=p, periods=tuple(periods), iteration_s=its, iteration_end_t=ends,
                               reason=f"no periodic call pattern found in {len(t)} calls")
    conf = float(v.confidence)
    m = find_cycle(np.log(np.maximum(its, 1e-12))) if len(its) >= 4 else 1
    if m > 1:
        # Parts of iterations: fold m at a time so that each iteration ends with its longest part (the
        # one that holds the optimizer step).
        ph = np.arange(len(its)) % m
        last = int(np.argmax(np.bincount(ph, weights=its, minlength=m) / np.bincount(ph, minlength=m)))
        o = (last + 1) % m
        whole = (len(its) - o) // m
        folded = its[o:o + whole * m].reshape(whole, m).sum(axis=1)
        fends = ends[o:o + whole * m].reshape(whole, m)[:, -1]
        reg = regularity(folded)
        if whole >= 2 and reg >= 0.5:
            return IterationResult(period=p * m, periods=(p * m,), iteration_s=folded, iteration_end_t=fends,
                                   confidence=FOLD_CONFIDENCE * (1.0 if whole >= 3 else 0.8), method="tracker",
                                   fold=m)
        why = "too few whole iterations to check" if whole < 2 else "the folded iterations are irregular"
        return IterationResult(
            period=p, periods=tuple(periods), iteration_s=its, iteration_end_t=ends, confidence=min(conf, 0.2),
            fold=1, reason=f"the iteration times found with period {p} repeat every {m} iterations, so {p} "
            f"calls are a fraction of the iteration; folded to {p * m} calls: {why}")
    reason = ""
    if conf < CONFIDENCE_MIN:
        causes: list[str] = []
        if len(its) < 4:
            causes.append(f"only {len(its)} whole iterations")
        if regularity(its) < 0.5:
            med = float(np.median(its))
            rcv = 1.4826 * float(np.median(np.abs(its - med))) / med
            share = float(its[its > OUTLIER_FACTOR * med].sum() / its.sum())
            causes.append(f"irregular iteration times: MAD / median {rcv:.0%}, {share:.0%} of the time in iterations "
                       f"over {OUTLIER_FACTOR:g}x the median")
        if split is not None and split.period != p:
            causes.append(f"the longest gaps split the calls into iterations of about {split.period} calls")
        reason = f"period {p} explains little of the call timing" + (f" ({'; '.join(causes)})" if causes else "")
    return IterationResult(period=p, periods=tuple(periods), iteration_s=its, iteration_end_t=ends,
                           confidence=conf, reason=reason)

"""Exact S2 mitigation: split a training iteration's micro-batches over data-parallel groups of unequal speed.

What it is for: when one DP group is slow (a fail-slow GPU, a throttled node), giving it fewer micro-batches
and the healthy groups more shortens the iteration without touching the global batch, so the gradient is
unchanged. FALCON solves this S2 step with a cvxpy variance QP rounded to integers (36 s at 512 groups, and
not always optimal after rounding). This module solves the integer problem itself, exactly::

    minimise   max_i  m_i * t_i + c_i
    subject to lower_i <= m_i <= upper_i,  m_i integer,  sum_i m_i = M

where ``t_i`` is group i's measured time per micro-batch and ``c_i >= 0`` a fixed offset (pipeline fill and
drain: a replica running m micro-batches through a pipeline takes about ``(m-1)*b + a = m*b + (a-b)``).
This is scheduling identical jobs on uniform machines that become ready at different times.

Why it is exact, in floating point too: let ``f_i(k) = k*t_i + c_i`` be group i's time with k micro-batches
(the cost of its k-th one), evaluated in IEEE double exactly as `makespan` evaluates a split. Rounding is monotone, so ``f_i`` never
decreases in k. Every feasible split gives each group its ``lower_i`` micro-batches plus, in all, ``R = M -
sum(lower)`` extra ones, a prefix of each group's extra units; its makespan is the larger of ``base = max_i
f_i(lower_i)`` and the dearest extra unit it uses, which is at least V, the R-th smallest extra cost. Taking
the R cheapest extra units (a prefix per group, because costs never decrease along a group) reaches
``max(base, V)``, so it is optimal. V is found without sorting all units: ``A(T)``, the number of extra units
costing at most T, is computed for all groups at once (a floor, then corrected per element against the very
expression ``k*t + c <= T``), and a search on T around the continuous relaxation's optimum narrows (lo, hi]
until it holds at most about 2n units, which are then ranked directly. Among optimal splits the result is
the one the greedy "next micro-batch to the group whose next one finishes first, lower index on ties" builds,
so it is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError

FloatArray = npt.NDArray[np.float64]
Bound = int | Sequence[int] | npt.NDArray[np.integer[Any]]

# Per-element corrections of the floored estimate before falling back to a bisection on k. One step is the
# usual float slip; more only happen when t_i is below the rounding step of c_i (flat costs).
_CORRECTION_ROUNDS: Final = 4
# The search on T stops once this many units (plus 2 per group) are left between lo and hi; ranking them
# directly is cheaper than more passes over all groups.
_SLACK_UNITS: Final = 16
# Keeps every cost and every search point well inside float64, far from overflow.
_MAX_COST: Final = 1e300
# Integer bounds are clamped here (any bound this large means "no limit"): int64 arithmetic stays exact.
_INT_MAX: Final = 2**62


@dataclass(frozen=True)
class Rebalance:
    """An optimal split of the micro-batches and what it achieves.

    Attributes:
        counts: Micro-batches per DP group (sums to the requested total).
        makespan: The slowest group's time with this split, ``max_i counts_i * t_i + c_i``.
        bottleneck: Index of the group that sets the makespan (the lowest one on ties).
        lower_bound: The continuous relaxation's optimum (fractional micro-batches allowed): no split, and no
            other solver, can beat it. The gap to `makespan` is the price of whole micro-batches.
    """

    counts: tuple[int, ...]
    makespan: float
    bottleneck: int
    lower_bound: float

    def to_json(self) -> dict[str, Any]:
        """A plain dict for JSON (the CLI, the remediator's audit)."""
        return {"counts": list(self.counts), "makespan": self.makespan, "bottleneck": self.bottleneck,
                "lower_bound": self.lower_bound}


def rebalance(times: Sequence[float] | FloatArray, total: int, lower: Bound = 1, upper: Bound | None = None,
              *, offsets: float | Sequence[float] | FloatArray | None = None) -> Rebalance:
    """Split `total` micro-batches over DP groups so that the slowest group finishes first (exact optimum).

    Args:
        times: Seconds per micro-batch of each DP group (a straggler has a large one); positive, finite.
        total: Micro-batches in one iteration, M (the global batch; kept exactly).
        lower: Fewest micro-batches per group: one integer for all or one per group (default 1).
        upper: Most micro-batches per group (memory limits): one integer for all, one per group, or None
            for no limit.
        offsets: Fixed seconds added to each group's time (pipeline fill/drain), one for all or one per
            group; non-negative, finite. Default none.

    Returns:
        The optimal split; among optimal splits, the one that favours lower group indices on ties.

    Raises:
        InputError: times or offsets not positive (offsets: not non-negative) and finite, lengths that
            disagree with the number of groups, non-integer total or bounds, a lower bound above its upper
            bound, a total outside ``[sum(lower), sum(upper)]``, or times so large that the makespan would
            leave float64's range.
    """
    t, c = _check_times(times, offsets)
    m = _check_total(total)
    lo, hi = _check_bounds(lower, upper, t.size, m)
    if m * float(t.max()) + float(c.max()) > _MAX_COST:
        raise InputError(f"times too large: {m} micro-batches at {float(t.max())!r} s overflow float64")
    extra = m - int(lo.sum())
    bound = _relaxation(t, c, lo, hi, m)
    counts = lo if extra == 0 else _select(t, c, lo, hi, extra, bound)
    costs = counts * t + c
    worst = int(np.argmax(costs))
    span = float(costs[worst])
    # The relaxation is computed with a few roundings of its own; never let it claim more than is reached.
    return Rebalance(counts=tuple(counts.astype(np.int64).tolist()), makespan=span, bottleneck=worst,
                     lower_bound=min(bound, span))


def makespan(times: Sequence[float] | FloatArray, counts: Sequence[int] | npt.NDArray[np.integer[Any]], *,
             offsets: float | Sequence[float] | FloatArray | None = None) -> float:
    """The slowest group's time, ``max_i counts_i * t_i + c_i``, of any given split.

    For comparing a split in use (say the even one) with `rebalance`'s; it evaluates exactly the expression
    that `rebalance` minimises, so the two are comparable to the last bit.

    Raises:
        InputError: bad times or offsets (as in `rebalance`), or counts that are not non-negative integers
            of the same length.
    """
    t, c = _check_times(times, offsets)
    k = _int_array(counts, "counts", t.size)
    if (k < 0).any():
        raise InputError(f"counts must be non-negative, got {k.tolist()}")
    return float(np.max(k.astype(np.float64) * t + c))


def even_split(groups: int, total: int) -> tuple[int, ...]:
    """The speed-blind split, ``total // groups`` each and one more for the first ``total % groups``.

    What a job runs before any rebalancing; the baseline that `rebalance`'s gain is measured against.

    Raises:
        InputError: groups not a positive integer or total not a non-negative integer.
    """
    if isinstance(groups, bool) or not isinstance(groups, int | np.integer) or groups < 1:
        raise InputError(f"groups must be a positive integer, got {groups!r}")
    q, r = divmod(_check_total(total), int(groups))
    return tuple(q + (i < r) for i in range(int(groups)))


# --- validation ----------------------------------------------------------------------------------------


def _floats(value: object, what: str) -> FloatArray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what} must be numbers, got {value!r}") from exc
    return arr


def _check_times(times: object, offsets: object) -> tuple[FloatArray, FloatArray]:
    t = _floats(times, "times")
    if t.ndim != 1 or t.size == 0:
        raise InputError(f"times must be a non-empty list, one per DP group, got {times!r}")
    if not (np.isfinite(t).all() and (t > 0).all()):
        raise InputError(f"times must be positive and finite, got {t.tolist()}")
    if offsets is None:
        return t, np.zeros_like(t)
    c = _floats(offsets, "offsets")
    if c.ndim == 0:
        c = np.full_like(t, float(c))
    if c.shape != t.shape:
        raise InputError(f"offsets has {c.size} values for {t.size} groups")
    if not (np.isfinite(c).all() and (c >= 0).all()):
        raise InputError(f"offsets must be non-negative and finite, got {c.tolist()}")
    return t, c


def _check_total(total: object) -> int:
    if isinstance(total, bool) or not isinstance(total, int | np.integer):
        raise InputError(f"total must be an integer number of micro-batches, got {total!r}")
    if total < 0:
        raise InputError(f"total must be non-negative, got {total}")
    if total > 2**53:  # counts take part in float arithmetic, which is exact for integers up to here
        raise InputError(f"total {total} is too large (at most 2**53 micro-batches)")
    return int(total)


def _int_array(value: object, what: str, n: int) -> npt.NDArray[np.int64]:
    if isinstance(value, bool):  # an int subclass, but `lower=True` is a bug, not a bound
        raise InputError(f"{what} must be integers, got {value!r}")
    if isinstance(value, int | np.integer):
        return np.full(n, min(max(int(value), -_INT_MAX), _INT_MAX), dtype=np.int64)
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what} must be integers, got {value!r}") from exc
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise InputError(f"{what} must be one integer or one per group, got {value!r}")
    if arr.size != n:
        raise InputError(f"{what} has {arr.size} values for {n} groups")
    # uint64 beyond int64 would wrap; such a bound means "no limit" anyway.
    out: npt.NDArray[np.int64] = np.minimum(arr, _INT_MAX).astype(np.int64)
    return out


def _check_bounds(lower: object, upper: object, n: int, total: int) -> tuple[FloatArray, FloatArray]:
    lo = _int_array(lower, "lower", n)
    if (lo < 0).any():
        raise InputError(f"lower must be non-negative, got {lo.tolist()}")
    if (lo > total).any() or int(lo.sum()) > total:
        raise InputError(f"total {total} is too small for the lower bounds (sum {int(lo.sum())})")
    # No group can take more than what the others' lower bounds leave: this also makes "unbounded" finite.
    room = total - int(lo.sum()) + lo
    if upper is None:
        hi = room
    else:
        up = _int_array(upper, "upper", n)
        bad = np.flatnonzero(up < lo)
        if bad.size:
            i = int(bad[0])
            raise InputError(f"upper bound {int(up[i])} of group {i} is below its lower bound {int(lo[i])}")
        # Capped at the total before summing so that huge "no limit" bounds cannot overflow the sum.
        reach = int(np.minimum(up, total).sum())
        if reach < total:
            raise InputError(f"total {total} is too large for the upper bounds (sum {reach})")
        hi = np.minimum(up, room)
    # Float copies: counts stay exact integers below 2**53 and take part in the cost arithmetic directly.
    return lo.astype(np.float64), hi.astype(np.float64)


# --- solver --------------------------------------------------------------------------------------------


def _relaxation(t: FloatArray, c: FloatArray, lo: FloatArray, hi: FloatArray, total: int) -> float:
    """Optimum of the continuous problem: the smallest T >= max f_i(lower_i) with sum clip((T-c)/t) >= M."""
    base = float(np.max(lo * t + c))
    # In units of the slowest group's time, so that 1/t stays finite even for absurdly small times.
    unit = float(t.max())
    tu, cu = t / unit, c / unit
    # S(T) = sum_i clip((T - c_i)/t_i, lo_i, hi_i) is piecewise linear: group i starts growing at c_i+lo_i*t_i
    # and stops at c_i+hi_i*t_i. Sweep the breakpoints in order, tracking S and its slope.
    x = np.concatenate((cu + lo * tu, cu + hi * tu))
    with np.errstate(all="ignore"):
        dslope = np.concatenate((1.0 / tu, -1.0 / tu))
        order = np.argsort(x, kind="stable")
        xs, slope = x[order], np.cumsum(dslope[order])
        s = float(lo.sum()) + np.concatenate(([0.0], np.cumsum(slope[:-1] * np.diff(xs))))
    reached = np.flatnonzero(s >= total)
    if reached.size == 0:  # by rounding (sum(hi) >= M holds exactly) or overflow: the top is still a bound
        root = float(xs[-1])
    elif reached[0] == 0:
        root = float(xs[0])
    else:
        j = int(reached[0])
        root = min(float(xs[j - 1]) + (total - float(s[j - 1])) / float(slope[j - 1]), float(xs[j]))
    bound = root * unit
    # Only overflow in the sweep can get here unfinished; the lower bounds' makespan is a bound too.
    return max(base, bound) if math.isfinite(bound) else base


def _caps(T: float, t: FloatArray, c: FloatArray, lo: FloatArray, hi: FloatArray) -> FloatArray:
    """Per group, the most micro-batches k in [lo, hi] with ``k*t + c <= T`` (lo when none qualifies)."""
    with np.errstate(over="ignore"):  # (T - c)/t may overflow for tiny t; the clip below takes care of it
        k = np.clip(np.floor((T - c) / t), lo, hi)
    # The division and the floor can slip by a unit against the float cost itself; settle every element on
    # the exact test so that the count agrees with `makespan` to the last bit.
    for _ in range(_CORRECTION_ROUNDS):
        up = (k < hi) & ((k + 1.0) * t + c <= T)
        down = (k > lo) & (k * t + c > T)
        if not (up.any() or down.any()):
            return k
        k[up] += 1.0
        k[down] -= 1.0
    return _caps_bisect(T, t, c, lo, hi)


def _caps_bisect(T: float, t: FloatArray, c: FloatArray, lo: FloatArray, hi: FloatArray) -> FloatArray:
    """`_caps` by bisection on k, for costs so flat (t far below c's rounding step) that the floor misleads."""
    # Invariant: the answer lies in [a, b); a qualifies or is lo, b fails or is hi + 1.
    a, b = lo.copy(), hi + 1.0
    while True:
        open_ = b - a > 1.0
        if not open_.any():
            return a
        mid = np.floor((a + b) * 0.5)
        ok = mid * t + c <= T
        a = np.where(open_ & ok, mid, a)
        b = np.where(open_ & ~ok, mid, b)


def _select(t: FloatArray, c: FloatArray, lo: FloatArray, hi: FloatArray, extra: int,
            bound: float) -> FloatArray:
    """Counts that give every group its lower bound plus the `extra` cheapest further micro-batches."""
    n = t.size

    def count(T: float) -> tuple[FloatArray, int]:
        g = _caps(T, t, c, lo, hi)
        return g, int((g - lo).sum())

    # Bracket V, the extra-th cheapest unit's cost: A(t_lo) < extra <= A(t_hi). The continuous optimum sits
    # within about one micro-batch of every group's share of V, so start a couple of harmonic-mean times
    # either side and widen by doubling if rounding or bounds say otherwise. The far ends always work: no
    # unit costs less than 0 (so A(-1) = 0) and none more than the dearest cap.
    with np.errstate(over="ignore", divide="ignore"):
        step = 2.0 * n / float(np.sum(1.0 / t))
    if not step > 0.0:  # subnormal times overflow 1/t; any positive start width still gets there by doubling
        step = float(np.spacing(max(abs(bound), 1.0)))
    top = float(np.max(hi * t + c))
    width = step
    t_hi = min(bound + width, top)
    g_hi, a_hi = count(t_hi)
    while a_hi < extra:
        width *= 2.0
        t_hi = min(bound + width, top)
        g_hi, a_hi = count(t_hi)
    width = step
    t_lo = max(bound - width, -1.0)
    g_lo, a_lo = count(t_lo)
    while a_lo >= extra:
        width *= 2.0
        t_lo = max(bound - width, -1.0)
        g_lo, a_lo = count(t_lo)

    while a_hi - a_lo > 2 * n + _SLACK_UNITS:
        mid = t_lo + (t_hi - t_lo) * 0.5
        if not t_lo < mid < t_hi:
            # Adjacent floats: every unit left in (t_lo, t_hi] costs exactly t_hi. Hand them out in group
            # order, which is where the ranking below would put them too.
            tied = g_hi - g_lo
            before = np.cumsum(tied) - tied
            return g_lo + np.clip((extra - a_lo) - before, 0.0, tied)
        g, a = count(mid)
        if a >= extra:
            t_hi, g_hi, a_hi = mid, g, a
        else:
            t_lo, g_lo, a_lo = mid, g, a

    # Rank the few units in (t_lo, t_hi] by (cost, group); lexsort is stable, so a group's units stay in
    # order and what is taken from each group is a prefix.
    d = (g_hi - g_lo).astype(np.int64)
    group = np.repeat(np.arange(n), d)
    first = np.cumsum(d) - d
    k = g_lo[group] + 1.0 + (np.arange(group.size) - first[group])
    cost = k * t[group] + c[group]
    taken = np.lexsort((group, cost))[: extra - a_lo]
    return g_lo + np.bincount(group[taken], minlength=n)


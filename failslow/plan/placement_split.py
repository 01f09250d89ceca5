"""Every placement under its own best micro-batch split, for many placements at once (pure).

With ``rebalance`` the S3 planner scores each placement under its best split of the same total ``M``
(:mod:`failslow.plan.placement`, "Moves that pay with a rebalance"). :func:`min_makespan` is that score for
all placements together: a search on the makespan ``T`` whose result is the value
:func:`failslow.plan.microbatch.rebalance` reaches to the last bit. The placement model
(:class:`failslow.plan.placement_model.PlacementModel`) scores with it.
"""

from __future__ import annotations

import numpy as np

from failslow.plan.placement_params import FloatArray


def _fits(T: FloatArray, t: FloatArray, o: FloatArray, cap: FloatArray) -> FloatArray:
    """Per row and replica, the most micro-batches k in [1, cap] with ``k * t + o <= T`` (T: one per row;
    1 where none fits), settled on that very expression so that it agrees with the exact solver."""
    col = T[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        k = np.clip(np.floor((col - o) / t), 1.0, cap)
    for _ in range(8):
        up = (k < cap) & ((k + 1.0) * t + o <= col)
        down = (k > 1.0) & (k * t + o > col)
        if not (up.any() or down.any()):
            break
        k = k + up - down
    return np.asarray(k, dtype=np.float64)


def min_makespan(times: FloatArray, offsets: FloatArray, total: int, cap: FloatArray | None = None) -> FloatArray:
    """``min over integer splits`` of ``max_d (m_d * times[:, d] + offsets[:, d])`` for every row at once.

    Each row is one placement's replicas; a split has ``1 <= m_d <= cap[d]`` and ``sum_d m_d = total``
    (``cap`` defaults to ``total - dp + 1``, i.e. no limit). The optimum is the smallest ``T`` at least every
    replica's first micro-batch, ``max_d (t_d + o_d)``, at which ``A(T) = sum_d clip(floor((T - o_d) / t_d),
    1, cap_d)`` reaches ``total`` (take the cheapest micro-batches; a replica's costs only grow). Searched on
    ``T`` with the bracket ``A(lo) < total <= A(hi)`` for all rows together: each pass halves the bracket and
    also tries the cheapest micro-batch above ``lo``; when that one already reaches ``total`` it is the exact
    optimum (a value ``k * t_d + o_d`` evaluated as :func:`failslow.plan.microbatch.rebalance` evaluates it),
    otherwise ``lo`` moves past it. So every pass passes at least one micro-batch, and the search ends within
    ``total`` passes, usually far fewer.

    Args:
        times: ``t_d`` per row and replica, shape (K, dp), positive.
        offsets: ``o_d``, the same shape, >= 0.
        total: ``M``, at least dp.
        cap: Most micro-batches per replica (dp,), each at least 1, their sum at least `total`.

    Returns:
        The optimal makespan of each row, shape (K,).
    """
    t = np.asarray(times, dtype=np.float64)
    o = np.asarray(offsets, dtype=np.float64)
    n = t.shape[1]
    hi_k = np.full(n, float(total - n + 1)) if cap is None else np.asarray(cap, dtype=np.float64)
    out = (t + o).max(axis=1)  # every replica takes one: a lower bound, optimal when it already reaches M
    lo = out.copy()
    k_lo = _fits(lo, t, o, hi_k)
    idx = np.flatnonzero(k_lo.sum(axis=1) < total)
    lo, k_lo, tt, oo = lo[idx], k_lo[idx], t[idx], o[idx]
    hi = (hi_k * tt + oo).max(axis=1)  # everything fits
    while idx.size:
        # the cheapest micro-batch above lo: if taking it reaches M, it is the optimum
        nxt = np.where(k_lo < hi_k, (k_lo + 1.0) * tt + oo, np.inf).min(axis=1)
        k_nxt = _fits(nxt, tt, oo, hi_k)
        done = k_nxt.sum(axis=1) >= total
        out[idx[done]] = nxt[done]
        keep = ~done
        idx, lo, hi, tt, oo = idx[keep], nxt[keep], hi[keep], tt[keep], oo[keep]
        k_lo = k_nxt[keep]
        if not idx.size:
            break
        mid = lo + (hi - lo) * 0.5
        k_mid = _fits(mid, tt, oo, hi_k)
        ok = k_mid.sum(axis=1) >= total
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
        k_lo = np.where(ok[:, None], k_lo, k_mid)
    return np.asarray(out, dtype=np.float64)

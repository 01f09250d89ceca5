"""The exact S2 solver (`failslow.plan.rebalance`) against brute force, a greedy reference and cvxpy.

Optimality is checked to the last bit: the makespan the returned counts achieve, evaluated with the same float
expression (``m * t + c``, then the max), must equal the brute-force optimum exactly. cvxpy is the peer on larger
instances: an integer program solved by HiGHS (must agree) and FALCON's variance QP, rounded (must never win,
and does lose on some instances).
"""

from __future__ import annotations

import heapq
import json
import subprocess
from collections.abc import Iterator

import numpy as np
import pytest

import failslow.plan
from failslow.errors import InputError
from failslow.plan.microbatch import Rebalance, even_split, makespan, rebalance

# --- references ----------------------------------------------------------------------------------------


def span(t: list[float], m: list[int], c: list[float]) -> float:
    """A split's makespan in plain Python floats: the expression the solver is held to."""
    return max(mi * ti + ci for mi, ti, ci in zip(m, t, c, strict=True))


def splits(total: int, lo: list[int], hi: list[int]) -> Iterator[list[int]]:
    """Every integer split of `total` with lo <= m <= hi."""
    if len(lo) == 1:
        if lo[0] <= total <= hi[0]:
            yield [total]
        return
    rest_lo = sum(lo[1:])
    for k in range(lo[0], min(hi[0], total - rest_lo) + 1):
        for tail in splits(total - k, lo[1:], hi[1:]):
            yield [k, *tail]


def brute(t: list[float], total: int, lo: list[int], hi: list[int], c: list[float]) -> float:
    return min(span(t, m, c) for m in splits(total, lo, hi))


def greedy(t: list[float], total: int, lo: list[int], hi: list[int] | None, c: list[float]) -> list[int]:
    """Next micro-batch to the group whose next one finishes first, lower index on ties (O(M log n))."""
    m = list(lo)
    heap = [((m[i] + 1) * t[i] + c[i], i) for i in range(len(t)) if hi is None or m[i] < hi[i]]
    heapq.heapify(heap)
    for _ in range(total - sum(lo)):
        _, i = heapq.heappop(heap)
        m[i] += 1
        if hi is None or m[i] < hi[i]:
            heapq.heappush(heap, ((m[i] + 1) * t[i] + c[i], i))
    return m


def random_case(rng: np.random.Generator, n: int, total_max: int) -> tuple[list[float], int, list[int], list[int] | None,
                                                                            list[float] | None]:
    """Times from one of several families (ties, stragglers, flat costs), random bounds and offsets."""
    kind = rng.integers(5)
    if kind == 0:
        t = rng.uniform(0.05, 2.0, n)
    elif kind == 1:  # many exact ties
        t = rng.choice([0.1, 0.2, 0.3, 0.5, 1.0], n)
    elif kind == 2:  # healthy groups and a few stragglers
        t = rng.lognormal(0.0, 0.05, n) * np.where(rng.random(n) < 0.25, rng.uniform(1.5, 10.0, n), 1.0)
    elif kind == 3:  # integers: ties between different groups' units
        t = rng.integers(1, 5, n).astype(float)
    else:  # per-unit time below the offset's rounding step: flat costs
        t = rng.choice([1e-11, 3e-11, 1e-10], n)
    lo = [int(x) for x in rng.integers(0, 3, n)] if rng.random() < 0.5 else [1] * n
    hi = [lo[i] + int(rng.integers(0, total_max)) for i in range(n)] if rng.random() < 0.5 else None
    if kind == 4:
        c = [1e6] * n if rng.random() < 0.5 else [float(x) for x in rng.choice([1e6, 2e6], n)]
    elif rng.random() < 0.5:
        c = [float(x) for x in (rng.uniform(0.0, 2.0, n) if rng.random() < 0.5 else rng.choice([0.0, 0.5, 1.0], n))]
    else:
        c = None
    reach = sum(hi) if hi is not None else sum(lo) + total_max
    total = int(rng.integers(sum(lo), max(sum(lo), min(reach, total_max)) + 1))
    return [float(x) for x in t], total, lo, hi, c


def check_feasible(r: Rebalance, total: int, lo: list[int], hi: list[int] | None) -> None:
    assert sum(r.counts) == total
    assert all(k >= low for k, low in zip(r.counts, lo, strict=True))
    if hi is not None:
        assert all(k <= up for k, up in zip(r.counts, hi, strict=True))


# --- optimality ----------------------------------------------------------------------------------------


def test_brute_force_small_cases() -> None:
    rng = np.random.default_rng(20240501)
    cases = 0
    for _ in range(3000):
        n = int(rng.integers(1, 5))
        t, total, lo, hi, c = random_case(rng, n, 12)
        cc = c if c is not None else [0.0] * n
        r = rebalance(t, total, lo, hi, offsets=c)
        check_feasible(r, total, lo, hi)
        best = brute(t, total, lo, hi if hi is not None else [total] * n, cc)
        achieved = span(t, list(r.counts), cc)
        assert achieved == best, (t, total, lo, hi, c, r)
        assert r.makespan == achieved == makespan(t, r.counts, offsets=c)
        assert list(r.counts) == greedy(t, total, lo, hi, cc)
        assert r.lower_bound <= r.makespan
        assert r.counts[r.bottleneck] * t[r.bottleneck] + cc[r.bottleneck] == r.makespan
        cases += 1
    assert cases == 3000


@pytest.mark.parametrize("slack, rounds", [(-10**9, 4), (16, 0)], ids=["search-to-adjacent-floats", "k-bisection"])
def test_rare_paths_brute_force(monkeypatch: pytest.MonkeyPatch, slack: int, rounds: int) -> None:
    # Small cases normally finish by ranking the few units left; force the other two exits instead: the search
    # on T run down to adjacent floats (ties handed out in group order), and the per-group count found by
    # bisection on k rather than by the corrected floor.
    import failslow.plan.microbatch as mb

    monkeypatch.setattr(mb, "_SLACK_UNITS", slack)
    monkeypatch.setattr(mb, "_CORRECTION_ROUNDS", rounds)
    rng = np.random.default_rng(17)
    for _ in range(600):
        n = int(rng.integers(1, 5))
        t, total, lo, hi, c = random_case(rng, n, 12)
        cc = c if c is not None else [0.0] * n
        r = mb.rebalance(t, total, lo, hi, offsets=c)
        check_feasible(r, total, lo, hi)
        assert span(t, list(r.counts), cc) == brute(t, total, lo, hi if hi is not None else [total] * n, cc)
        assert list(r.counts) == greedy(t, total, lo, hi, cc)


def test_default_bounds_brute_force() -> None:
    # The plain call (lower 1, no upper, no offsets), as the remediator makes it.
    rng = np.random.default_rng(7)
    for _ in range(1000):
        n = int(rng.integers(1, 5))
        t = [float(x) for x in rng.uniform(0.05, 3.0, n)]
        total = int(rng.integers(n, 13))
        r = rebalance(t, total)
        assert span(t, list(r.counts), [0.0] * n) == brute(t, total, [1] * n, [total] * n, [0.0] * n)


def test_matches_greedy_counts_exactly() -> None:
    # Among optimal splits the solver returns the greedy's (lower index on ties): deterministic counts.
    rng = np.random.default_rng(11)
    for _ in range(300):
        n = int(rng.integers(1, 200))
        t, total, lo, hi, c = random_case(rng, n, 12 * n)
        cc = c if c is not None else [0.0] * n
        r = rebalance(t, total, lo, hi, offsets=c)
        assert list(r.counts) == greedy(t, total, lo, hi, cc), (n, total)


def test_large_instance_matches_greedy() -> None:
    rng = np.random.default_rng(3)
    n, total = 4096, 32768
    t = rng.lognormal(0.0, 0.05, n) * np.where(rng.random(n) < 0.05, 3.0, 1.0)
    c = rng.uniform(0.0, 0.5, n)
    r = rebalance(t, total, offsets=c)
    assert list(r.counts) == greedy([float(x) for x in t], total, [1] * n, None, [float(x) for x in c])


def test_ties_prefer_lower_index_and_examples() -> None:
    assert rebalance([1.0, 1.0], 3).counts == (2, 1)
    assert rebalance([1.0, 1.0, 1.0], 4).counts == (2, 1, 1)
    # The classic case: a 2.5x straggler among two healthy groups.
    r = rebalance([0.2, 0.2, 0.5], 32)
    assert r.counts == (14, 13, 5) and r.makespan == 14 * 0.2 and r.bottleneck == 0
    # Offsets shift work away from the group that starts late.
    assert rebalance([1.0, 1.0], 10, offsets=[0.0, 4.0]).counts == (7, 3)
    # A group already at its lower bound sets the makespan.
    r = rebalance([1.0, 1.0], 6, lower=[1, 5])
    assert r.counts == (1, 5) and r.makespan == 5.0 and r.bottleneck == 1
    # Upper bounds are honoured even when the fast group could take more.
    assert rebalance([0.1, 1.0], 10, upper=[6, 10]).counts == (6, 4)
    # Flat costs (t far below the offset's rounding step): every split costs the same; lowest index first.
    assert rebalance([1e-11] * 3, 12, offsets=1e6).makespan == 1e6


def test_package_exports() -> None:
    assert failslow.plan.rebalance is rebalance
    assert failslow.plan.Rebalance is Rebalance


def test_even_split_and_makespan() -> None:
    assert even_split(3, 32) == (11, 11, 10)
    assert even_split(4, 0) == (0, 0, 0, 0)
    assert makespan([0.2, 0.2, 0.5], (11, 11, 10)) == 5.0
    assert makespan([1.0, 2.0], [1, 1], offsets=[3.0, 0.0]) == 4.0
    assert makespan([1.0, 2.0], np.array([2, 1])) == 2.0


# --- cvxpy peers ---------------------------------------------------------------------------------------


def milp(t: np.ndarray, total: int, lo: np.ndarray, hi: np.ndarray | None, c: np.ndarray,
         integer: bool = True) -> tuple[np.ndarray, float]:
    """minimise z s.t. m_i t_i + c_i <= z, bounds, sum m = M (HiGHS through cvxpy; LP when not integer)."""
    import cvxpy as cp

    m = cp.Variable(t.size, integer=integer)
    z = cp.Variable()
    cons = [cp.multiply(m, t) + c <= z, m >= lo, cp.sum(m) == total]
    if hi is not None:
        cons.append(m <= hi)
    prob = cp.Problem(cp.Minimize(z), cons)
    prob.solve(solver="HIGHS", mip_rel_gap=0.0, mip_abs_gap=0.0)
    assert prob.status == "optimal"
    return np.asarray(m.value), float(prob.value)


def variance_qp(t: np.ndarray, total: int, lo: np.ndarray, hi: np.ndarray | None, c: np.ndarray) -> list[int]:
    """FALCON's S2: minimise the variance of the groups' times, continuous, then round keeping the sum."""
    import cvxpy as cp

    n = t.size
    m = cp.Variable(n)
    x = cp.multiply(m, t) + c
    cons = [m >= lo, cp.sum(m) == total]
    if hi is not None:
        cons.append(m <= hi)
    cp.Problem(cp.Minimize(cp.sum_squares(x - cp.sum(x) / n)), cons).solve(solver="CLARABEL")
    v = np.clip(np.asarray(m.value), lo, hi if hi is not None else np.inf)
    # Largest-remainder rounding: floors, then one more to the largest fractional parts until the sum is M.
    base = np.maximum(np.floor(v + 1e-9), lo).astype(int)
    frac = v - base
    if hi is not None:
        frac = np.where(base < hi, frac, -np.inf)
    for i in np.argsort(-frac, kind="stable")[: total - int(base.sum())]:
        base[i] += 1
    return [int(k) for k in base]


def test_milp_agrees_on_larger_cases() -> None:
    pytest.importorskip("cvxpy")
    rng = np.random.default_rng(5)
    for trial in range(24):
        n = int(rng.integers(4, 65))
        t, total, lo, hi, c = random_case(rng, n, 8 * n)
        if trial % 4 == 0:  # the remediator's plain case
            lo, hi, c = [1] * n, None, None
            total = 8 * n
        ta, loa = np.array(t), np.array(lo, dtype=float)
        hia = np.array(hi, dtype=float) if hi is not None else None
        ca = np.array(c) if c is not None else np.zeros(n)
        r = rebalance(t, total, lo, hi, offsets=c)
        check_feasible(r, total, lo, hi)
        m, value = milp(ta, total, loa, hia, ca)
        mi = [int(k) for k in np.rint(m)]
        # Ours is optimal, so the MILP's integer split can never beat it (exactly, same float expression);
        # the MILP's optimum agrees to its feasibility tolerance.
        if sum(mi) == total and all(k >= low for k, low in zip(mi, lo, strict=True)):
            assert r.makespan <= span(t, mi, list(ca))
        assert r.makespan == pytest.approx(value, rel=1e-7, abs=1e-7)
        # The lower bound is the LP relaxation's optimum.
        _, lp = milp(ta, total, loa, hia, ca, integer=False)
        assert r.lower_bound == pytest.approx(lp, rel=1e-7, abs=1e-7)


def test_falcon_variance_qp_is_not_always_optimal() -> None:
    pytest.importorskip("cvxpy")
    rng = np.random.default_rng(9)
    worse = 0
    for trial in range(30):
        n = int(rng.integers(3, 49))
        t = rng.lognormal(0.0, 0.05, n) * np.where(rng.random(n) < 0.2, rng.uniform(1.5, 4.0, n), 1.0)
        total = 4 * n if trial % 2 else 8 * n
        lo = np.ones(n)
        c = np.zeros(n)
        r = rebalance(t, total)
        q = variance_qp(t, total, lo, None, c)
        assert sum(q) == total and min(q) >= 1
        qspan = span([float(x) for x in t], q, [0.0] * n)
        assert r.makespan <= qspan  # never beaten
        worse += qspan > r.makespan
    assert worse >= 1  # and beaten on some instances: the QP is a peer, not the engine
    # By hand: equal times need m = (6.35, 1.65), which rounds to (6, 2) and 4.6 s; (7, 1) takes 4.2 s.
    q = variance_qp(np.array([0.6, 2.3]), 8, np.ones(2), None, np.zeros(2))
    assert q == [6, 2] and rebalance([0.6, 2.3], 8).counts == (7, 1)
    assert span([0.6, 2.3], q, [0.0, 0.0]) == 4.6 > rebalance([0.6, 2.3], 8).makespan == 4.2


# --- bad input -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    ({"times": [], "total": 4}, "non-empty"),
    ({"times": [0.1, 0.0], "total": 4}, "positive and finite"),
    ({"times": [0.1, -1.0], "total": 4}, "positive and finite"),
    ({"times": [0.1, float("nan")], "total": 4}, "positive and finite"),
    ({"times": [0.1, float("inf")], "total": 4}, "positive and finite"),
    ({"times": [[0.1, 0.2]], "total": 4}, "non-empty list"),
    ({"times": ["a", 0.2], "total": 4}, "numbers"),
    ({"times": [0.1, 0.2], "total": 4.0}, "integer"),
    ({"times": [0.1, 0.2], "total": 4.5}, "integer"),
    ({"times": [0.1, 0.2], "total": True}, "integer"),
    ({"times": [0.1, 0.2], "total": "4"}, "integer"),
    ({"times": [0.1, 0.2], "total": -1}, "non-negative"),
    ({"times": [0.1, 0.2], "total": 1}, "too small"),
    ({"times": [0.1, 0.2], "total": 4, "lower": [1, 2, 3]}, "3 values for 2 groups"),
    ({"times": [0.1, 0.2], "total": 4, "lower": [1.5, 1]}, "integer"),
    ({"times": [0.1, 0.2], "total": 4, "lower": -1}, "non-negative"),
    ({"times": [0.1, 0.2], "total": 4, "lower": [3, 2]}, "too small"),
    ({"times": [0.1, 0.2], "total": 9, "upper": 4}, "too large"),
    ({"times": [0.1, 0.2], "total": 4, "upper": [2, 0]}, "below its lower bound"),
    ({"times": [0.1, 0.2], "total": 4, "upper": [3]}, "1 values for 2 groups"),
    ({"times": [0.1, 0.2], "total": 4, "offsets": [0.0]}, "1 values for 2 groups"),
    ({"times": [0.1, 0.2], "total": 4, "offsets": [0.0, -1.0]}, "non-negative and finite"),
    ({"times": [0.1, 0.2], "total": 4, "offsets": [0.0, float("inf")]}, "non-negative and finite"),
    ({"times": [1e300, 0.2], "total": 4}, "too large"),
])
def test_bad_input(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message):
        rebalance(**kwargs)  # type: ignore[arg-type]


def test_bad_makespan_and_even_input() -> None:
    with pytest.raises(InputError, match="3 values for 2 groups"):
        makespan([0.1, 0.2], [1, 2, 3])
    with pytest.raises(InputError, match="non-negative"):
        makespan([0.1, 0.2], [1, -2])
    with pytest.raises(InputError, match="positive integer"):
        even_split(0, 4)


def test_edge_cases() -> None:
    assert rebalance([0.5], 7).counts == (7,)
    assert rebalance([0.5, 0.1], 0, lower=0).counts == (0, 0)
    assert rebalance([0.5, 0.1], 0, lower=0, offsets=[1.0, 2.0]).makespan == 2.0
    # Bounds given as numpy arrays and huge "no limit" upper bounds.
    r = rebalance(np.array([1.0, 2.0]), 6, lower=np.array([1, 1]), upper=np.array([2**63 - 1, 10], dtype=np.uint64))
    assert r.counts == (4, 2)
    assert rebalance([1.0, 2.0], 6, upper=10**30).counts == (4, 2)
    # Extreme magnitudes: subnormal and huge (but representable) times.
    assert rebalance([5e-324, 1.0], 4).counts == (3, 1)
    assert rebalance([1e290, 3e290], 8).counts == (6, 2)


# --- CLI -----------------------------------------------------------------------------------------------


def test_cli_rebalance(failslow_cmd: list[str]) -> None:
    out = subprocess.run([*failslow_cmd, "plan", "rebalance", "--times", "0.2,0.2,0.5", "--total", "32"],
                         capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    assert doc["counts"] == [14, 13, 5]
    assert doc["makespan"] == 14 * 0.2
    assert doc["even"] == {"counts": [11, 11, 10], "makespan": 5.0}
    assert doc["speedup"] == pytest.approx(5.0 / 2.8)
    assert doc["moved"] == 5 and doc["bottleneck"] == 0 and doc["lower_bound"] <= doc["makespan"]


def test_cli_bounds_and_offsets(failslow_cmd: list[str]) -> None:
    out = subprocess.run([*failslow_cmd, "plan", "rebalance", "--times", "0.2,0.3,0.5", "--total", "20",
                          "--lower", "1,1,2", "--upper", "10", "--offsets", "0.1"],
                         capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    assert doc["counts"] == list(rebalance([0.2, 0.3, 0.5], 20, [1, 1, 2], 10, offsets=0.1).counts)
    assert sum(doc["counts"]) == 20 and max(doc["counts"]) <= 10 and doc["counts"][2] >= 2


@pytest.mark.parametrize("args, message", [
    (["--times", "0.2,0.5", "--total", "1"], "too small"),
    (["--times", "0.2,x", "--total", "4"], "bad --times"),
    (["--times", "0.2,-0.5", "--total", "4"], "positive and finite"),
    (["--times", "0.2,0.5", "--total", "4", "--lower", "1,1,1"], "3 values for 2 groups"),
    (["--times", "0.2,0.5", "--total", "4", "--upper", "1.5"], "bad --upper"),
    (["--times", "0.2,0.5", "--total", "9", "--upper", "4"], "too large"),
    (["--times", "0.2,0.5", "--total", "4", "--offsets", "-1"], "non-negative"),
])
def test_cli_bad_input(failslow_cmd: list[str], args: list[str], message: str) -> None:
    out = subprocess.run([*failslow_cmd, "plan", "rebalance", *args], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.startswith("failslow plan: ") and message in out.stderr
    assert out.stdout == ""

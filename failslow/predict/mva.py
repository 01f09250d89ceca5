"""Mean value analysis of closed multi-class queueing networks.

Used for asynchronous SGD with a parameter server: every worker is one class with a population of one
job (its current step) that cycles through its own compute (a delay), the server's downlink, the
server's uplink and the server's CPU. Two solvers:

* `mva_exact` — exact MVA over all population vectors. With one job per class that is the 2^K subsets
  of workers, so it is meant for K up to about a dozen (vectorised over classes with numpy).
* `mva_schweitzer` — the Bard–Schweitzer fixed point (Q_c(n − e_k) ≈ Q_c(n)·(n_c − δ_ck)/n_c), any K.

Queueing stations are processor sharing (``"ps"``, insensitive to the service-time distribution) or
first-come-first-served (``"fcfs"``) with a service-time squared coefficient of variation ``cv2``:
for FCFS we use Reiser's residual-life correction, R_k = D_k + Σ_c D_c (Q_c − U_c) + Σ_c U_c D_c (1+cv²)/2
(evaluated at n − e_k), which is exact MVA for cv² = 1 and models deterministic transfers for cv² = 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError

FloatArray = npt.NDArray[np.float64]
StationKind = Literal["ps", "fcfs"]


@dataclass(frozen=True)
class Station:
    """A queueing station: per-class service demand (seconds per cycle) and its discipline."""

    name: str
    demand: FloatArray  # shape (K,)
    kind: StationKind = "ps"
    cv2: float = 1.0


@dataclass(frozen=True)
class MVAResult:
    """Steady-state solution of the closed network at the full population (one job per class)."""

    throughput: FloatArray  # cycles per second, per class
    response: FloatArray  # seconds per visit, shape (stations, K)
    utilisation: FloatArray  # per station (sum over classes)
    queue: FloatArray  # mean jobs per station, shape (stations, K)
    exact: bool
    iterations: int = 0


def _check(stations: list[Station], delay: FloatArray) -> tuple[FloatArray, int]:
    k = delay.shape[0]
    if k == 0:
        raise InputError("MVA needs at least one class")
    if np.any(delay < 0) or not np.all(np.isfinite(delay)):
        raise InputError("MVA delays must be finite and non-negative")
    d = np.zeros((len(stations), k))
    for i, st in enumerate(stations):
        if st.demand.shape != (k,):
            raise InputError(f"station {st.name!r}: demand has shape {st.demand.shape}, expected ({k},)")
        if np.any(st.demand < 0) or not np.all(np.isfinite(st.demand)):
            raise InputError(f"station {st.name!r}: demands must be finite and non-negative")
        if st.kind not in ("ps", "fcfs"):
            raise InputError(f"station {st.name!r}: kind must be 'ps' or 'fcfs', got {st.kind!r}")
        d[i] = st.demand
    if np.all(d.sum(axis=0) + delay <= 0):
        raise InputError("MVA: every class has zero total demand")
    return d, k


def _response(d: FloatArray, fcfs: npt.NDArray[np.bool_], cv2: FloatArray, q_minus: FloatArray,
              qd_minus: FloatArray, ud_minus: FloatArray) -> FloatArray:
    """Per-station response of every class given what it sees on arrival (totals at n − e_k).

    q_minus: jobs present; qd_minus: Σ_c Q_c D_c (work queued); ud_minus: Σ_c U_c D_c (work of the job
    in service, before the residual factor). All of shape (stations, classes).
    """
    ps = d * (1.0 + q_minus)
    # Reiser: the job in service has a residual (1+cv²)/2·D instead of a full D.
    fc = d + (qd_minus - ud_minus) + ud_minus * (1.0 + cv2[:, None]) * 0.5
    return np.where(fcfs[:, None], fc, ps)


def _clamp(d: FloatArray, x: FloatArray) -> FloatArray:
    """Scale throughputs so no station is more than 100% busy.

    Reiser's residual correction with cv² < 1 can overshoot a saturated station's capacity; the
    asymptotic bound Σ_c X_c D_sc ≤ 1 is exact, so we enforce it.
    """
    u = (d * x).sum(axis=1)
    top = float(u.max()) if u.size else 0.0
    return x / top if top > 1.0 else x


def mva_exact(stations: list[Station], delay: FloatArray) -> MVAResult:
    """Exact MVA with one job per class (2^K population vectors).

    For FCFS stations with unequal per-class demands the residual correction uses the mean demand of
    the classes present, the usual heuristic; with equal demands it is the textbook recursion.

    Args:
        stations: queueing stations with per-class demands.
        delay: per-class pure delay per cycle (the worker's own compute, latencies).

    Raises:
        InputError: more than 16 classes (use `mva_schweitzer`) or bad demands.
    """
    d, k = _check(stations, delay)
    if k > 16:
        raise InputError(f"exact MVA over 2^{k} populations is too large; use the approximate solver")
    s = d.shape[0]
    fcfs = np.array([st.kind == "fcfs" for st in stations], dtype=bool)
    cv2 = np.array([st.cv2 for st in stations])
    n_masks = 1 << k
    # Per population (bitmask), per station: jobs present, queued work Σ Q_c D_c, in-service work Σ U_c D_c.
    qtot = np.zeros((n_masks, s))
    qdtot = np.zeros((n_masks, s))
    udtot = np.zeros((n_masks, s))
    bits = np.array([1 << c for c in range(k)])
    x = np.zeros(k)
    r = np.zeros((s, k))
    q = np.zeros((s, k))
    for mask in range(1, n_masks):
        members = np.flatnonzero(mask & bits)
        prev = mask ^ bits[members]  # n − e_k for each member k
        dm = d[:, members]
        rm = _response(dm, fcfs, cv2, qtot[prev].T, qdtot[prev].T, udtot[prev].T)
        tot = rm.sum(axis=0) + delay[members]
        xm = np.where(tot > 0, 1.0 / np.where(tot > 0, tot, 1.0), 0.0)
        qm = rm * xm
        qtot[mask] = qm.sum(axis=1)
        qdtot[mask] = (qm * dm).sum(axis=1)
        udtot[mask] = (dm * dm * xm).sum(axis=1)
        if mask == n_masks - 1:
            x[members] = xm
            r[:, members] = rm
            q[:, members] = qm
    x = _clamp(d, x)
    return MVAResult(throughput=x, response=r, utilisation=(d * x).sum(axis=1), queue=q, exact=True)


def mva_schweitzer(stations: list[Station], delay: FloatArray, *, tol: float = 1e-10,
                   max_iter: int = 10_000) -> MVAResult:
    """Approximate MVA (Bard–Schweitzer) with one job per class; cost O(iterations · stations · K)."""
    d, k = _check(stations, delay)
    fcfs = np.array([st.kind == "fcfs" for st in stations], dtype=bool)
    cv2 = np.array([st.cv2 for st in stations])
    # Start with each job spread evenly over the stations it visits.
    visits = (d > 0).sum(axis=0) + (delay > 0)
    q = np.where(d > 0, 1.0 / np.maximum(visits, 1), 0.0)
    x = np.zeros(k)
    r = d.copy()
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 - the count is reported
        u = d * x
        qd = q * d
        ud = u * d
        # With one job per class, removing it leaves the other classes' queues as they are.
        r = _response(d, fcfs, cv2, q.sum(axis=1, keepdims=True) - q, qd.sum(axis=1, keepdims=True) - qd,
                      ud.sum(axis=1, keepdims=True) - ud)
        tot = r.sum(axis=0) + delay
        x_new = np.where(tot > 0, 1.0 / np.where(tot > 0, tot, 1.0), 0.0)
        q_new = r * x_new
        done = np.max(np.abs(q_new - q)) < tol and np.max(np.abs(x_new - x)) < tol * max(1.0, float(x_new.max()))
        q, x = q_new, x_new
        if done:
            break
    x = _clamp(d, x)
    return MVAResult(throughput=x, response=r, utilisation=(d * x).sum(axis=1), queue=q, exact=False,
                     iterations=it)


def mva_single_class(demands: FloatArray, delay: float, population: int,
                     kinds: list[StationKind] | None = None, cv2: FloatArray | None = None) -> FloatArray:
    """Exact single-class MVA for populations 1..N (homogeneous workers); returns throughput per N.

    Args:
        demands: service demand per station.
        delay: think time (pure delay) per cycle.
        population: the largest population N.
        kinds: discipline per station (default all PS).
        cv2: squared coefficient of variation of service per station (FCFS residual correction).
    """
    if population < 1:
        raise InputError(f"population must be >= 1, got {population}")
    dm = np.asarray(demands, dtype=np.float64)
    fcfs = np.array([kk == "fcfs" for kk in (kinds or ["ps"] * len(dm))], dtype=bool)
    c2 = np.ones(len(dm)) if cv2 is None else np.asarray(cv2, dtype=np.float64)
    q = np.zeros(len(dm))
    u = np.zeros(len(dm))
    out = np.zeros(population)
    for n in range(1, population + 1):
        ps = dm * (1.0 + q)
        fc = dm + (q - u) * dm + u * dm * (1.0 + c2) * 0.5  # Reiser residual, one class
        r = np.where(fcfs, fc, ps)
        x = n / (r.sum() + delay)
        q = x * r
        u = x * dm
        top = float(u.max())
        out[n - 1] = x / top if top > 1.0 else x  # same capacity bound as `_clamp`
    return out

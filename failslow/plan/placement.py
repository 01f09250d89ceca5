"""S3 topology adjustment, pure: which node should host which ranks once a link or a GPU has gone slow.

FALCON's third mitigation level re-places a running job: a congested link is moved out of the heavy
data-parallel (and tensor-parallel) traffic into a light pipeline hop or out of use (its node swap), and slow
GPUs are gathered into as few pipeline stages as possible (consolidation). This module scores placements
with an analytic iteration-time model and picks the best one, or refuses when none pays.

**What moves.** Slowness belongs to hardware: a slow GPU is a slot of a physical node, a congested link is a
node's NIC (all its inter-node traffic) or the path between two nodes. The ranks a node hosts now form a unit
that moves as a whole (a restart places a node's processes together), so a placement is a permutation
``sigma`` of the nodes: the unit on node ``u`` goes to node ``sigma[u]`` and rank ``r`` lands on
``sigma[placement[r]]`` in the same local slot it has now (its position among its node's ranks, sorted).

**The iteration model** (DP x PP x TP with 1F1B; ranks in Megatron order, see `failslow.topology`). It follows
:mod:`failslow.plan.pace`: a replica ``d`` running ``m_d`` micro-batches over stages of per-micro-batch time
``tau[d, s]`` takes ``m_d * t_d + o_d`` with ``t_d = max_s tau[d, s]`` (the bottleneck paces the steady state)
and ``o_d = sum_s tau[d, s] - t_d`` (fill and drain), and every replica waits for the slowest. Here ``tau`` is
built from the hardware instead of measured:

* compute: ``c[d, s] = w_s * compute_s * max over the stage's TP ranks of their slot's slowdown factor``, with
  ``w_s = edge_stage_weight`` on the first and last stage (embedding, LM head and loss) and 1 elsewhere;
* tensor parallelism: a ring all-reduce of ``tp_bytes`` per micro-batch over the cell's TP group,
  ``2 (tp - 1) / tp * tp_bytes / slowest hop`` (on one node that is the intra-node bandwidth, so it is small
  and the same for every placement);
* pipeline hops: ``p2p_bytes`` per micro-batch (activations forward plus their gradients backward) between
  the nodes of neighbouring stages, at the slowest of the TP ranks' paths; transfers block both ends, so a hop
  adds to the ``tau`` of both stages it joins;
* gradient all-reduce after the pipeline drains: one ring per stage and TP index over the DP replicas, in
  rank order, of ``grad_bytes[s] / tp`` bytes taking ``2 (dp - 1) / dp * bytes / slowest hop``; all rings run
  at once, so a NIC that carries ``k`` inter-node rings gives each ``1 / k`` of its bandwidth; the slowest ring
  counts;
* ``T = overhead_s + max_d (m_d * t_d + o_d) + slowest all-reduce``.

A hop between nodes ``a != b`` runs at ``link_bw * min(nic[a], nic[b], path[a, b])`` where ``nic`` and
``path`` are the bandwidth shares left on the congested links (1 when healthy); on one node it runs at
``intra_bw``. Every term is linear in the times and the byte counts, so the model is monotone: a slower
GPU or link never makes an iteration faster.

**Calibration** (:meth:`PlacementModel.calibrate`): like ``pace.fit`` fits ``F``, the caller's measured
iteration time fixes the model's free scale. Bandwidths and byte counts are taken as physical; the base
compute and the overhead are scaled by one factor (bisection; the model is increasing in it) until the current
placement predicts the measured time. When the communication alone already exceeds it, every time is scaled
instead (the model is homogeneous of degree one in time), which keeps the ranking of placements.

**Search.** Up to :data:`EXHAUSTIVE_MAX_NODES` nodes (8: 40,320 placements) every node permutation is
scored, vectorised with numpy, so the best is exact. Above that, a deterministic local search: from the
current placement and the best generated candidate, take the best swap of a suspect node (one with a slow
slot or a congested link) with any node while it improves, at most ``4 * suspects + 4`` steps. Besides the
search, two families of candidates are generated, scored and listed with a reason: link moves (swap a
congested node, or an end of a congested path, with every other node) and consolidation (the slow nodes into
``ceil(k / nodes per stage)`` stages, interior stages first). Exact ties go to the placement that moves the
fewest nodes, then the one with the fewest slow slots in an edge stage.

**Moves that pay with a rebalance** (``rebalance=True``). With compute stragglers in several DP replicas every
replica is slow, so S2 cannot help, and gathering the slow GPUs into one replica scores no better under the
job's current split: only the move followed by an S2 split pays (FALCON's consolidation, Fig. 16). With
``rebalance`` every placement is scored under its own best split of the same total ``M``: ``overhead + min
over integers m_d >= 1 (m_d <= an optional upper bound), sum m_d = M, of max_d (m_d t_d + o_d) + its
all-reduce``. Over all placements at once this is a search on the makespan ``T`` (the smallest ``T`` with
``sum_d clip(floor((T - o_d) / t_d), 1, upper_d) >= M``, settled per element on the exact expression
``k t_d + o_d <= T``, so it is the value :func:`failslow.plan.microbatch.rebalance` reaches to the last bit);
the listed candidates then get their split from that solver. The current placement is scored with its best
split too, so a move is only chosen when it beats S2 alone, and consolidation also gathers the slow nodes
into as few replicas as possible.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError
from failslow.plan.microbatch import Rebalance
from failslow.plan.microbatch import rebalance as solve_split
from failslow.plan.pace import PaceModel
from failslow.plan.policy import Suspect, TopologyOption
from failslow.topology import Layout

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

#: Node counts up to this are searched exhaustively (8! = 40,320 placements).
EXHAUSTIVE_MAX_NODES: Final[int] = 8
#: Placements scored per numpy batch (bounds memory at large rank counts).
_BATCH: Final[int] = 4096
_MIB: Final[float] = float(1 << 20)
_GIB: Final[float] = float(1 << 30)

#: A congested link: a node (its NIC) or a pair of nodes (the path between them).
LinkKey = int | tuple[int, int]


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (value > 0 and math.isfinite(value)):
        raise InputError(f"placement params: {name} must be a positive number, got {value!r}")
    return float(value)


def _nonneg(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (value >= 0 and math.isfinite(value)):
        raise InputError(f"placement params: {name} must be a number >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class PlacementParams:
    """Traffic and time model of one iteration (defaults: a GPT-style 7B job on 200 Gb/s links).

    Attributes:
        microbatches: Micro-batches per DP replica per iteration: one count for all or one per replica.
        compute_s: Healthy forward plus backward seconds per micro-batch of a stage: one for all stages or one
            per stage (before ``edge_stage_weight``).
        edge_stage_weight: Factor on the first and last stage's compute (embedding, LM head, loss); 1 for even
            stages. The default 1.1 also makes a slow GPU cost more on an edge stage, hence consolidation
            prefers interior stages.
        p2p_bytes: Bytes a pipeline hop carries per micro-batch, both directions (default 32 MiB: 16 MiB of
            activations forward, the same of gradients backward, as for sequence 2048 x hidden 4096 in bf16).
        grad_bytes: Gradient bytes of a stage (all TP shards together) all-reduced per iteration: one for all
            stages or one per stage (default 2 GiB: 1 G parameters in bf16).
        tp_bytes: Bytes of a stage's tensor-parallel all-reduces per micro-batch (default 256 MiB).
        link_bw: Healthy inter-node bandwidth of a NIC, bytes per second (default 25e9: 200 Gb/s).
        intra_bw: Bandwidth between ranks on one node, bytes per second (default 150e9: NVLink class).
        overhead_s: Seconds per iteration outside the pipeline and the all-reduce (optimizer, host work).
    """

    microbatches: int | tuple[int, ...] = 8
    compute_s: float | tuple[float, ...] = 0.1
    edge_stage_weight: float = 1.1
    p2p_bytes: float = 32 * _MIB
    grad_bytes: float | tuple[float, ...] = 2 * _GIB
    tp_bytes: float = 256 * _MIB
    link_bw: float = 25e9
    intra_bw: float = 150e9
    overhead_s: float = 0.05

    def __post_init__(self) -> None:
        mb = self.microbatches
        counts = (mb,) if isinstance(mb, int) else tuple(mb)
        if not counts or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in counts):
            raise InputError(f"placement params: microbatches must be integers >= 1, got {mb!r}")
        object.__setattr__(self, "microbatches", mb if isinstance(mb, int) else counts)
        for name, check in (("compute_s", _positive), ("grad_bytes", _nonneg)):
            v = getattr(self, name)
            if isinstance(v, int | float) and not isinstance(v, bool):
                object.__setattr__(self, name, check(name, v))
            else:
                vals = tuple(v)
                if not vals:
                    raise InputError(f"placement params: {name} needs at least one value")
                object.__setattr__(self, name, tuple(check(name, x) for x in vals))
        for name in ("edge_stage_weight", "link_bw", "intra_bw"):
            object.__setattr__(self, name, _positive(name, getattr(self, name)))
        for name in ("p2p_bytes", "tp_bytes", "overhead_s"):
            object.__setattr__(self, name, _nonneg(name, getattr(self, name)))

    def per_replica(self, dp: int) -> FloatArray:
        """``m_d`` for each of `dp` replicas."""
        mb = self.microbatches
        if isinstance(mb, int):
            return np.full(dp, float(mb))
        if len(mb) != dp:
            raise InputError(f"placement params: {len(mb)} micro-batch counts for {dp} DP replicas")
        return np.asarray(mb, dtype=np.float64)

    def per_stage(self, name: str, pp: int) -> FloatArray:
        """``compute_s`` or ``grad_bytes`` for each of `pp` stages (no edge weight)."""
        v = getattr(self, name)
        if isinstance(v, float):
            return np.full(pp, v)
        if len(v) != pp:
            raise InputError(f"placement params: {len(v)} values of {name} for {pp} pipeline stages")
        return np.asarray(v, dtype=np.float64)

    def to_json(self) -> dict[str, Any]:
        """The parameters as plain JSON."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class IterationTime:
    """The model's iteration time of one placement and its parts (seconds); `counts` is the micro-batch
    split it assumes when the model rebalances (None: the job's current split)."""

    total_s: float
    pipeline_s: float
    allreduce_s: float
    overhead_s: float
    counts: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form (``counts`` only when set)."""
        doc = asdict(self)
        if self.counts is None:
            del doc["counts"]
        else:
            doc["counts"] = list(self.counts)
        return doc


@dataclass(frozen=True)
class PlacementCandidate:
    """One scored placement.

    Attributes:
        placement: Node of each rank.
        predicted_s: Predicted iteration time.
        why: What the move does, for people.
        source: ``link`` (link move), ``consolidate``, ``search`` (exhaustive or local search).
        moved: Nodes that host other ranks than now.
        counts: The micro-batch split per DP replica the prediction assumes (planned with ``rebalance``);
            None: the job's current split.
    """

    placement: tuple[int, ...]
    predicted_s: float
    why: str
    source: str
    moved: tuple[int, ...]
    counts: tuple[int, ...] | None = None

    def to_option(self) -> TopologyOption:
        """The form the ski-rental planner takes (`failslow.plan.policy.JobView.topology`)."""
        return TopologyOption(placement=self.placement, predicted_s=self.predicted_s, why=self.why,
                              counts=self.counts)

    def to_json(self, current_s: float | None = None) -> dict[str, Any]:
        """Plain JSON form (``counts`` only when set); with `current_s`, also the predicted relative gain."""
        doc: dict[str, Any] = {"placement": list(self.placement), "predicted_s": self.predicted_s,
                               "source": self.source, "moved_nodes": list(self.moved), "why": self.why}
        if self.counts is not None:
            doc["counts"] = list(self.counts)
        if current_s:
            doc["gain"] = 1.0 - self.predicted_s / current_s
        return doc


@dataclass(frozen=True)
class TopologyPlan:
    """The S3 planner's answer.

    Attributes:
        current_s: Predicted (calibrated: measured) iteration time of the current placement; with `rebalance`,
            under its best micro-batch split (what S2 alone would reach), the time every move is measured
            against.
        current: Its breakdown (with `rebalance`, its ``counts`` are that split).
        candidates: Scored placements other than the current one, best first.
        chosen: The placement to move to, or None (see `reason`).
        reason: Why `chosen` was taken or why none was.
        method: ``exhaustive`` or ``local-search``.
        evaluated: Placements the search scored.
        min_gain: The relative gain a move had to predict.
        params: The model parameters used (after calibration).
        rebalance: Every placement was scored under its own best micro-batch split.
        as_is_s: With `rebalance`, the current placement under the job's current split (without: None).
    """

    current_s: float
    current: IterationTime
    candidates: tuple[PlacementCandidate, ...]
    chosen: PlacementCandidate | None
    reason: str
    method: str
    evaluated: int
    min_gain: float
    params: PlacementParams
    rebalance: bool = False
    as_is_s: float | None = None

    def options(self) -> tuple[TopologyOption, ...]:
        """What the ski-rental planner should weigh: the chosen placement first, then every other one that
        beats the current placement by `min_gain`; nothing when the plan refused."""
        if self.chosen is None:
            return ()
        limit = (1.0 - self.min_gain) * self.current_s
        rest = [c.to_option() for c in self.candidates if c is not self.chosen and c.predicted_s <= limit]
        return (self.chosen.to_option(), *rest)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form (what `failslow plan topology` prints; ``rebalance`` and ``as_is_s`` only when
        planned with `rebalance`)."""
        doc: dict[str, Any] = {
            "current_s": self.current_s, "current": self.current.to_json(),
            "chosen": None if self.chosen is None else self.chosen.to_json(self.current_s),
            "reason": self.reason, "method": self.method, "evaluated": self.evaluated, "min_gain": self.min_gain,
            "candidates": [c.to_json(self.current_s) for c in self.candidates], "params": self.params.to_json()}
        if self.rebalance:
            doc["rebalance"] = True
            doc["as_is_s"] = self.as_is_s
        return doc


def _check_layout(layout: Layout) -> Layout:
    if not isinstance(layout, Layout):
        raise InputError(f"topology plan: expected a Layout, got {type(layout).__name__}")
    if layout.cp > 1:
        raise InputError("topology plan: context parallelism (cp > 1) is not modelled")
    return layout


def _check_placement(layout: Layout, placement: Sequence[int] | None) -> IntArray:
    if placement is None:
        return layout.nodes_array()
    try:
        p = [int(x) for x in placement]
        if any(isinstance(x, bool) or int(x) != x for x in placement):
            raise ValueError
    except (TypeError, ValueError):
        raise InputError(f"topology plan: placement must be node indices, got {placement!r}") from None
    if len(p) != layout.world_size:
        raise InputError(f"topology plan: placement has {len(p)} entries for {layout.world_size} ranks")
    arr = np.asarray(p, dtype=np.int64)
    n = int(arr.max()) + 1
    if arr.min() < 0:
        raise InputError("topology plan: placement has a negative node index")
    counts = np.bincount(arr, minlength=n)
    if (counts == 0).any():
        raise InputError(f"topology plan: placement leaves node(s) {np.flatnonzero(counts == 0).tolist()} empty "
                         f"(nodes must be numbered 0..{n - 1})")
    if (counts != counts[0]).any():
        raise InputError(f"topology plan: nodes hold unequal numbers of ranks {counts.tolist()}; a placement "
                         "is a permutation of equal nodes")
    if layout.ranks_per_node is not None and int(counts[0]) != layout.ranks_per_node:
        raise InputError(f"topology plan: placement puts {int(counts[0])} ranks on a node, the layout says "
                         f"{layout.ranks_per_node}")
    return arr


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


class PlacementModel:
    """The iteration-time model of one job's hardware, able to score any node permutation.

    Built from the current placement and the measured slowness (see the module docstring); all scoring is
    vectorised over placements. With `rebalance` every placement is scored under its own best micro-batch
    split of the same total (at most `microbatch_upper` per replica: one bound for all or one per replica);
    without, under the split in `params`.

    Raises:
        InputError: a layout with context parallelism, a placement that is not a whole number of equal nodes,
            a slow rank or node outside the job, a compute factor that is not positive and finite, a
            bandwidth share outside (0, 1], or upper bounds that are not positive integers (one or one per
            replica) or leave no room for the total.
    """

    def __init__(self, layout: Layout, placement: Sequence[int] | None = None, *,
                 slow_ranks: Mapping[int, float] | None = None,
                 slow_links: Mapping[LinkKey, float] | None = None,
                 params: PlacementParams | None = None, rebalance: bool = False,
                 microbatch_upper: int | Sequence[int] | None = None) -> None:
        self.layout = _check_layout(layout)
        self.placement = _check_placement(layout, placement)
        self.params = PlacementParams() if params is None else params
        if not isinstance(self.params, PlacementParams):
            raise InputError(f"topology plan: params must be PlacementParams, got {type(self.params).__name__}")
        w = layout.world_size
        self.n_nodes = int(self.placement.max()) + 1
        self.rpn = w // self.n_nodes
        # local slot of each rank: its position among its node's ranks in rank order
        order = np.lexsort((np.arange(w), self.placement))
        self.local = np.empty(w, dtype=np.int64)
        self.local[order] = np.tile(np.arange(self.rpn), self.n_nodes)
        self.slot_factor = np.ones((self.n_nodes, self.rpn))
        for rank, f in (slow_ranks or {}).items():
            if isinstance(rank, bool) or not isinstance(rank, int | np.integer) or not 0 <= rank < w:
                raise InputError(f"topology plan: slow rank {rank!r} outside 0..{w - 1}")
            if isinstance(f, bool) or not isinstance(f, int | float) or not (f > 0 and math.isfinite(f)):
                raise InputError(f"topology plan: slow rank {rank}: factor must be positive, got {f!r}")
            self.slot_factor[self.placement[rank], self.local[rank]] = float(f)
        self.nic = np.ones(self.n_nodes)
        self.path = np.ones((self.n_nodes, self.n_nodes))
        for key, share in (slow_links or {}).items():
            if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
                raise InputError(f"topology plan: slow link {key!r}: bandwidth share must be in (0, 1], "
                                 f"got {share!r}")
            if isinstance(key, tuple):
                if len(key) != 2 or not all(self._is_node(x) for x in key) or key[0] == key[1]:
                    raise InputError(f"topology plan: slow link {key!r} is not a pair of two nodes in "
                                     f"0..{self.n_nodes - 1}")
                a, b = int(key[0]), int(key[1])
                self.path[a, b] = self.path[b, a] = min(self.path[a, b], float(share))
            elif self._is_node(key):
                self.nic[int(key)] = min(self.nic[int(key)], float(share))
            else:
                raise InputError(f"topology plan: slow link node {key!r} outside 0..{self.n_nodes - 1}")
        self._m = self.params.per_replica(layout.dp)
        weight = np.ones(layout.pp)
        if layout.pp > 1:
            weight[[0, -1]] = self.params.edge_stage_weight
        self._base = self.params.per_stage("compute_s", layout.pp) * weight
        self._grad = self.params.per_stage("grad_bytes", layout.pp)
        self._stage_of = layout.coords_array()[:, 3]
        self._replica_of = layout.coords_array()[:, 2]
        self.rebalance = bool(rebalance)
        self.upper = self._check_upper(microbatch_upper)

    def _check_upper(self, upper: int | Sequence[int] | None) -> tuple[int, ...] | None:
        if upper is None:
            return None
        dp = self.layout.dp
        try:
            values: list[object] = [upper] if isinstance(upper, int | np.integer) else list(upper)
        except TypeError:
            values = [upper]
        if not all(isinstance(x, int | np.integer) and not isinstance(x, bool) for x in values):
            raise InputError(f"topology plan: microbatch_upper must be integers, got {upper!r}")
        bounds = tuple(int(x) for x in values)  # type: ignore[call-overload]
        if len(bounds) == 1:
            bounds = bounds * dp
        if len(bounds) != dp or min(bounds) < 1:
            raise InputError(f"topology plan: microbatch_upper needs one bound >= 1 or one per DP replica "
                             f"({dp}), got {upper!r}")
        total = self.total
        if sum(min(b, total) for b in bounds) < total:
            raise InputError(f"topology plan: microbatch_upper {list(bounds)} leaves no room for {total} "
                             "micro-batches")
        return bounds

    @property
    def total(self) -> int:
        """``M``: micro-batches per iteration over all replicas (kept by every split)."""
        return int(self._m.sum())

    def _caps(self) -> FloatArray:
        """Most micro-batches a replica may take in a split: its bound, and no more than the others leave."""
        room = float(self.total - self.layout.dp + 1)
        if self.upper is None:
            return np.full(self.layout.dp, room)
        return np.minimum(np.asarray(self.upper, dtype=np.float64), room)

    def with_rebalance(self, rebalance: bool) -> PlacementModel:
        """The same model scoring under each placement's best split (True) or the current one (False)."""
        other = object.__new__(PlacementModel)
        other.__dict__.update(self.__dict__)
        other.rebalance = bool(rebalance)
        return other

    def _is_node(self, x: object) -> bool:
        return not isinstance(x, bool) and isinstance(x, int | np.integer) and 0 <= int(x) < self.n_nodes

    # --- placements <-> permutations ------------------------------------------------------------

    @property
    def identity(self) -> IntArray:
        """The permutation of the current placement."""
        return np.arange(self.n_nodes, dtype=np.int64)

    def placement_of(self, sigma: Sequence[int] | IntArray) -> tuple[int, ...]:
        """Node of each rank when the unit on node ``u`` moves to ``sigma[u]``."""
        s = np.asarray(sigma, dtype=np.int64)
        return tuple(int(x) for x in s[self.placement])

    def sigma_of(self, placement: Sequence[int]) -> IntArray:
        """The node permutation that turns the current placement into `placement`.

        Raises:
            InputError: `placement` splits a node's ranks, or is not a permutation of the nodes.
        """
        p = np.asarray(list(placement), dtype=np.int64)
        if p.shape != self.placement.shape:
            raise InputError(f"topology plan: placement has {p.size} entries for {self.placement.size} ranks")
        sigma = np.full(self.n_nodes, -1, dtype=np.int64)
        sigma[self.placement] = p
        if not np.array_equal(sigma[self.placement], p) or sorted(sigma.tolist()) != list(range(self.n_nodes)):
            raise InputError("topology plan: a placement must move each node's ranks together onto distinct nodes")
        return sigma

    # --- the model ------------------------------------------------------------------------------

    def _bandwidth(self, nic: FloatArray, a: IntArray, b: IntArray) -> FloatArray:
        """Bandwidth of hops ``a -> b`` given per-candidate NIC shares `nic` (K, N); a, b are (K, ...)."""
        k = a.shape[0]
        flat_a, flat_b = a.reshape(k, -1), b.reshape(k, -1)
        na = np.take_along_axis(nic, flat_a, axis=1)
        nb = np.take_along_axis(nic, flat_b, axis=1)
        share = np.minimum(np.minimum(na, nb), self.path[flat_a, flat_b])
        bw = np.where(flat_a == flat_b, self.params.intra_bw, self.params.link_bw * share)
        return np.asarray(bw.reshape(a.shape), dtype=np.float64)

    def _evaluate(self, sigmas: IntArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(pipeline, all-reduce, edge-slow count) of each permutation row of `sigmas`; the pipeline under the
        current split, or with `rebalance` under each row's best split."""
        tau, allreduce, edge_slow = self._stage_times(sigmas)
        t = tau.max(axis=1)  # (K, dp)
        if self.rebalance:
            pipeline = min_makespan(t, tau.sum(axis=1) - t, self.total, self._caps())
        else:
            pipeline = (self._m[None, :] * t + tau.sum(axis=1) - t).max(axis=1)
        return pipeline, allreduce, edge_slow

    def pace(self, sigma: Sequence[int] | IntArray) -> tuple[FloatArray, FloatArray]:
        """``(t_d, o_d)`` of each replica under the permutation `sigma`: the bottleneck stage's time per
        micro-batch and the fill and drain (as :mod:`failslow.plan.pace` defines them)."""
        tau = self._stage_times(np.asarray(sigma, dtype=np.int64)[None, :])[0][0]
        t = tau.max(axis=0)
        return np.asarray(t, dtype=np.float64), np.asarray(tau.sum(axis=0) - t, dtype=np.float64)

    def split(self, sigma: Sequence[int] | IntArray) -> Rebalance:
        """The best micro-batch split under the permutation `sigma`, exactly
        (:func:`failslow.plan.microbatch.rebalance` on its ``t_d`` with offsets ``o_d``)."""
        t, o = self.pace(sigma)
        return solve_split(t, self.total, 1, None if self.upper is None else list(self.upper), offsets=o)

    def _stage_times(self, sigmas: IntArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(tau (K, pp, dp), all-reduce, edge-slow count) of each permutation row of `sigmas`."""
        lay, prm = self.layout, self.params
        k = sigmas.shape[0]
        pp, dp, tp = lay.pp, lay.dp, lay.tp
        nodes = sigmas[:, self.placement]  # (K, W): node of each rank
        factor = self.slot_factor[nodes, self.local[None, :]]
        g = nodes.reshape(k, pp, dp, tp)
        base_nic = np.broadcast_to(self.nic, (k, self.n_nodes))
        tau = self._base[None, :, None] * factor.reshape(k, pp, dp, tp).max(axis=3)  # (K, pp, dp)
        if tp > 1:
            bw = self._bandwidth(base_nic, g, np.roll(g, -1, axis=3)).min(axis=3)
            tau = tau + 2.0 * (tp - 1) / tp * prm.tp_bytes / bw
        if pp > 1:
            bw = self._bandwidth(base_nic, g[:, :-1], g[:, 1:]).min(axis=3)  # (K, pp-1, dp)
            hop = prm.p2p_bytes / bw
            tau = tau.copy()
            tau[:, :-1] += hop
            tau[:, 1:] += hop
        allreduce = np.zeros(k)
        if dp > 1:
            ring = g.transpose(0, 1, 3, 2)  # (K, pp, tp, dp)
            spans = (ring != ring[..., :1]).any(axis=3)  # (K, pp, tp)
            present = (ring[..., None] == np.arange(self.n_nodes)).any(axis=3)  # (K, pp, tp, N)
            load = (present & spans[..., None]).sum(axis=(1, 2))  # inter-node rings through each NIC
            nic = self.nic[None, :] / np.maximum(load, 1)
            bw = self._bandwidth(nic, ring, np.roll(ring, -1, axis=3)).min(axis=3)  # (K, pp, tp)
            ring_s = 2.0 * (dp - 1) / dp * (self._grad[None, :, None] / tp) / bw
            allreduce = ring_s.max(axis=(1, 2))
        edge_slow = np.zeros(k)
        if pp > 2:
            edge = (self._stage_of == 0) | (self._stage_of == pp - 1)
            edge_slow = ((factor > 1.0) & edge[None, :]).sum(axis=1).astype(np.float64)
        return tau, allreduce, edge_slow

    def times(self, sigmas: IntArray) -> FloatArray:
        """Predicted iteration time of each permutation (rows of `sigmas`), in batches."""
        out = np.empty(sigmas.shape[0])
        for i in range(0, sigmas.shape[0], _BATCH):
            pipe, ar, _ = self._evaluate(sigmas[i:i + _BATCH])
            out[i:i + _BATCH] = self.params.overhead_s + pipe + ar
        return out

    def time(self, placement: Sequence[int] | None = None) -> IterationTime:
        """The model's iteration time of `placement` (default: the current one) and its parts.

        Raises:
            InputError: `placement` does not keep each node's ranks together.
        """
        sigma = self.identity if placement is None else self.sigma_of(placement)
        pipe, ar, _ = self._evaluate(sigma[None, :])
        oh = self.params.overhead_s
        counts = self.split(sigma).counts if self.rebalance else None
        return IterationTime(total_s=float(oh + pipe[0] + ar[0]), pipeline_s=float(pipe[0]),
                             allreduce_s=float(ar[0]), overhead_s=oh, counts=counts)

    def with_params(self, params: PlacementParams) -> PlacementModel:
        """The same hardware under other parameters."""
        other = object.__new__(PlacementModel)
        other.__dict__.update(self.__dict__)
        other.params = params
        other._m = params.per_replica(self.layout.dp)
        weight = np.ones(self.layout.pp)
        if self.layout.pp > 1:
            weight[[0, -1]] = params.edge_stage_weight
        other._base = params.per_stage("compute_s", self.layout.pp) * weight
        other._grad = params.per_stage("grad_bytes", self.layout.pp)
        return other

    def calibrate(self, iteration_s: float) -> PlacementModel:
        """This model with its free scale fitted so that the current placement predicts `iteration_s`.

        Scales the base compute and the overhead by one factor (see the module docstring). The measured time
        is the job's under its current split, so the fit is too, also for a model that rebalances.

        Raises:
            InputError: `iteration_s` not positive and finite.
        """
        if isinstance(iteration_s, bool) or not (iteration_s > 0 and math.isfinite(iteration_s)):
            raise InputError(f"topology plan: iteration time must be positive, got {iteration_s!r}")
        if self.rebalance:
            return self.with_rebalance(False).calibrate(iteration_s).with_rebalance(True)
        prm = self.params

        def scaled(a: float) -> PlacementModel:
            cs = prm.compute_s
            comp: float | tuple[float, ...] = cs * a if isinstance(cs, float) else tuple(x * a for x in cs)
            return self.with_params(replace(prm, compute_s=comp, overhead_s=prm.overhead_s * a))

        def total(a: float) -> float:
            return scaled(a).time().total_s

        lo = 1e-9
        if total(lo) >= iteration_s:
            # The links alone take longer than measured: scale every time (compute, overhead, transfers).
            k = iteration_s / self.time().total_s
            cs = prm.compute_s
            comp = cs * k if isinstance(cs, float) else tuple(x * k for x in cs)
            return self.with_params(replace(prm, compute_s=comp, overhead_s=prm.overhead_s * k,
                                            link_bw=prm.link_bw / k, intra_bw=prm.intra_bw / k))
        hi = 1.0
        while total(hi) < iteration_s:
            hi *= 2.0
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            if total(mid) < iteration_s:
                lo = mid
            else:
                hi = mid
        return scaled(0.5 * (lo + hi))

    # --- describing a placement -----------------------------------------------------------------

    def suspects(self) -> list[int]:
        """Nodes with a slow slot or a congested NIC or path, in node order."""
        slow = (self.slot_factor != 1.0).any(axis=1) | (self.nic < 1.0) | (self.path < 1.0).any(axis=1)
        return [int(x) for x in np.flatnonzero(slow)]

    def role(self, sigma: IntArray, node: int) -> str:
        """Which stages `node` serves under `sigma` and what inter-node traffic its NIC carries."""
        lay = self.layout
        nodes = sigma[self.placement]
        mine = np.flatnonzero(nodes == node)
        stages = sorted({int(self._stage_of[r]) for r in mine})
        traffic: list[str] = []
        if lay.dp > 1 and any(len({int(nodes[x]) for x in lay.dp_group(int(r))}) > 1 for r in mine):
            traffic.append("DP all-reduce")
        if lay.tp > 1 and any(len({int(nodes[x]) for x in lay.tp_group(int(r))}) > 1 for r in mine):
            traffic.append("TP all-reduce")
        hops = sum(1 for r in mine for q in (int(r) - lay.world_size // lay.pp, int(r) + lay.world_size // lay.pp)
                   if 0 <= q < lay.world_size and nodes[q] != node)
        if hops:
            traffic.append(f"{hops} PP hop{'s' if hops > 1 else ''}")
        where = "stage " + ",".join(str(s) for s in stages)
        if self.rebalance:  # the split follows the replicas, so say which one the node serves
            replicas = sorted({int(self._replica_of[r]) for r in mine})
            where = "replica " + ",".join(str(d) for d in replicas) + ", " + where
        return f"{where} ({' + '.join(traffic) if traffic else 'no inter-node traffic'})"

    def path_role(self, sigma: IntArray, a: int, b: int) -> str:
        """What traffic the path between nodes `a` and `b` carries under `sigma`."""
        lay = self.layout
        nodes = sigma[self.placement]
        kinds: list[str] = []
        for kind in ("dp", "tp"):
            for grp in lay.groups(kind):
                ring = [int(nodes[r]) for r in grp]
                if len(ring) > 1 and any({x, y} == {a, b} for x, y in zip(ring, ring[1:] + ring[:1], strict=True)):
                    kinds.append(f"{kind.upper()} all-reduce")
                    break
        if any({int(nodes[x]), int(nodes[y])} == {a, b} for grp in lay.groups("pp")
               for x, y in itertools.pairwise(grp)):
            kinds.append("PP hop")
        return " + ".join(kinds) if kinds else "nothing"

    def describe(self, sigma: IntArray) -> str:
        """Where every suspect ends up under `sigma`, one clause each."""
        parts: list[str] = []
        for node in self.suspects():
            what: list[str] = []
            if self.nic[node] < 1:
                what.append(f"link {self.nic[node]:.0%}")
            slow = self.slot_factor[node][self.slot_factor[node] != 1.0]
            if slow.size:
                what.append(f"{slow.size} slow GPU{'s' if slow.size > 1 else ''} x{slow.max():.2g}")
            if what:
                parts.append(f"node {node} [{', '.join(what)}] -> {self.role(sigma, node)}")
        for a, b in zip(*np.nonzero(np.triu(self.path < 1.0)), strict=True):
            parts.append(f"path {int(a)}-{int(b)} [{self.path[a, b]:.0%}] carries {self.path_role(sigma, int(a), int(b))}")
        return "; ".join(parts)


# --- candidate generation --------------------------------------------------------------------------


def _swap(sigma: IntArray, x: int, y: int) -> IntArray:
    """`sigma` with physical nodes `x` and `y` exchanged."""
    out = sigma.copy()
    ix, iy = np.flatnonzero(out == x)[0], np.flatnonzero(out == y)[0]
    out[ix], out[iy] = y, x
    return out


def _link_moves(model: PlacementModel) -> list[tuple[IntArray, str]]:
    """FALCON's node swap: every congested node (or end of a congested path) with every other node."""
    ends: list[int] = [int(x) for x in np.flatnonzero(model.nic < 1.0)]
    for a, b in zip(*np.nonzero(np.triu(model.path < 1.0)), strict=True):
        ends += [int(a), int(b)]
    out: list[tuple[IntArray, str]] = []
    for x in dict.fromkeys(ends):
        for y in range(model.n_nodes):
            if y != x:
                out.append((_swap(model.identity, x, y), f"link move: swap node {x} with node {y}"))
    return out


def _units_of(model: PlacementModel, coord: IntArray, size: int) -> list[list[int]]:
    """The units (nodes now) wholly inside each of `size` groups given each rank's group `coord` (a unit
    spanning several belongs to none: it cannot be moved into one)."""
    units: list[list[int]] = [[] for _ in range(size)]
    for u in range(model.n_nodes):
        groups = set(coord[model.placement == u].tolist())
        if len(groups) == 1:
            units[groups.pop()].append(u)
    return units


def _consolidations(model: PlacementModel) -> list[tuple[IntArray, str]]:
    """The slow nodes gathered into ceil(k / nodes per stage) stages, interior stages first; when the model
    rebalances, also into ceil(k / nodes per replica) DP replicas (pipelines), which S2 can then unload."""
    lay = model.layout
    slow = [int(x) for x in np.flatnonzero((model.slot_factor > 1.0).any(axis=1))]
    if not slow:
        return []
    out: list[tuple[IntArray, str]] = []
    if lay.pp > 1:
        stage_units = _units_of(model, model._stage_of, lay.pp)
        edge = (0, lay.pp - 1)
        combos = [] if min(len(s) for s in stage_units) == 0 else sorted(
            itertools.combinations(range(lay.pp), math.ceil(len(slow) / min(len(s) for s in stage_units))),
            key=lambda c: (sum(s in edge for s in c), c))
        out += _gather(model, slow, stage_units, [c for c in combos if len(c) < lay.pp][:16], "stage(s)")
    if model.rebalance and lay.dp > 1:
        replica_units = _units_of(model, model._replica_of, lay.dp)
        if min(len(r) for r in replica_units) > 0:
            need = math.ceil(len(slow) / min(len(r) for r in replica_units))
            # replicas already holding the most slow nodes first: the fewest moves
            held = [sum(int(model.identity[u]) in slow for u in units) for units in replica_units]
            combos = sorted((c for c in itertools.combinations(range(lay.dp), need) if need < lay.dp),
                            key=lambda c: (-sum(held[d] for d in c), c))
            # inside a replica, slow nodes go to interior stages first
            stage_of_unit = {u: s for s, units in enumerate(_units_of(model, model._stage_of, lay.pp)) for u in units}
            for units in replica_units:
                units.sort(key=lambda u: (stage_of_unit.get(u, -1) in (0, lay.pp - 1), u))
            out += _gather(model, slow, replica_units, combos[:16], "replica")
    return out


def _gather(model: PlacementModel, slow: list[int], group_units: list[list[int]],
            combos: Sequence[tuple[int, ...]], label: str) -> list[tuple[IntArray, str]]:
    """For each combination of groups, the permutation that moves the `slow` nodes onto those groups' units
    with the fewest swaps (slow nodes already there stay), with its reason."""
    out: list[tuple[IntArray, str]] = []
    for combo in combos:
        slots = [u for s in combo for u in group_units[s]]  # units whose node will be a slow one
        sigma = model.identity.copy()
        # slow nodes already on a target unit stay; the others take the remaining target units' places
        placed = {int(sigma[u]) for u in slots} & set(slow)
        free = [u for u in slots if int(sigma[u]) not in slow]
        for node in slow:
            if node in placed or not free:
                continue
            u = free.pop(0)
            sigma = _swap(sigma, node, int(sigma[u]))
        if not np.array_equal(sigma, model.identity):
            out.append((sigma, f"consolidate {len(slow)} slow node(s) into {label} {','.join(map(str, combo))}"))
    return out


def _all_permutations(n: int) -> IntArray:
    return np.asarray(list(itertools.permutations(range(n))), dtype=np.int64).reshape(-1, n)


def _best(model: PlacementModel, sigmas: IntArray) -> tuple[int, FloatArray]:
    """Index of the best row (ties: fewest moved nodes, fewest slow slots on edge stages, then first)."""
    times = model.times(sigmas)
    tol = 1e-9 * max(float(times.min()), 1e-12)
    tied = np.flatnonzero(times <= times.min() + tol)
    moved = (sigmas[tied] != model.identity[None, :]).sum(axis=1)
    edge = np.concatenate([model._evaluate(sigmas[tied[i:i + _BATCH]])[2] for i in range(0, tied.size, _BATCH)])
    pick = np.lexsort((tied, edge, moved))[0]
    return int(tied[pick]), times


def _local_search(model: PlacementModel, starts: list[IntArray]) -> tuple[IntArray, int]:
    """Best-improvement swaps of a suspect node with any node, from each start; the best end point."""
    suspects = model.suspects()
    evaluated = 0
    best_sigma, best_t = model.identity, math.inf
    for start in starts:
        sigma = start.copy()
        t = float(model.times(sigma[None, :])[0])
        evaluated += 1
        for _ in range(4 * len(suspects) + 4):
            moves = [_swap(sigma, x, y) for x in suspects for y in range(model.n_nodes) if y != x]
            if not moves:
                break
            cand = np.stack(moves)
            i, times = _best(model, cand)
            evaluated += len(moves)
            if times[i] >= t * (1.0 - 1e-12):
                break
            sigma, t = cand[i], float(times[i])
        if t < best_t * (1.0 - 1e-12):
            best_sigma, best_t = sigma, t
    return best_sigma, evaluated


def plan_topology(layout: Layout, placement: Sequence[int] | None = None, *,
                  slow_ranks: Mapping[int, float] | None = None,
                  slow_links: Mapping[LinkKey, float] | None = None,
                  params: PlacementParams | None = None, iteration_s: float | None = None,
                  healthy_s: float | None = None, min_gain: float = 0.03,
                  max_candidates: int = 16, rebalance: bool = False,
                  microbatch_upper: int | Sequence[int] | None = None) -> TopologyPlan:
    """Score node permutations of a job and choose the one to restart with (FALCON's S3).

    Args:
        layout: The job's DP/PP/TP sizes (``cp`` must be 1).
        placement: Node of each rank now (default: the layout's ``rank // ranks_per_node``).
        slow_ranks: Measured compute slowdown per rank now (2.5: the rank's GPU takes 2.5x as long).
            The slowness stays with the GPU slot when ranks move.
        slow_links: Bandwidth share left on a congested link (0.1: a tenth): a node index for its NIC (all its
            inter-node traffic), a pair ``(a, b)`` for the path between two nodes.
        params: The traffic and time model (defaults: :class:`PlacementParams`).
        iteration_s: The measured iteration time now; when given the model is calibrated on it
            (:meth:`PlacementModel.calibrate`), so predictions are in the job's own seconds.
        healthy_s: The measured iteration time before anything was slow; when given the model is calibrated
            on it instead, with no slowness on the current placement (a pace measured over the healthy
            stretch is steadier than one measured since the onset, and the traffic model then predicts the
            slow placement as well as the moves).
        min_gain: Smallest relative gain over the current placement worth a move.
        max_candidates: Most candidates listed (the chosen one is always among them).
        rebalance: Score every placement, the current one included, under its own best micro-batch split of
            the same total (the move followed by S2); each candidate then carries its split (``counts``) and
            a move must beat S2 alone on the current placement. Calibration still fits the current split.
        microbatch_upper: With `rebalance`, most micro-batches a replica may take (memory): one bound for all
            or one per replica.

    Returns:
        The plan: the candidates best first, the chosen one or None with the reason.

    Raises:
        InputError: invalid layout, placement, slowness, parameters, upper bounds or `min_gain` outside
            [0, 1).
    """
    if isinstance(min_gain, bool) or not isinstance(min_gain, int | float) or not 0 <= min_gain < 1:
        raise InputError(f"topology plan: min_gain must be in [0, 1), got {min_gain!r}")
    if isinstance(max_candidates, bool) or not isinstance(max_candidates, int) or max_candidates < 1:
        raise InputError(f"topology plan: max_candidates must be a positive integer, got {max_candidates!r}")
    if healthy_s is not None:
        params = PlacementModel(layout, placement, params=params).calibrate(healthy_s).params
    model = PlacementModel(layout, placement, slow_ranks=slow_ranks, slow_links=slow_links, params=params,
                           rebalance=rebalance, microbatch_upper=microbatch_upper)
    if iteration_s is not None and healthy_s is None:
        model = model.calibrate(iteration_s)
    current = model.time()
    as_is_s = model.with_rebalance(False).time().total_s if model.rebalance else None
    generated = _link_moves(model) + _consolidations(model)
    if model.n_nodes <= EXHAUSTIVE_MAX_NODES:
        method = f"exhaustive ({math.factorial(model.n_nodes)} placements)"
        everything = _all_permutations(model.n_nodes)
        i, _ = _best(model, everything)
        search = everything[i]
        evaluated = len(everything)
    else:
        starts = [model.identity]
        if generated:
            gen = np.stack([s for s, _ in generated])
            starts.append(gen[_best(model, gen)[0]])
        search, evaluated = _local_search(model, starts)
        method = "local-search"
    pool: dict[tuple[int, ...], tuple[IntArray, str, str]] = {}
    for sigma, why in [(search, "best of the search"), *generated]:
        key = tuple(int(x) for x in sigma)
        if key != tuple(range(model.n_nodes)) and key not in pool:
            pool[key] = (sigma, why, "search" if why == "best of the search" else why.split(":")[0].split()[0])
    cands: list[PlacementCandidate] = []
    if pool:
        sigmas = np.stack([v[0] for v in pool.values()])
        times = model.times(sigmas)
        for (sigma, why, source), t in zip(pool.values(), times, strict=True):
            moved = tuple(int(x) for x in np.flatnonzero(sigma != model.identity))
            where = model.describe(sigma)
            cands.append(PlacementCandidate(placement=model.placement_of(sigma), predicted_s=float(t),
                                            why=f"{why}: {where}" if where else why,
                                            source="link" if source == "link" else source, moved=moved))
    # exact ties: fewer moved nodes first, then the search's pick (it also weighed edge stages)
    cands.sort(key=lambda c: (round(c.predicted_s, 12), len(c.moved), c.source != "search", c.placement))
    listed = cands[:max_candidates]
    if model.rebalance:  # the exact split of each listed placement (the search scored it on the makespan)
        listed = [replace(c, counts=model.split(model.sigma_of(c.placement)).counts) for c in listed]
    best = listed[0] if listed else None
    now_s = current.total_s
    # with rebalance, "now" is the current placement with its best split: what S2 alone would reach
    now = (f"{now_s:.3f} s with S2 alone (current placement, best split {list(current.counts or ())}; "
           f"{as_is_s:.3f} s as is)" if as_is_s is not None else f"{now_s:.3f} s now")
    split = f" with micro-batches {list(best.counts)}" if best is not None and best.counts is not None else ""
    if best is None:
        chosen = None
        if model.n_nodes == 1:
            reason = "no other placement exists (one node)"
        elif not model.suspects():
            reason = "nothing is slow: every placement predicts the same iteration time"
        else:
            reason = f"the current placement is already the best ({now})"
    elif best.predicted_s > (1.0 - min_gain) * now_s:
        chosen = None
        reason = (f"no placement beats the current one by {min_gain:.0%}: best {best.predicted_s:.3f} s{split} "
                  f"vs {now} ({1 - best.predicted_s / now_s:.1%})")
    else:
        chosen = best
        reason = (f"predicted {best.predicted_s:.3f} s{split} vs {now} "
                  f"({1 - best.predicted_s / now_s:.1%} faster), moving node(s) {', '.join(map(str, best.moved))}")
    return TopologyPlan(current_s=now_s, current=current, candidates=tuple(listed), chosen=chosen, reason=reason,
                        method=method, evaluated=evaluated, min_gain=float(min_gain), params=model.params,
                        rebalance=model.rebalance, as_is_s=as_is_s)


#: Compute slowdown assumed for a compute suspect whose factor the pace model cannot tell.
DEFAULT_SLOW_FACTOR: Final[float] = 2.0
#: Bandwidth share assumed left on a link suspect's NIC (the detector names the node, not the share).
DEFAULT_LINK_SHARE: Final[float] = 0.25


def suspect_slowness(layout: Layout, suspects: Sequence[Suspect], nodes: Sequence[str],
                     model: PaceModel | None = None) -> tuple[dict[int, float], dict[LinkKey, float]]:
    """The detector's suspects as `plan_topology`'s ``slow_ranks`` and ``slow_links``.

    A compute suspect's factor is its cell's time per micro-batch in the pace model over the median of the same
    stage in the other replicas (of the other stages with one replica), at least 1; without a usable model it
    is :data:`DEFAULT_SLOW_FACTOR`. A link suspect's node (by name, an index into `nodes`) gets
    :data:`DEFAULT_LINK_SHARE` of its NIC. Suspects outside the job are left out.
    """
    slow_ranks: dict[int, float] = {}
    slow_links: dict[LinkKey, float] = {}
    per_mb = model.per_mb if model is not None and model.per_mb.shape == (layout.dp, layout.pp) else None
    for s in suspects:
        try:  # a rank from alert labels may arrive as text
            rank = None if s.rank is None or isinstance(s.rank, bool) else int(s.rank)
        except (TypeError, ValueError):
            rank = None
        if s.kind == "compute" and rank is not None and 0 <= rank < layout.world_size:
            c = layout.coords(rank)
            factor = DEFAULT_SLOW_FACTOR
            if per_mb is not None:
                peers = np.delete(per_mb[:, c.pp], c.dp) if layout.dp > 1 else np.delete(per_mb[c.dp], c.pp)
                ref = float(np.median(peers)) if peers.size else 0.0
                if ref > 0 and math.isfinite(ref):
                    factor = max(1.0, float(per_mb[c.dp, c.pp]) / ref)
            slow_ranks[rank] = max(factor, slow_ranks.get(rank, 1.0))
        elif s.kind == "link" and s.node in nodes:
            slow_links[list(nodes).index(s.node)] = DEFAULT_LINK_SHARE
    return slow_ranks, slow_links

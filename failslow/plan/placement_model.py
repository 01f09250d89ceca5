"""The S3 topology planner's iteration-time model: what a placement of the job's nodes costs (pure).

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

Scoring is vectorised over placements; with ``rebalance`` each is scored under its own best micro-batch split
(:mod:`failslow.plan.placement_split`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Final

import numpy as np

from failslow.errors import InputError
from failslow.plan.microbatch import Rebalance
from failslow.plan.microbatch import rebalance as solve_split
from failslow.plan.placement_params import FloatArray, IntArray, LinkKey, PlacementParams
from failslow.plan.placement_split import min_makespan
from failslow.topology import Layout

#: Placements scored per numpy batch (bounds memory at large rank counts).
BATCH: Final[int] = 4096


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


def bisect_rising(fn: Callable[[float], float], target: float, lo: float, hi: float, steps: int) -> float:
    """The point in [lo, hi] where the rising `fn` reaches `target`, after `steps` halvings (the midpoint of
    the last bracket). `fn(lo) < target <= fn(hi)` is the caller's to ensure."""
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if fn(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


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
        for i in range(0, sigmas.shape[0], BATCH):
            pipe, ar, _ = self._evaluate(sigmas[i:i + BATCH])
            out[i:i + BATCH] = self.params.overhead_s + pipe + ar
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
        return scaled(bisect_rising(total, iteration_s, lo, hi, 80))

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

"""Parallel topology model: where every rank sits in a TP/CP/DP/PP job and which groups it talks in.

Everything that reasons about ranks (the exporter labelling series, the detector comparing DP and PP
peers, the remediator moving ranks between nodes, the testbed placing processes) needs the same answer
to "which tensor-, context-, data- and pipeline-parallel coordinates does rank r have, and on which
node does it run". This module gives that answer with Megatron-LM's rank order "tp-cp-dp-pp": tensor
parallelism varies fastest, then context, then data, then pipeline (slowest)::

    rank = tp + TP * (cp + CP * (dp + DP * pp))

so that TP groups are contiguous ranks (they share a node and its fast links) and pipeline stages are
the largest strides. Ranks fill nodes in order: ``node = rank // ranks_per_node``.

The model is pure arithmetic (no I/O); the vectorised forms (`Layout.coords_array`, `Layout.group_array`)
let callers work across all ranks of a 10k-GPU job with numpy instead of Python loops.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError

#: Group kinds accepted by `Layout.groups`, in the order their coordinates appear in the rank formula.
GROUP_KINDS: Final[tuple[str, ...]] = ("tp", "cp", "dp", "pp", "embedding")

# Column of each coordinate in `Layout.coords_array`.
_AXES: Final[dict[str, int]] = {"tp": 0, "cp": 1, "dp": 2, "pp": 3}


@dataclass(frozen=True)
class Coords:
    """Position of one rank in the parallel grid (all zero-based)."""

    tp: int
    cp: int
    dp: int
    pp: int


def _check_positive(name: str, value: object) -> int:
    # bool is an int subclass; `Layout(tp=True)` is a bug, not a size.
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise InputError(f"layout: {name} must be a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Layout:
    """Sizes of a hybrid-parallel job and the arithmetic that maps ranks to coordinates, groups and nodes.

    Attributes:
        tp: Tensor-parallel size.
        pp: Pipeline-parallel size (number of stages).
        dp: Data-parallel size (replicas).
        cp: Context-parallel size.
        vpp: Virtual-pipeline size (model chunks per stage, Megatron's interleaved schedule). It does not
            change rank placement; it is carried so schedule-aware code knows how many chunks a stage holds.
        ranks_per_node: Processes per node; ``None`` means the whole job runs on one node.

    Raises:
        InputError: a size is not a positive integer, ``vpp > 1`` without pipeline parallelism, or the
            world size is not a whole number of nodes.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    vpp: int = 1
    ranks_per_node: int | None = None

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "cp", "vpp"):
            object.__setattr__(self, name, _check_positive(name, getattr(self, name)))
        if self.vpp > 1 and self.pp == 1:
            raise InputError(f"layout: vpp={self.vpp} needs pipeline parallelism (pp > 1)")
        if self.ranks_per_node is not None:
            rpn = _check_positive("ranks_per_node", self.ranks_per_node)
            object.__setattr__(self, "ranks_per_node", rpn)
            if self.world_size % rpn:
                raise InputError(
                    f"layout: world size {self.world_size} (tp={self.tp} cp={self.cp} dp={self.dp} "
                    f"pp={self.pp}) is not a whole number of nodes of {rpn} ranks")

    # --- construction helpers -------------------------------------------------------------------

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> Layout:
        """Build a layout from a dict such as a testbed report's ``layout`` or a ring header.

        Unknown keys are ignored; missing sizes default to 1; ``0`` or ``None`` for ``ranks_per_node``
        means one node.

        Raises:
            InputError: when a value is not a positive integer.
        """
        if not isinstance(d, Mapping):
            raise InputError(f"layout: expected a mapping, got {type(d).__name__}")
        kwargs: dict[str, Any] = {}
        for key in ("tp", "pp", "dp", "cp", "vpp"):
            if d.get(key) is not None:
                kwargs[key] = d[key]
        rpn = d.get("ranks_per_node")
        if rpn:
            kwargs["ranks_per_node"] = rpn
        return cls(**kwargs)

    def to_dict(self) -> dict[str, int | None]:
        """The sizes as a plain dict (inverse of `from_mapping`)."""
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "cp": self.cp, "vpp": self.vpp,
                "ranks_per_node": self.ranks_per_node}

    # --- sizes ----------------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        """Total number of ranks, ``tp * cp * dp * pp``."""
        return self.tp * self.cp * self.dp * self.pp

    @property
    def num_nodes(self) -> int:
        """Number of nodes the job spans (1 when ``ranks_per_node`` is ``None``)."""
        return 1 if self.ranks_per_node is None else self.world_size // self.ranks_per_node

    # --- rank <-> coordinates -------------------------------------------------------------------

    def _check_rank(self, rank: int) -> int:
        if isinstance(rank, bool) or not isinstance(rank, int | np.integer) or not 0 <= rank < self.world_size:
            raise InputError(f"layout: rank {rank!r} outside 0..{self.world_size - 1}")
        return int(rank)

    def coords(self, rank: int) -> Coords:
        """Coordinates of ``rank``.

        Raises:
            InputError: ``rank`` is not in ``0 .. world_size-1``.
        """
        r = self._check_rank(rank)
        r, tp = divmod(r, self.tp)
        r, cp = divmod(r, self.cp)
        pp, dp = divmod(r, self.dp)
        return Coords(tp=tp, cp=cp, dp=dp, pp=pp)

    def rank_of(self, c: Coords) -> int:
        """Global rank at coordinates ``c`` (inverse of `coords`).

        Raises:
            InputError: a coordinate is outside its axis.
        """
        for name in ("tp", "cp", "dp", "pp"):
            v = getattr(c, name)
            size = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or not 0 <= v < size:
                raise InputError(f"layout: {name} coordinate {v!r} outside 0..{size - 1}")
        return int(c.tp + self.tp * (c.cp + self.cp * (c.dp + self.dp * c.pp)))

    def node_of(self, rank: int) -> int:
        """Node index of ``rank``: ranks fill nodes in order (``rank // ranks_per_node``)."""
        r = self._check_rank(rank)
        return 0 if self.ranks_per_node is None else r // self.ranks_per_node

    def coords_array(self) -> npt.NDArray[np.int64]:
        """Coordinates of every rank as a ``(world_size, 4)`` int array, columns ``tp, cp, dp, pp``.

        Row ``r`` is rank ``r``; this is the vectorised form of `coords` for per-rank numpy work.
        """
        r = np.arange(self.world_size, dtype=np.int64)
        out = np.empty((self.world_size, 4), dtype=np.int64)
        out[:, 0] = r % self.tp
        out[:, 1] = (r // self.tp) % self.cp
        out[:, 2] = (r // (self.tp * self.cp)) % self.dp
        out[:, 3] = r // (self.tp * self.cp * self.dp)
        return out

    def nodes_array(self) -> npt.NDArray[np.int64]:
        """Node index of every rank as a ``(world_size,)`` int array."""
        r = np.arange(self.world_size, dtype=np.int64)
        return np.zeros_like(r) if self.ranks_per_node is None else r // self.ranks_per_node

    # --- groups ---------------------------------------------------------------------------------

    def _stride(self, axis: str) -> int:
        return {"tp": 1, "cp": self.tp, "dp": self.tp * self.cp, "pp": self.tp * self.cp * self.dp}[axis]

    def _axis_group(self, rank: int, axis: str) -> tuple[int, ...]:
        # Members share every coordinate except `axis`; they differ by multiples of its stride.
        r = self._check_rank(rank)
        stride = self._stride(axis)
        size: int = getattr(self, axis)
        mine = (r // stride) % size
        base = r - mine * stride
        return tuple(base + i * stride for i in range(size))

    def tp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks that shard the same layers with ``rank`` (same cp, dp, pp), in tp order."""
        return self._axis_group(rank, "tp")

    def cp_group(self, rank: int) -> tuple[int, ...]:
        """Ranks that split the same sequence with ``rank`` (same tp, dp, pp), in cp order."""
        return self._axis_group(rank, "cp")

    def dp_group(self, rank: int) -> tuple[int, ...]:
        """Replicas of ``rank`` that all-reduce gradients with it (same tp, cp, pp), in dp order."""
        return self._axis_group(rank, "dp")

    def pp_group(self, rank: int) -> tuple[int, ...]:
        """The pipeline ``rank`` belongs to (same tp, cp, dp), ordered first stage to last."""
        return self._axis_group(rank, "pp")

    def embedding_group(self, rank: int) -> tuple[int, ...]:
        """Ranks that tie the input and output embeddings with ``rank``: first and last stage of its pipeline.

        Follows Megatron-LM: with one stage the group is the rank alone. Ranks on middle stages are in
        no embedding group and get the empty tuple.
        """
        pipe = self.pp_group(rank)
        members = (pipe[0],) if len(pipe) == 1 else (pipe[0], pipe[-1])
        return members if self._check_rank(rank) in members else ()

    def group_array(self, kind: str) -> npt.NDArray[np.int64]:
        """All groups of ``kind`` as a 2-D int array, one group per row (vectorised `groups`).

        Raises:
            InputError: unknown ``kind``.
        """
        if kind == "embedding":
            pipes = self.group_array("pp")
            return pipes[:, :1] if self.pp == 1 else pipes[:, [0, -1]]
        if kind not in _AXES:
            raise InputError(f"layout: unknown group kind {kind!r}; expected one of {', '.join(GROUP_KINDS)}")
        # View ranks as a grid indexed [pp, dp, cp, tp] and move the wanted axis last.
        grid = np.arange(self.world_size, dtype=np.int64).reshape(self.pp, self.dp, self.cp, self.tp)
        axis = {"pp": 0, "dp": 1, "cp": 2, "tp": 3}[kind]
        moved = np.moveaxis(grid, axis, -1)
        rows = moved.reshape(-1, moved.shape[-1])
        # Order groups by their smallest member so the listing is stable and readable.
        return rows[np.argsort(rows[:, 0], kind="stable")]

    def groups(self, kind: str) -> list[tuple[int, ...]]:
        """Every group of ``kind`` (``tp``, ``cp``, ``dp``, ``pp`` or ``embedding``), sorted by first member.

        For the axis kinds the groups partition the world; embedding groups cover only first and last
        pipeline stages.

        Raises:
            InputError: unknown ``kind``.
        """
        return [tuple(int(x) for x in row) for row in self.group_array(kind)]

    def ring_node_pairs(self, group: tuple[int, ...]) -> list[tuple[int, int]]:
        """Inter-node hops of the ring a collective over ``group`` uses, as directed ``(from, to)`` node pairs.

        The ring visits the members in the given order and wraps from the last back to the first (the
        order NCCL's ring takes for ranks listed in node order). Hops inside one node are omitted; a
        link crossed twice appears twice, so the list length is the number of inter-node transfers per
        ring step. A single-member group has no hops.

        Raises:
            InputError: an empty group, a repeated member, or a rank outside the world.
        """
        members = [self._check_rank(r) for r in group]
        if not members:
            raise InputError("layout: ring_node_pairs needs a non-empty group")
        if len(set(members)) != len(members):
            raise InputError(f"layout: group {tuple(group)} repeats a rank")
        if len(members) == 1:
            return []
        nodes = [self.node_of(r) for r in members]
        hops = zip(nodes, nodes[1:] + nodes[:1], strict=True)
        return [(a, b) for a, b in hops if a != b]

    def describe(self) -> str:
        """Short human-readable form, e.g. ``TP2xCP1xDP2xPP2 (8 ranks, 2 nodes x 4)``."""
        nodes = "1 node" if self.ranks_per_node is None else f"{self.num_nodes} nodes x {self.ranks_per_node}"
        vpp = f"xVPP{self.vpp}" if self.vpp > 1 else ""
        return f"TP{self.tp}xCP{self.cp}xDP{self.dp}xPP{self.pp}{vpp} ({self.world_size} ranks, {nodes})"


@dataclass(frozen=True)
class ObservedComm:
    """What one rank's call records tell about a communicator it uses.

    Attributes:
        nranks: Communicator size.
        comm_rank: The rank's position in it.
        collective: Collectives were issued on it (all-reduce, all-gather, ...).
        peers: Peers (communicator ranks) of its Send/Recv calls.
    """

    nranks: int
    comm_rank: int
    collective: bool = True
    peers: tuple[int, ...] = ()


def group_kind(layout: Layout, rank: int, comm: ObservedComm) -> str:
    """Which parallel group of ``rank`` a communicator is: ``tp``, ``cp``, ``dp``, ``pp``, ``world`` or ``unknown``.

    A communicator matches a group when its size and the rank's position in it agree with the layout
    (positions follow the group order of `Layout.tp_group` etc.); one with Send/Recv peers is matched
    to the pipeline group first, a collective one to tp/cp/dp first. When several groups fit (TP = DP and the rank sits at the same
    position in both) the candidates are joined with ``|`` in axis order, e.g. ``tp|dp``.
    """
    if comm.nranks == layout.world_size and comm.comm_rank == rank:
        return "world"
    c = layout.coords(rank)

    def fits(k: str) -> bool:
        return bool(getattr(layout, k) == comm.nranks > 1 and getattr(c, k) == comm.comm_rank)

    # Send/Recv mark a pipeline group; collectives prefer the other axes (pipeline groups rarely
    # carry collectives) and fall back to it.
    hits = ["pp"] if comm.peers and fits("pp") else [k for k in ("tp", "cp", "dp") if fits(k)]
    if not hits and fits("pp"):
        hits = ["pp"]
    return "|".join(hits) if hits else "unknown"


def infer_layout(world_size: int, rank: int, comms: list[ObservedComm],
                 ranks_per_node: int | None = None) -> Layout | None:
    """Guess the TP/DP/PP layout (CP = 1) of a job from the communicators one of its ranks uses.

    Every factorisation ``tp * dp * pp = world_size`` is checked against the observations: each
    communicator smaller than the world must be one of the rank's groups (same size, same position);
    Send/Recv peers on a world-sized communicator must be the rank's pipeline neighbours; and every
    axis larger than one must show up in some communicator (each in a different one). When several
    factorisations survive because one collective communicator could be either the TP or the DP group,
    the one with the largest DP is taken; ``None`` when the observations fit no layout or stay ambiguous.

    Raises:
        InputError: ``rank`` outside the world, or a non-positive world size.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise InputError(f"infer_layout: rank {rank} outside a world of {world_size}")
    survivors: list[Layout] = []
    for tp in range(1, world_size + 1):
        if world_size % tp:
            continue
        for dp in range(1, world_size // tp + 1):
            if (world_size // tp) % dp:
                continue
            pp = world_size // (tp * dp)
            rpn = ranks_per_node if ranks_per_node and world_size % ranks_per_node == 0 else None
            lay = Layout(tp=tp, dp=dp, pp=pp, ranks_per_node=rpn)
            if _consistent(lay, rank, comms):
                survivors.append(lay)
    if len(survivors) > 1:
        # One collective communicator cannot say whether it is TP or DP: take the data-parallel
        # reading (gradient all-reduce is in every job, tensor parallelism is not).
        top = max(s.dp for s in survivors)
        survivors = [s for s in survivors if s.dp == top]
    return survivors[0] if len(survivors) == 1 else None


def _consistent(lay: Layout, rank: int, comms: list[ObservedComm]) -> bool:
    c = lay.coords(rank)
    stride = lay.tp * lay.cp * lay.dp
    options: list[set[str]] = []  # which axes each communicator could be
    for oc in comms:
        if oc.nranks <= 1:
            continue
        if oc.nranks == lay.world_size:
            if oc.comm_rank != rank:
                return False
            opts = {k for k in ("tp", "dp") if getattr(lay, k) == lay.world_size and oc.collective}
            if oc.peers:
                # Send/Recv over the world communicator: peers must be pipeline neighbours
                if not set(oc.peers) <= {rank - stride, rank + stride}:
                    return False
                opts.add("pp")
            options.append(opts)
            continue
        opts = set()
        for kind in ("tp", "cp", "dp", "pp"):
            if getattr(lay, kind) != oc.nranks or getattr(c, kind) != oc.comm_rank:
                continue
            if kind == "pp":
                # pipeline groups are recognised by their Send/Recv between neighbouring stages
                if oc.peers and set(oc.peers) <= {c.pp - 1, c.pp + 1}:
                    opts.add(kind)
            elif not oc.peers or oc.collective:
                opts.add(kind)
        if not opts:
            return False
        options.append(opts)
    # Every axis the layout splits must be some communicator in use, each by a different one.
    needed = [k for k in ("tp", "dp", "pp") if getattr(lay, k) > 1]
    return any(all(k in options[i] for k, i in zip(needed, pick, strict=True))
               for pick in itertools.permutations(range(len(options)), len(needed)))

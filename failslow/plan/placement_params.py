"""The S3 topology planner's traffic and time parameters (:class:`PlacementParams`) and the types its parts share.

What one iteration of the job computes and moves, as the placement model (:mod:`failslow.plan.placement_model`)
takes it: micro-batches per replica, compute per stage, bytes per pipeline hop, per gradient and per
tensor-parallel all-reduce, the bandwidths and the overhead.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

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

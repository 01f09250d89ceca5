"""The S3 topology planner's search over node permutations (pure).

Up to :data:`EXHAUSTIVE_MAX_NODES` nodes every permutation is scored (:func:`all_permutations`, vectorised by
the model), so the best is exact; above, :func:`local_search` takes the best swap of a suspect node with any
node while it improves. :func:`best_of` settles exact ties: the fewest moved nodes, then the fewest slow slots
on an edge stage.
"""

from __future__ import annotations

import itertools
import math
from typing import Final

import numpy as np

from failslow.plan.placement_model import BATCH, PlacementModel
from failslow.plan.placement_moves import swap
from failslow.plan.placement_params import FloatArray, IntArray

#: Node counts up to this are searched exhaustively (8! = 40,320 placements).
EXHAUSTIVE_MAX_NODES: Final[int] = 8


def all_permutations(n: int) -> IntArray:
    """Every permutation of `n` nodes, one per row, in lexicographic order."""
    return np.asarray(list(itertools.permutations(range(n))), dtype=np.int64).reshape(-1, n)


def best_of(model: PlacementModel, sigmas: IntArray) -> tuple[int, FloatArray]:
    """Index of the best row (ties: fewest moved nodes, fewest slow slots on edge stages, then first)."""
    times = model.times(sigmas)
    tol = 1e-9 * max(float(times.min()), 1e-12)
    tied = np.flatnonzero(times <= times.min() + tol)
    moved = (sigmas[tied] != model.identity[None, :]).sum(axis=1)
    edge = np.concatenate([model._evaluate(sigmas[tied[i:i + BATCH]])[2] for i in range(0, tied.size, BATCH)])
    pick = np.lexsort((tied, edge, moved))[0]
    return int(tied[pick]), times


def local_search(model: PlacementModel, starts: list[IntArray]) -> tuple[IntArray, int]:
    """Best-improvement swaps of a suspect node with any node, from each start; the best end point."""
    suspects = model.suspects()
    evaluated = 0
    best_sigma, best_t = model.identity, math.inf
    for start in starts:
        sigma = start.copy()
        t = float(model.times(sigma[None, :])[0])
        evaluated += 1
        for _ in range(4 * len(suspects) + 4):
            moves = [swap(sigma, x, y) for x in suspects for y in range(model.n_nodes) if y != x]
            if not moves:
                break
            cand = np.stack(moves)
            i, times = best_of(model, cand)
            evaluated += len(moves)
            if times[i] >= t * (1.0 - 1e-12):
                break
            sigma, t = cand[i], float(times[i])
        if t < best_t * (1.0 - 1e-12):
            best_sigma, best_t = sigma, t
    return best_sigma, evaluated

"""The S3 topology planner's generated candidates, each with its reason (pure).

Besides the search (:mod:`failslow.plan.placement_search`), two families of placements are generated, scored
and listed: link moves (FALCON's node swap: a congested node, or an end of a congested path, with every other
node) and consolidation (the slow nodes into ``ceil(k / nodes per stage)`` stages, interior stages first; when
the model rebalances, also into as few DP replicas as possible, which S2 can then unload). A placement is a
node permutation ``sigma`` (:mod:`failslow.plan.placement_model`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from failslow.plan.placement_model import PlacementModel
from failslow.plan.placement_params import IntArray


def swap(sigma: IntArray, x: int, y: int) -> IntArray:
    """`sigma` with physical nodes `x` and `y` exchanged."""
    out = sigma.copy()
    ix, iy = np.flatnonzero(out == x)[0], np.flatnonzero(out == y)[0]
    out[ix], out[iy] = y, x
    return out


def link_moves(model: PlacementModel) -> list[tuple[IntArray, str]]:
    """FALCON's node swap: every congested node (or end of a congested path) with every other node."""
    ends: list[int] = [int(x) for x in np.flatnonzero(model.nic < 1.0)]
    for a, b in zip(*np.nonzero(np.triu(model.path < 1.0)), strict=True):
        ends += [int(a), int(b)]
    out: list[tuple[IntArray, str]] = []
    for x in dict.fromkeys(ends):
        for y in range(model.n_nodes):
            if y != x:
                out.append((swap(model.identity, x, y), f"link move: swap node {x} with node {y}"))
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


def consolidations(model: PlacementModel) -> list[tuple[IntArray, str]]:
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
            sigma = swap(sigma, node, int(sigma[u]))
        if not np.array_equal(sigma, model.identity):
            out.append((sigma, f"consolidate {len(slow)} slow node(s) into {label} {','.join(map(str, combo))}"))
    return out

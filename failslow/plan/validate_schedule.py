"""FALCON's O(1)-round link tests, pure: which node pairs of a communicator measure their link in which round.

The nodes of the suspect communicator test their links pairwise with point-to-point transfers. A ring over n
nodes has n links (one for n = 2); testing them one at a time would take n rounds. FALCON's O(1)-round
schedule runs disjoint pairs at the same time: :func:`ring_schedule` measures every ring link in two rounds of
disjoint pairs when n is even (links starting at even positions, then at odd positions) and three when n is
odd (the wrap-around link closes an odd cycle and gets a round of its own). For tree collectives
:func:`tree_schedule` colours the tree's edges properly with as many colours as the tree's largest degree Δ
(trees are bipartite, so Δ colours suffice — König's edge-colouring theorem; the greedy colouring from the
root below reaches it), one round per colour: 3 rounds for the binary trees (:func:`binary_tree_edges`)
NCCL's tree algorithm uses, whatever their size.

What the rounds measured is judged in :mod:`failslow.plan.validate`, which re-exports these names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from failslow.errors import InputError

Edge = tuple[int, int]
Kind = Literal["ring", "tree"]


@dataclass(frozen=True)
class LinkSchedule:
    """Rounds of disjoint node pairs that together measure every link of a communicator once.

    Attributes:
        kind: ``"ring"`` or ``"tree"``.
        nodes: The communicator's nodes (ring order for a ring).
        rounds: One tuple of ``(a, b)`` pairs per round; no node appears twice in a round.
    """

    kind: str
    nodes: tuple[int, ...]
    rounds: tuple[tuple[Edge, ...], ...]

    @property
    def edges(self) -> tuple[Edge, ...]:
        """Every measured link, round by round."""
        return tuple(e for r in self.rounds for e in r)

    def to_json(self) -> dict[str, Any]:
        """JSON-able form."""
        return {"kind": self.kind, "nodes": list(self.nodes), "rounds": [[list(e) for e in r] for r in self.rounds]}


def _check_nodes(nodes: Sequence[int], what: str) -> tuple[int, ...]:
    out = tuple(int(n) for n in nodes)
    if len(out) < 2:
        raise InputError(f"{what}: need at least 2 nodes to test a link, got {list(out)}")
    if len(set(out)) != len(out):
        raise InputError(f"{what}: nodes repeat in {list(out)}")
    return out


def ring_edges(nodes: Sequence[int]) -> list[Edge]:
    """The links of a ring over `nodes` in order: ``(nodes[i], nodes[i+1 mod n])``; one link when n = 2.

    Raises:
        InputError: fewer than 2 nodes or a repeated node.
    """
    ns = _check_nodes(nodes, "ring")
    if len(ns) == 2:
        return [(ns[0], ns[1])]
    return [(ns[i], ns[(i + 1) % len(ns)]) for i in range(len(ns))]


def ring_schedule(nodes: Sequence[int]) -> LinkSchedule:
    """FALCON's O(1)-round test schedule of a ring: every link once, in at most 3 rounds of disjoint pairs.

    Link i joins positions i and i+1 (mod n). Links at even i share no node, nor do links at odd i, so an even
    ring takes two rounds. In an odd ring the last link (n-1, 0) has an even index and meets link 0 at node 0,
    so it gets a third round of its own. Two nodes have one link and one round.

    Raises:
        InputError: fewer than 2 nodes or a repeated node.
    """
    ns = _check_nodes(nodes, "ring")
    edges = ring_edges(ns)
    n = len(ns)
    if n == 2:
        return LinkSchedule("ring", ns, ((edges[0],),))
    even = tuple(edges[i] for i in range(0, n, 2) if not (n % 2 and i == n - 1))
    odd = tuple(edges[i] for i in range(1, n, 2))
    rounds = [even, odd]
    if n % 2:
        rounds.append((edges[n - 1],))
    return LinkSchedule("ring", ns, tuple(rounds))


def binary_tree_edges(nodes: Sequence[int]) -> list[Edge]:
    """The links of a binary tree over `nodes` in heap order (the parent of position i is (i-1)//2).

    Every node has at most three links (parent and two children), so :func:`tree_schedule` needs at most three
    rounds for any size.

    Raises:
        InputError: fewer than 2 nodes or a repeated node.
    """
    ns = _check_nodes(nodes, "tree")
    return [(ns[(i - 1) // 2], ns[i]) for i in range(1, len(ns))]


def tree_schedule(nodes: Sequence[int], edges: Iterable[Edge] | None = None) -> LinkSchedule:
    """The test schedule of a tree: a proper edge colouring with Δ colours (Δ = largest degree), a round per colour.

    Greedy from the root (``nodes[0]``) breadth first: each node gives its child links the colours
    0, 1, … skipping the colour of the link to its parent. A node of degree d uses d colours, at most Δ, and
    two links sharing a node always differ, so each round is a set of disjoint pairs.

    Args:
        nodes: The tree's nodes; the first is the root.
        edges: Its links as pairs of nodes; default :func:`binary_tree_edges` of `nodes`.

    Raises:
        InputError: fewer than 2 nodes, a repeated node, or `edges` that do not form a tree over `nodes`.
    """
    ns = _check_nodes(nodes, "tree")
    es = binary_tree_edges(ns) if edges is None else [(int(a), int(b)) for a, b in edges]
    known = set(ns)
    adj: dict[int, list[int]] = {n: [] for n in ns}
    seen: set[frozenset[int]] = set()
    for a, b in es:
        key = frozenset((a, b))
        if a not in known or b not in known or a == b or key in seen:
            raise InputError(f"tree: link {(a, b)} is not a new link between two distinct listed nodes")
        seen.add(key)
        adj[a].append(b)
        adj[b].append(a)
    if len(es) != len(ns) - 1:
        raise InputError(f"tree: {len(ns)} nodes need {len(ns) - 1} links, got {len(es)}")
    colour: dict[frozenset[int], int] = {}
    parent_colour: dict[int, int] = {ns[0]: -1}
    queue = [ns[0]]
    for v in queue:  # breadth first; the list grows while we walk it
        c = 0
        for w in adj[v]:
            if w in parent_colour:
                continue  # v's parent
            if c == parent_colour[v]:
                c += 1
            colour[frozenset((v, w))] = c
            parent_colour[w] = c
            queue.append(w)
            c += 1
    if len(queue) != len(ns):
        raise InputError("tree: the links do not connect every node")
    rounds: dict[int, list[Edge]] = {}
    for a, b in es:
        rounds.setdefault(colour[frozenset((a, b))], []).append((a, b))
    return LinkSchedule("tree", ns, tuple(tuple(rounds[c]) for c in sorted(rounds)))


def link_schedule(nodes: Sequence[int], kind: Kind = "ring") -> LinkSchedule:
    """:func:`ring_schedule` or (binary) :func:`tree_schedule` of `nodes`.

    Raises:
        InputError: an unknown kind, or bad nodes.
    """
    if kind == "ring":
        return ring_schedule(nodes)
    if kind == "tree":
        return tree_schedule(nodes)
    raise InputError(f"unknown link schedule kind {kind!r} (ring or tree)")


def merge_schedules(schedules: Sequence[LinkSchedule]) -> tuple[tuple[Edge, ...], ...]:
    """Rounds of several schedules over disjoint node sets run side by side (round k of each in round k).

    Raises:
        InputError: two schedules share a node (their pairs would not be disjoint).
    """
    used: set[int] = set()
    for s in schedules:
        if used & set(s.nodes):
            raise InputError(f"schedules share nodes {sorted(used & set(s.nodes))}")
        used |= set(s.nodes)
    depth = max((len(s.rounds) for s in schedules), default=0)
    return tuple(tuple(e for s in schedules if k < len(s.rounds) for e in s.rounds[k]) for k in range(depth))

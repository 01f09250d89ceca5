"""Synthetic call timings of a DP x PP job for the culprit tests, and what an exporter would publish of them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from failslow.record import RECV, SEND, Calls
from failslow.topology import Layout

ALLREDUCE = 1


def simulate(layout: Layout, *, slow_rank: int | None = None, slow_factor: float = 2.0,
             slow_node: int | None = None, link_factor: float = 3.0, iters: int = 20,
             seed: int = 0, slow_stage: int | None = None,
             stage_work: dict[int, float] | None = None, stage_factor: float | None = None,
             microbatches: list[int] | None = None, step: float = 0.001) -> Calls:
    """A DP x PP job: per micro-batch, stage s computes and sends activations to s+1; gradients flow back
    (compute, send to s-1), micro-batch by micro-batch (GPipe order); then each stage all-reduces over DP
    and takes an optimizer step of ``step`` seconds.

    Compute times carry 2 % jitter; a slow rank computes ``slow_factor`` times longer (its step too), so
    does every rank of ``slow_stage``; stage s does ``stage_work[s]`` units of work (default 1); every
    transfer that touches ``slow_node`` from another node takes ``link_factor`` times longer;
    ``microbatches`` gives each DP replica's count (default: one each).
    """
    rng = np.random.default_rng(seed)
    cols: dict[str, list[float]] = {k: [] for k in
                                    ("rank", "comm", "seq", "op", "nranks", "comm_rank", "peer", "nbytes",
                                     "start", "end")}
    seqs = dict.fromkeys(range(layout.world_size), 0)

    def add(rank: int, comm: int, op: int, nranks: int, comm_rank: int, peer: int, start: float, end: float,
            nbytes: int) -> None:
        for k, v in (("rank", rank), ("comm", comm), ("seq", seqs[rank]), ("op", op), ("nranks", nranks),
                     ("comm_rank", comm_rank), ("peer", peer), ("nbytes", nbytes), ("start", start),
                     ("end", end)):
            cols[k].append(v)
        seqs[rank] += 1

    def link_cost(ranks: tuple[int, ...], base: float) -> float:
        nodes = {layout.node_of(r) for r in ranks}
        return base * link_factor if slow_node is not None and slow_node in nodes and len(nodes) > 1 else base

    dp_groups = layout.groups("dp")
    pp_groups = layout.groups("pp")
    dp_comm = {g: 1000 + i for i, g in enumerate(dp_groups)}
    pp_comm = {g: 2000 + i for i, g in enumerate(pp_groups)}
    t = np.zeros(layout.world_size)  # when each rank is free
    for _ in range(iters):
        ready = t.copy()
        for g in pp_groups:  # one pipeline replica per pp group
            works: dict[tuple[int, int], float] = {}
            for mb in range((microbatches or [1] * layout.dp)[layout.coords(g[0]).dp]):
                for s, r in enumerate(g):
                    work = (0.010 * (1 + 0.02 * rng.standard_normal()) * (stage_work or {}).get(s, 1.0)
                            * (slow_factor if r == slow_rank else 1.0)
                            * ((stage_factor or slow_factor) if s == slow_stage else 1.0))
                    if s > 0:  # receive activations from the previous stage
                        src = g[s - 1]
                        send_start = ready[src]
                        recv_start = ready[r]
                        xfer = link_cost((src, r), 0.002)
                        done = max(send_start, recv_start) + xfer
                        add(src, pp_comm[g], SEND, len(g), s - 1, s, send_start, done, 4096)
                        add(r, pp_comm[g], RECV, len(g), s, s - 1, recv_start, done, 4096)
                        ready[src] = done
                        ready[r] = done + work
                    else:
                        ready[r] = ready[r] + work
                    works[(mb, r)] = work
            for mb in range(len(works) // len(g)):
                # Backward: gradients flow from the last stage down; each stage computes, then sends.
                for s in range(len(g) - 1, 0, -1):
                    r, dst = g[s], g[s - 1]
                    send_start, recv_start = ready[r] + works[(mb, r)], ready[dst]
                    done = max(send_start, recv_start) + link_cost((r, dst), 0.002)
                    add(r, pp_comm[g], SEND, len(g), s, s - 1, send_start, done, 4096)
                    add(dst, pp_comm[g], RECV, len(g), s - 1, s, recv_start, done, 4096)
                    ready[r] = done
                    ready[dst] = max(ready[dst], done)
                ready[g[0]] += works[(mb, g[0])]
        for g in dp_groups:
            arrive = max(ready[r] for r in g)
            done = arrive + link_cost(g, 0.005)
            for cr, r in enumerate(g):
                add(r, dp_comm[g], ALLREDUCE, len(g), cr, -1, ready[r], done + 1e-5 * rng.random(), 1 << 20)
                t[r] = done + step * (slow_factor if r == slow_rank else 1.0)
    return Calls.from_columns(**cols)


def dp_peers(layout: Layout) -> Callable[[int], tuple[int, ...]]:
    return lambda r: layout.dp_group(r)


def group_role(layout: Layout) -> Callable[[tuple[int, ...]], str]:
    dp = {tuple(sorted(g)) for g in layout.groups("dp")}
    return lambda ranks: "dp" if ranks in dp else "pp"


def pp_stage(layout: Layout) -> Callable[[int], int]:
    return lambda r: layout.coords(r).pp


def aggregate(calls: Calls, layout: Layout) -> tuple[dict[int, float], dict[int, dict[int, float]],
                                                      dict[int, str]]:
    """What an exporter would publish: time outside calls per rank, mean call time per (comm, rank)."""
    outside = {}
    span = float(calls.end.max() - calls.start.min())
    for r in range(layout.world_size):
        m = calls.rank == r
        outside[r] = span - float(np.sum(calls.end[m] - calls.start[m]))
    group: dict[int, dict[int, float]] = {}
    kind: dict[int, str] = {}
    for comm in set(calls.comm.tolist()):
        m = calls.comm == comm
        group[comm] = {int(r): float(np.mean((calls.end - calls.start)[m & (calls.rank == r)]))
                       for r in set(calls.rank[m].tolist())}
        kind[comm] = "dp" if np.any(calls.op[m] == ALLREDUCE) else "pp"
    return outside, group, kind

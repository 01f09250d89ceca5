"""Culprit analysis on synthetic call timings: a slow rank, a slow node link, healthy jobs, bad input."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from failslow.culprit import RECV, SEND, Calls, analyse, match_instances
from failslow.errors import InputError
from failslow.topology import Layout

ALLREDUCE = 1


def simulate(layout: Layout, *, slow_rank: int | None = None, slow_factor: float = 2.0,
             slow_node: int | None = None, link_factor: float = 3.0, iters: int = 20,
             seed: int = 0, slow_stage: int | None = None,
             stage_work: dict[int, float] | None = None, stage_factor: float | None = None) -> Calls:
    """A DP x PP job: stage s computes, sends activations to s+1; gradients flow back (compute, send to s-1);
    then each stage all-reduces over DP.

    Compute times carry 2 % jitter; a slow rank computes ``slow_factor`` times longer, so does every rank
    of ``slow_stage``; stage s does ``stage_work[s]`` units of work (default 1); every transfer that
    touches ``slow_node`` from another node takes ``link_factor`` times longer.
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
    works: dict[int, float] = {}
    for _ in range(iters):
        ready = t.copy()
        for g in pp_groups:  # one pipeline replica per pp group
            for s, r in enumerate(g):
                work = (0.010 * (1 + 0.02 * rng.standard_normal()) * (stage_work or {}).get(s, 1.0)
                        * (slow_factor if r == slow_rank else 1.0)
                        * ((stage_factor or slow_factor) if s == slow_stage else 1.0))
                if s > 0:  # receive activations from the previous stage
                    src = g[s - 1]
                    send_start = ready[src]
                    recv_start = t[r]
                    xfer = link_cost((src, r), 0.002)
                    done = max(send_start, recv_start) + xfer
                    add(src, pp_comm[g], SEND, len(g), s - 1, s, send_start, done, 4096)
                    add(r, pp_comm[g], RECV, len(g), s, s - 1, recv_start, done, 4096)
                    ready[src] = done
                    ready[r] = done + work
                else:
                    ready[r] = t[r] + work
                works[r] = work
            # Backward: gradients flow from the last stage down; each stage computes, then sends.
            for s in range(len(g) - 1, 0, -1):
                r, dst = g[s], g[s - 1]
                send_start, recv_start = ready[r] + works[r], ready[dst]
                done = max(send_start, recv_start) + link_cost((r, dst), 0.002)
                add(r, pp_comm[g], SEND, len(g), s, s - 1, send_start, done, 4096)
                add(dst, pp_comm[g], RECV, len(g), s - 1, s, recv_start, done, 4096)
                ready[r] = ready[dst] = done
            ready[g[0]] += works[g[0]]
        for g in dp_groups:
            arrive = max(ready[r] for r in g)
            done = arrive + link_cost(g, 0.005)
            for cr, r in enumerate(g):
                add(r, dp_comm[g], ALLREDUCE, len(g), cr, -1, ready[r], done + 1e-5 * rng.random(), 1 << 20)
                t[r] = done + 0.001
    return Calls.from_columns(**cols)


def _dp_peers(layout: Layout) -> Callable[[int], tuple[int, ...]]:
    return lambda r: layout.dp_group(r)


def _role(layout: Layout) -> Callable[[tuple[int, ...]], str]:
    dp = {tuple(sorted(g)) for g in layout.groups("dp")}
    return lambda ranks: "dp" if ranks in dp else "pp"


@pytest.mark.parametrize("slow_rank", [0, 3, 5])
def test_names_the_slow_rank_not_its_victims(slow_rank: int) -> None:
    lay = Layout(dp=3, pp=2, ranks_per_node=1)
    a = analyse(simulate(lay, slow_rank=slow_rank), node_of=lay.node_of, peers_of=_dp_peers(lay),
                group_role=_role(lay))
    assert [c.rank for c in a.compute] == [slow_rank]
    assert a.link == []
    top = a.culprits[0]
    assert top.kind == "compute" and top.confidence > 0.5
    assert top.evidence["outside_calls_ratio"] == pytest.approx(2.0, rel=0.1)


@pytest.mark.parametrize("slow_node", [1, 4])
def test_names_the_slow_node_link_not_its_victims(slow_node: int) -> None:
    lay = Layout(dp=3, pp=2, ranks_per_node=1)
    a = analyse(simulate(lay, slow_node=slow_node), node_of=lay.node_of, peers_of=_dp_peers(lay),
                group_role=_role(lay))
    assert a.compute == [], a.compute
    assert [c.node for c in a.link] == [slow_node]
    assert set(a.link[0].ranks) >= {slow_node}
    assert all(slow_node in {lay.node_of(r) for r in g.ranks} for g in a.groups if g.slow)


def test_healthy_job_has_no_culprit() -> None:
    lay = Layout(dp=4, pp=2, ranks_per_node=2)
    a = analyse(simulate(lay), node_of=lay.node_of, peers_of=_dp_peers(lay), group_role=_role(lay))
    assert a.culprits == []
    assert {g.kind.split(":")[0] for g in a.groups} == {"coll", "fwd", "bwd"}


def _stage(layout: Layout) -> Callable[[int], int]:
    return lambda r: layout.coords(r).pp


@pytest.mark.parametrize("slow_stage", [0, 1, 2])
def test_names_the_slow_stage_not_its_victims(slow_stage: int) -> None:
    lay = Layout(dp=3, pp=3, ranks_per_node=1)
    a = analyse(simulate(lay, slow_stage=slow_stage), node_of=lay.node_of, peers_of=_dp_peers(lay),
                group_role=_role(lay), stage_of=_stage(lay))
    stage_ranks = sorted(r for r in range(lay.world_size) if lay.coords(r).pp == slow_stage)
    # DP peers share the slowness: no single rank is named, the stage is.
    assert [(c.stage, sorted(c.ranks), c.rank) for c in a.compute] == [(slow_stage, stage_ranks, None)]
    assert a.link == []
    ev = a.compute[0].evidence
    assert ev["stage_compute_ratio"] == pytest.approx(2.0, rel=0.1)
    assert a.compute[0].confidence > 0.5


def test_stage_work_normalises_a_planned_imbalance() -> None:
    lay = Layout(dp=2, pp=3, ranks_per_node=1)
    work = {0: 1.0, 1: 2.0, 2: 1.0}  # stage 1 holds twice the layers by design
    calls = simulate(lay, stage_work=work)
    kw = {"node_of": lay.node_of, "peers_of": _dp_peers(lay), "group_role": _role(lay), "stage_of": _stage(lay)}
    assert [c.stage for c in analyse(calls, **kw).compute] == [1]  # blind to the plan: stage 1 looks slow
    assert analyse(calls, stage_work=work, **kw).culprits == []
    slow = simulate(lay, stage_work=work, slow_stage=2)
    assert [c.stage for c in analyse(slow, stage_work=work, **kw).compute] == [2]


def test_rank_suspects_reconciled_with_a_slow_stage() -> None:
    lay = Layout(dp=3, pp=2, ranks_per_node=1)
    kw = {"node_of": lay.node_of, "peers_of": _dp_peers(lay), "group_role": _role(lay), "stage_of": _stage(lay)}
    stage0 = [r for r in range(lay.world_size) if lay.coords(r).pp == 0]
    stage1 = [r for r in range(lay.world_size) if lay.coords(r).pp == 1]
    # A rank of the slow stage that is a little slower still: explained by its stage.
    a = analyse(simulate(lay, slow_stage=0, stage_factor=2.0, slow_rank=stage0[1], slow_factor=1.3), **kw)
    assert [(c.stage, c.rank) for c in a.compute] == [(0, None)]
    # A rank elsewhere slower than its peers by less than the stage's excess: hidden behind the bottleneck.
    a = analyse(simulate(lay, slow_stage=0, stage_factor=2.0, slow_rank=stage1[1], slow_factor=1.3), **kw)
    assert [(c.stage, c.rank) for c in a.compute] == [(0, None)]
    # Two real faults at once: a starved rank elsewhere with a larger excess is named too.
    a = analyse(simulate(lay, slow_stage=0, stage_factor=1.5, slow_rank=stage1[1], slow_factor=3.0), **kw)
    assert sorted((c.stage if c.stage is not None else -1, c.rank if c.rank is not None else -1)
                  for c in a.compute) == [(-1, stage1[1]), (0, -1)]


@pytest.mark.parametrize("fault", [{"slow_rank": 3}, {"slow_node": 2}, {}])
def test_stage_comparison_keeps_other_verdicts(fault: dict[str, int]) -> None:
    lay = Layout(dp=3, pp=2, ranks_per_node=1)
    calls = simulate(lay, **fault)
    kw = {"node_of": lay.node_of, "peers_of": _dp_peers(lay), "group_role": _role(lay)}
    with_stage = analyse(calls, stage_of=_stage(lay), **kw)
    assert [(c.kind, c.rank, c.node, c.stage) for c in with_stage.culprits] == \
        [(c.kind, c.rank, c.node, None) for c in analyse(calls, **kw).culprits]


def test_a_window_cut_inside_an_instance_is_realigned() -> None:
    # Rank 1 reaches each all-reduce late; the window starts after rank 0 entered instance 0 but before
    # rank 1 did, so rank 0's first call in the window is instance 1 while rank 1's is instance 0.
    starts0 = [1.0, 2.0, 3.0]
    starts1 = [0.5, 1.5, 2.5, 3.5]
    ends0 = [1.6, 2.6, 3.6]
    ends1 = [0.6, 1.6, 2.6, 3.6]
    calls = Calls.from_columns(rank=[0] * 3 + [1] * 4, comm=[7] * 7, op=[1] * 7, nranks=[2] * 7,
                               comm_rank=[0] * 3 + [1] * 4, start=starts0 + starts1, end=ends0 + ends1)
    inst = match_instances(calls)
    assert [i.end for i in inst] == [(1.6, 1.6), (2.6, 2.6), (3.6, 3.6)]
    assert all(i.start[1] > i.start[0] for i in inst)  # rank 1 is the last to arrive, every time


def test_wait_and_transfer_split() -> None:
    calls = Calls.from_columns(rank=[0, 1, 2], comm=[7, 7, 7], op=[1, 1, 1], nranks=[3, 3, 3],
                               comm_rank=[0, 1, 2], start=[0.0, 1.0, 4.0], end=[5.0, 5.0, 5.0])
    (inst,) = match_instances(calls)
    assert inst.waits() == (4.0, 3.0, 0.0)
    assert inst.transfer() == 1.0


def test_incomplete_groups_are_not_matched() -> None:
    calls = Calls.from_columns(rank=[0, 1], comm=[7, 7], op=[1, 1], nranks=[3, 3], comm_rank=[0, 1],
                               start=[0.0, 1.0], end=[2.0, 2.0])
    assert match_instances(calls) == []


def test_bad_input() -> None:
    with pytest.raises(InputError):
        Calls.from_columns(rank=[0], start=[2.0], end=[1.0])
    with pytest.raises(InputError):
        analyse(Calls.from_columns(rank=[]))
    with pytest.raises(InputError):
        analyse(simulate(Layout(dp=2)), link_ratio=1.0)
    with pytest.raises(InputError):
        analyse(simulate(Layout(dp=2)), stage_ratio=1.0)
    lay = Layout(dp=2, pp=2)
    with pytest.raises(InputError):
        analyse(simulate(lay), stage_of=_stage(lay), stage_work={0: 0.0, 1: 1.0})


def _aggregate(calls: Calls, layout: Layout) -> tuple[dict[int, float], dict[int, dict[int, float]],
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


@pytest.mark.parametrize(("fault", "expect"), [({"slow_rank": 4}, ("compute", 4)), ({"slow_node": 2}, ("link", 2)),
                                               ({"slow_stage": 1}, ("stage", 1)), ({}, None)])
def test_aggregated_form_gives_the_same_verdicts(fault: dict[str, int], expect: tuple[str, int] | None) -> None:
    from failslow.culprit import analyse_aggregates
    lay = Layout(dp=3, pp=2, ranks_per_node=1)
    outside, group, kind = _aggregate(simulate(lay, **fault), lay)
    a = analyse_aggregates(outside, group, group_kind=kind, node_of=lay.node_of, peers_of=lay.dp_group,
                           stage_of=_stage(lay))
    if expect is None:
        assert a.culprits == []
    elif expect[0] == "stage":
        assert [(c.stage, c.rank, sorted(c.ranks)) for c in a.culprits] == \
            [(expect[1], None, [r for r in range(lay.world_size) if lay.coords(r).pp == expect[1]])]
    else:
        top = a.culprits[0]
        assert (top.kind, top.rank if top.kind == "compute" else top.node) == expect
        assert len([c for c in a.culprits if c.kind == expect[0]]) == 1
        assert all(c.stage is None for c in a.culprits)


def test_averaged_form_does_not_blame_a_link_for_a_compute_stragglers_delay() -> None:
    # Rank 3 is slow outside calls; the other pipeline's P2P group (ranks 0, 2) looks slow only because
    # the whole job waits for rank 3. Averages cannot split wait from transfer, so no link is named.
    from failslow.culprit import analyse_aggregates

    outside = {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.3}
    groups = {"dp0": {0: 0.05, 1: 0.05}, "dp1": {2: 0.05, 3: 0.05},
              "pp0": {0: 0.3, 2: 0.3}, "pp1": {1: 0.1, 3: 0.1}}
    kinds = {"dp0": "dp:2", "dp1": "dp:2", "pp0": "pp:2", "pp1": "pp:2"}
    stage = {0: 0, 1: 0, 2: 1, 3: 1}
    a = analyse_aggregates(outside, groups, group_kind=kinds, node_of={r: 0 for r in outside},
                           peers_of=lambda r: [p for p in outside if stage[p] == stage[r]])
    assert [(c.kind, c.rank) for c in a.culprits] == [("compute", 3)]
    # the same slow group without a compute straggler is a link suspect
    b = analyse_aggregates({r: 0.1 for r in outside}, groups, group_kind=kinds, node_of={r: r // 2 for r in outside},
                           peers_of=lambda r: [p for p in outside if stage[p] == stage[r]])
    assert [c.kind for c in b.culprits] and all(c.kind == "link" for c in b.culprits)

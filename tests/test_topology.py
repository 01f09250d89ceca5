"""Topology model: Megatron-LM rank order, groups, nodes and ring hops."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from failslow.errors import InputError
from failslow.topology import Coords, Layout

AXES = ("tp", "cp", "dp", "pp")


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    tp, cp, dp, pp = (draw(st.integers(1, 5)) for _ in range(4))
    world = tp * cp * dp * pp
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    rpn = draw(st.sampled_from([None, *divisors]))
    vpp = draw(st.integers(1, 3)) if pp > 1 else 1
    return Layout(tp=tp, pp=pp, dp=dp, cp=cp, vpp=vpp, ranks_per_node=rpn)


@given(layouts())
@settings(max_examples=150, deadline=None)
def test_rank_coords_round_trip(lay: Layout) -> None:
    arr = lay.coords_array()
    assert arr.shape == (lay.world_size, 4)
    seen = set()
    for r in range(lay.world_size):
        c = lay.coords(r)
        assert lay.rank_of(c) == r
        assert tuple(arr[r]) == (c.tp, c.cp, c.dp, c.pp)
        assert 0 <= c.tp < lay.tp and 0 <= c.cp < lay.cp and 0 <= c.dp < lay.dp and 0 <= c.pp < lay.pp
        assert r == c.tp + lay.tp * (c.cp + lay.cp * (c.dp + lay.dp * c.pp))
        seen.add(c)
    assert len(seen) == lay.world_size  # the map is a bijection


@given(layouts())
@settings(max_examples=150, deadline=None)
def test_groups_partition_the_world(lay: Layout) -> None:
    coords = lay.coords_array()
    for kind, col in zip(AXES, range(4), strict=True):
        groups = lay.groups(kind)
        size = getattr(lay, kind)
        assert len(groups) == lay.world_size // size
        assert all(len(g) == size for g in groups)
        flat = [r for g in groups for r in g]
        assert sorted(flat) == list(range(lay.world_size))  # every rank exactly once
        for g in groups:
            # members differ only along `kind`, and are listed in coordinate order
            other = np.delete(coords[list(g)], col, axis=1)
            assert (other == other[0]).all()
            assert list(coords[list(g), col]) == list(range(size))
        getter = getattr(lay, f"{kind}_group")
        for r in range(lay.world_size):
            g = getter(r)
            assert r in g and g in groups


@given(layouts())
@settings(max_examples=100, deadline=None)
def test_embedding_groups_are_first_and_last_stage(lay: Layout) -> None:
    emb = lay.groups("embedding")
    pipes = lay.groups("pp")
    assert len(emb) == len(pipes)
    for e, p in zip(emb, pipes, strict=True):
        assert e == ((p[0],) if len(p) == 1 else (p[0], p[-1]))
    for r in range(lay.world_size):
        stage = lay.coords(r).pp
        g = lay.embedding_group(r)
        if stage in (0, lay.pp - 1):
            assert r in g and g in emb
        else:
            assert g == ()


@given(layouts())
@settings(max_examples=100, deadline=None)
def test_nodes_and_ring_node_pairs(lay: Layout) -> None:
    nodes = lay.nodes_array()
    assert nodes.max() == lay.num_nodes - 1
    assert np.bincount(nodes).tolist() == [lay.world_size // lay.num_nodes] * lay.num_nodes
    for kind in AXES:
        for g in lay.groups(kind):
            hops = lay.ring_node_pairs(g)
            ring_nodes = [lay.node_of(r) for r in g]
            # every hop crosses nodes, and the ring returns where it started
            assert all(a != b for a, b in hops)
            if len(g) == 1:
                assert hops == []
            if len(set(ring_nodes)) == 1:
                assert hops == []
            else:
                out = np.bincount([a for a, _ in hops], minlength=lay.num_nodes)
                inn = np.bincount([b for _, b in hops], minlength=lay.num_nodes)
                assert (out == inn).all()  # a cycle enters each node as often as it leaves


def test_megatron_reference_layout_tp2_pp4_16_gpus() -> None:
    # The example in Megatron-LM's parallel_state.initialize_model_parallel docstring:
    # 16 GPUs, tensor size 2, pipeline size 4 -> data-parallel size 2.
    lay = Layout(tp=2, pp=4, dp=2, ranks_per_node=8)
    assert lay.world_size == 16 and lay.num_nodes == 2
    assert lay.groups("dp") == [(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15)]
    assert lay.groups("tp") == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13), (14, 15)]
    assert lay.groups("pp") == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)]
    assert lay.groups("embedding") == [(0, 12), (1, 13), (2, 14), (3, 15)]
    assert lay.coords(13) == Coords(tp=1, cp=0, dp=0, pp=3)
    assert lay.embedding_group(5) == ()
    assert lay.embedding_group(13) == (1, 13)
    # The pipeline crosses from node 0 to node 1 between stages 1 and 2 and wraps back.
    assert lay.ring_node_pairs((0, 4, 8, 12)) == [(0, 1), (1, 0)]
    assert lay.ring_node_pairs((0, 2)) == []  # DP pair within node 0


def test_megatron_layout_with_context_parallel() -> None:
    # tp-cp-dp-pp order with CP2: cp groups stride by TP.
    lay = Layout(tp=2, cp=2, dp=2, pp=2, ranks_per_node=4)
    assert lay.cp_group(0) == (0, 2)
    assert lay.dp_group(0) == (0, 4)
    assert lay.pp_group(0) == (0, 8)
    assert lay.tp_group(7) == (6, 7)
    assert lay.coords(11) == Coords(tp=1, cp=1, dp=0, pp=1)
    assert lay.node_of(11) == 2
    # DP group (1, 5) spans nodes 0 and 1 in both directions.
    assert lay.ring_node_pairs(lay.dp_group(1)) == [(0, 1), (1, 0)]
    assert lay.ring_node_pairs((0, 4, 8, 12)) == [(0, 1), (1, 2), (2, 3), (3, 0)]


def test_testbed_style_layouts() -> None:
    lay = Layout(dp=2, pp=2, ranks_per_node=1)
    assert lay.num_nodes == 4
    assert lay.groups("dp") == [(0, 1), (2, 3)]
    assert lay.groups("pp") == [(0, 2), (1, 3)]
    assert Layout(dp=4).groups("dp") == [(0, 1, 2, 3)]
    assert Layout(pp=4).groups("pp") == [(0, 1, 2, 3)]
    assert Layout().describe() == "TP1xCP1xDP1xPP1 (1 ranks, 1 node)"
    assert Layout(tp=2, dp=2, pp=2, vpp=2, ranks_per_node=4).describe() == "TP2xCP1xDP2xPP2xVPP2 (8 ranks, 2 nodes x 4)"


def test_from_mapping_round_trip() -> None:
    lay = Layout(tp=2, dp=3, pp=2, ranks_per_node=4)
    assert Layout.from_mapping(lay.to_dict()) == lay
    assert Layout.from_mapping({"dp": 2, "pp": 2, "ranks_per_node": 0, "other": "x"}) == Layout(dp=2, pp=2)


@pytest.mark.parametrize("kwargs", [
    {"tp": 0}, {"pp": -1}, {"dp": 1.5}, {"cp": True}, {"tp": "2"},
    {"vpp": 2},  # interleaving needs pp > 1
    {"dp": 3, "ranks_per_node": 2},  # 3 ranks do not fill nodes of 2
    {"ranks_per_node": 0},
])
def test_bad_layouts_raise_input_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(InputError):
        Layout(**kwargs)  # type: ignore[arg-type]


def test_bad_queries_raise_input_error() -> None:
    lay = Layout(tp=2, dp=2)
    for bad in (-1, 4, 1.0):
        with pytest.raises(InputError):
            lay.coords(bad)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        lay.rank_of(Coords(tp=2, cp=0, dp=0, pp=0))
    with pytest.raises(InputError):
        lay.groups("ep")
    with pytest.raises(InputError):
        lay.ring_node_pairs(())
    with pytest.raises(InputError):
        lay.ring_node_pairs((0, 0))
    with pytest.raises(InputError):
        Layout.from_mapping([1, 2])  # type: ignore[arg-type]


def _observed(lay: Layout, rank: int, kinds: tuple[str, ...], world_p2p: bool = False):
    from failslow.topology import ObservedComm
    out = []
    c = lay.coords(rank)
    for k in kinds:
        g = getattr(lay, f"{k}_group")(rank)
        if len(g) > 1:
            peers = tuple(p for p in (getattr(c, k) - 1, getattr(c, k) + 1) if 0 <= p < len(g)) if k == "pp" else ()
            out.append(ObservedComm(len(g), g.index(rank), collective=k != "pp", peers=peers))
    if world_p2p:
        stride = lay.tp * lay.dp
        peers = tuple(p for p in (rank - stride, rank + stride) if 0 <= p < lay.world_size)
        out.append(ObservedComm(lay.world_size, rank, collective=False, peers=peers))
    return out


@pytest.mark.parametrize("tp,dp,pp", [(1, 2, 2), (2, 2, 1), (2, 1, 2), (2, 2, 2), (1, 4, 2), (4, 1, 2)])
def test_infer_layout_from_communicators(tp: int, dp: int, pp: int) -> None:
    from failslow.topology import group_kind, infer_layout
    lay = Layout(tp=tp, dp=dp, pp=pp)
    for rank in range(lay.world_size):
        obs = _observed(lay, rank, ("tp", "dp", "pp"))
        got = infer_layout(lay.world_size, rank, obs)
        if tp > 1 and dp == 1:
            # one collective communicator: TP or DP cannot be told apart, the DP reading is taken
            assert got == Layout(dp=tp, pp=pp)
            continue
        assert got == lay
        kinds = [group_kind(got, rank, o) for o in obs]
        want = [k for k in ("tp", "dp", "pp") if getattr(lay, k) > 1]
        assert all(w in k.split("|") for k, w in zip(kinds, want, strict=True))
    # pipeline Send/Recv on the world communicator (as the testbed's gloo p2p does)
    obs = _observed(lay, 0, ("tp", "dp"), world_p2p=pp > 1)
    got = infer_layout(lay.world_size, 0, obs)
    assert got == (lay if tp == 1 or dp > 1 else Layout(dp=tp, pp=pp))


def test_infer_layout_ambiguous_and_bad() -> None:
    from failslow.topology import ObservedComm, infer_layout
    # pure DP that only all-reduces over the world cannot be told from pure TP: DP is assumed
    assert infer_layout(4, 1, [ObservedComm(4, 1)]) == Layout(dp=4)
    assert infer_layout(1, 0, []) == Layout()
    # a communicator no layout explains
    assert infer_layout(4, 1, [ObservedComm(3, 0)]) is None
    with pytest.raises(InputError):
        infer_layout(4, 4, [])

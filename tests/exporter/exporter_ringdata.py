"""Deterministic rings for exporter tests: synthetic call streams written with the real ring writer."""

from __future__ import annotations

import struct
from pathlib import Path

from failslow.period import synth as ps
from failslow.record import Flag, Op, RingWriter
from failslow.record.layout import _HDR

CLOCK_OFFSET_NS = 1_700_000_000_000_000_000  # fixed wall-clock offset so the golden output is stable
CREATED_NS = 5_000_000_000


def write_trace(directory: Path, tr: ps.SynthTrace, *, pid: int, rank: int, world: int, job: str,
                layout: dict[str, int] | None, node_id: int = -1, comm_base: int = 0x100,
                nranks: dict[int, int] | None = None, comm_rank: dict[int, int] | None = None,
                capacity: int = 4096, peer_of: dict[int, int] | None = None) -> Path:
    """Write ``tr`` as the ring of a (possibly fictitious) process and pin its clock fields."""
    env = {"FAILSLOW_NODE_ID": str(node_id)} if node_id >= 0 else {}
    w = RingWriter.create(directory=directory, job=job, rank=rank, world_size=world, layout=layout,
                          capacity=capacity, pid=pid, env=env)
    sizes = nranks or {}
    crank = comm_rank or {}
    peers = peer_of or {}
    try:
        for c in sorted(set(tr.comm.tolist())):
            n = sizes.get(c, 2)
            w.append(Op.COMM_INIT, comm_base + c, n, crank.get(c, 0), -1, 0, 0, 255, CREATED_NS)
        for i in range(len(tr.t_start)):
            t0 = CREATED_NS + round((tr.t_start[i] - tr.t_start[0]) * 1e9) + 1000
            t1 = t0 + round(tr.duration[i] * 1e9)
            op = int(tr.op[i])
            c = int(tr.comm[i])
            n = sizes.get(c, 2)
            peer = peers.get(c, -1) if op in (Op.SEND, Op.RECV) else -1
            w.append(op, comm_base + c, n, crank.get(c, 0), peer, int(tr.nbytes[i]) // 4, int(tr.nbytes[i]), 7,
                     t0, t0, t1, int(Flag.HOST_TIMES))
    finally:
        w.close()
    with open(w.path, "r+b") as f:
        for name, value in (("clock_offset_ns", CLOCK_OFFSET_NS), ("created_mono_ns", CREATED_NS)):
            st, off = _HDR[name]
            f.seek(off)
            f.write(st.pack(value))
        st, off = _HDR["hostname"]
        f.seek(off)
        f.write(struct.pack("64s", b"testhost"))
    return w.path


def golden_rings(directory: Path) -> list[Path]:
    """Two ranks of a DP2xPP2 job (stages 0 and 1 of one pipeline) plus a DP-only job rank."""
    out = []
    lay = {"tp": 1, "pp": 2, "dp": 2, "cp": 1}
    for stage, (pid, rank) in enumerate(((4101, 0), (4102, 2))):
        tr = ps.generate([ps.pp_1f1b(stage, 2, 4, dp_allreduce=True)], [24], seed=11 + stage, jitter=0.02)
        out.append(write_trace(directory, tr, pid=pid, rank=rank, world=4, job="gpt-a", layout=lay,
                               node_id=stage, nranks={1: 2, 10: 4, 11: 4},
                               comm_rank={1: 0, 10: rank, 11: rank}, peer_of={10: rank - 2, 11: rank + 2}))
    tr = ps.generate([ps.dp_buckets(3)], [30], seed=13, jitter=0.02)
    out.append(write_trace(directory, tr, pid=4201, rank=1, world=2, job="bert-b", layout=None,
                           nranks={1: 2}, comm_rank={1: 1}))
    return out


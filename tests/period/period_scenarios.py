"""Synthetic schedules shared by the period tests (`failslow.period.synth`), and the recorded rings."""

from __future__ import annotations

import lzma
from io import BytesIO
from pathlib import Path

import numpy as np

from failslow.period import synth as ps
from failslow.record import RingWriter

DATA = Path(__file__).parent / "data" / "rings"

SCENARIOS = {
    "dp_buckets": lambda: ps.dp_buckets(4),
    "dp_identical_buckets": lambda: ps.dp_buckets(4, identical=True),
    "dp_single_allreduce": lambda: ps.dp_buckets(1, identical=True),
    "pp4_first_stage": lambda: ps.pp_1f1b(0, 4, 8),
    "pp4_middle_stage": lambda: ps.pp_1f1b(1, 4, 8),
    "pp4_last_stage": lambda: ps.pp_1f1b(3, 4, 8),
    "pp2_with_dp": lambda: ps.pp_1f1b(1, 2, 6, dp_allreduce=True),
}


def features(tr: ps.SynthTrace, identical: bool) -> tuple[np.ndarray, ...]:
    # "identical": every call has the same kind, communicator and size; only timing is left.
    return () if identical else (tr.op, tr.comm, tr.nbytes)


def ring_of(name: str, directory: Path, *, rank: int, layout: dict[str, int]) -> tuple[Path, np.ndarray]:
    """A ring holding the recorded records ``DATA/<name>.npy.xz`` (one rank's, as kept from a testbed job)."""
    recs = np.load(BytesIO(lzma.decompress((DATA / f"{name}.npy.xz").read_bytes())))
    w = RingWriter.create(directory=directory, job=name, rank=rank, world_size=4, layout=layout,
                          capacity=1 << 13, pid=4243)
    try:
        for r in recs:
            w.append(int(r["op"]), int(r["comm"]), int(r["nranks"]), int(r["comm_rank"]), int(r["peer"]),
                     int(r["count"]), int(r["bytes"]), int(r["dtype"]), int(r["t_enqueue_ns"]),
                     int(r["t_start_ns"]), int(r["t_end_ns"]), int(r["flags"]))
    finally:
        w.close()
    return w.path, recs

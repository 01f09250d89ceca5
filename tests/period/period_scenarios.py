"""Synthetic schedules shared by the period tests (`failslow.period.synth`)."""

from __future__ import annotations

import numpy as np

from failslow.period import synth as ps

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

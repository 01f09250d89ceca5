"""Throughput prediction for data-parallel training from a single-worker profile.

Coarse models (`coarse`, with `mva`), a fine-grained discrete-event simulation (`des`, on `engine`), the
profile format (`profile`) and one entry point (`api.predict`). Based on Li, Paolieri & Golubchik,
"Predicting Throughput of Distributed Stochastic Gradient Descent", IEEE TPDS 2022; see docs/predict.md.
"""

from failslow.predict.api import Prediction, predict
from failslow.predict.coarse import (
    ARCHS,
    coarse_throughput,
    ps_async,
    ps_sync_step_time,
    ring_step_time,
)
from failslow.predict.des import SimResult, simulate
from failslow.predict.profile import LayerProfile, Profile, parse_profile, parse_rate, read_profile

__all__ = [
    "ARCHS",
    "LayerProfile",
    "Prediction",
    "Profile",
    "SimResult",
    "coarse_throughput",
    "parse_profile",
    "parse_rate",
    "predict",
    "ps_async",
    "ps_sync_step_time",
    "read_profile",
    "ring_step_time",
    "simulate",
]

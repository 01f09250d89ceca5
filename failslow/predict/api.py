"""One entry point over the coarse models and the simulation: throughput for a list of worker counts.

`predict(profile, [1, 2, 4, 8], arch="ring", model="coarse")` is what `failslow predict` calls and what
the remediator's "what will throughput be without that node" question needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from failslow.errors import InputError
from failslow.predict.coarse import ARCHS, Arch, coarse_throughput, ps_async
from failslow.predict.des import Sharing, simulate
from failslow.predict.profile import Profile

MODELS = ("coarse", "fine")


@dataclass(frozen=True)
class Prediction:
    """Predicted samples per second for each worker count."""

    arch: str
    model: str
    throughput: dict[int, float]
    details: dict[int, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The documented CLI output: ``{"arch", "model", "throughput": {"<K>": samples/s}}``."""
        return {"arch": self.arch, "model": self.model,
                "throughput": {str(k): v for k, v in sorted(self.throughput.items())}}


def worker_slowdown(k: int, slowdown: Sequence[float] | None) -> list[float] | None:
    """Per-worker factors for K workers: the given ones for the first workers, 1.0 for the rest."""
    if slowdown is None:
        return None
    f = [float(x) for x in slowdown[:k]]
    return f + [1.0] * (k - len(f))


def predict(profile: Profile, workers: Sequence[int], arch: str = "ring", model: str = "coarse", *,
            bandwidth: float | None = None, link: str | None = None, overlap: bool | None = None,
            slowdown: Sequence[float] | None = None, steps: int = 100, warmup: int = 5,
            seed: int = 0, flow_cap: float | None = None) -> Prediction:
    """Predict throughput (samples/s) of K workers for every K in `workers`.

    Args:
        profile: the single-worker profile.
        workers: worker counts to predict for (each >= 1).
        arch: ``ring``, ``ps-sync`` or ``ps-async``.
        model: ``coarse`` (closed forms / MVA) or ``fine`` (discrete-event simulation).
        bandwidth: nominal link rate in bytes/s replacing the profile's.
        link: coarse: link model (see `coarse_throughput`); fine: ``ps``/``fcfs``/``tcp`` sharing of the
            server links (``tcp``: uneven sharing as measured by the profile's microbenchmark; the ps-sync
            default when the profile has it), ``hybrid`` (the mean of both simulations; default for ps-async, ``ps`` for ps-sync) or
            ``auto`` (the coarse async model's utilisation-threshold pick).
        overlap: override the profile's overlap flag.
        slowdown: compute slowdown factors of the first workers (the rest run at profile speed).
        steps, warmup, seed: simulation length, left-out start and sampler seed (fine model).
        flow_cap: the most one flow gets on a shared server link, bytes/s (fine model; default: the link
            rate, i.e. the worker's own link is as fast as the server's).

    Raises:
        InputError: bad architecture, model, worker count or option.
    """
    if arch not in ARCHS:
        raise InputError(f"unknown architecture {arch!r}; use one of {', '.join(ARCHS)}")
    if model not in MODELS:
        raise InputError(f"unknown model {model!r}; use coarse or fine")
    ks = list(workers)
    if not ks:
        raise InputError("no worker counts given")
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise InputError(f"worker counts must be positive integers, got {k!r}")
        if k > 4096:
            raise InputError(f"{k} workers is beyond what the models are meant for (<= 4096)")
    if slowdown is not None:
        for x in slowdown:
            if not (np.isfinite(x) and x > 0):
                raise InputError(f"slowdown factors must be positive, got {x!r}")
    p = profile if bandwidth is None else profile.with_bandwidth(bandwidth)
    a: Arch = arch
    out: dict[int, float] = {}
    details: dict[int, dict[str, Any]] = {}
    for k in ks:
        sd = worker_slowdown(int(k), slowdown)
        # Every step of a distributed job starts after waiting for the network (all-reduce, download);
        # only a lone ring worker computes back to back. The profile's after-idle samples (if any) say
        # how fast such a step is under the CPU quota.
        # A ring worker's step follows a real all-reduce, a parameter-server worker's a real model
        # transfer (their network work shares the quota): those samples, when profiled.
        pk = p if (a == "ring" and k == 1) else p.after_allreduce() if a == "ring" else p.after_transfer()
        if model == "coarse":
            out[int(k)] = coarse_throughput(pk, int(k), a, link=link, overlap=overlap, slowdown=sd)
            continue
        kinds: list[Sharing]
        if link == "ps":
            kinds = ["ps"]
        elif link == "fcfs":
            kinds = ["fcfs"]
        elif link == "tcp" or (link is None and a == "ps-sync" and pk.share_sigma_down is not None):
            # Simultaneous transfers finish in some order (measured by the fan-out/fan-in microbenchmark).
            kinds = ["tcp"]
        elif link == "auto":
            kinds = [ps_async(pk, int(k), overlap=overlap, slowdown=sd).link_kind if a == "ps-async" else "ps"]
        elif link == "hybrid" or (link is None and a == "ps-async"):
            # The mean of the two sharing disciplines, as in the coarse models.
            kinds = ["ps", "fcfs"]
        elif link is None:
            # Ring all-reduce has no shared server link; synchronous PS transfers share the link (the
            # defaults were chosen on calibration sweeps, see docs/predict.md).
            kinds = ["ps"]
        else:
            raise InputError(f"fine model link sharing must be hybrid, ps, fcfs, tcp or auto, got {link!r}")
        rates = []
        events = 0
        for kind in kinds:
            res = simulate(pk, int(k), a, steps=steps, warmup=warmup, sharing=kind, overlap=overlap,
                           slowdown=sd, seed=seed, flow_cap=flow_cap)
            rates.append(res.samples_per_s)
            events += res.events
        out[int(k)] = float(np.mean(rates))
        details[int(k)] = {"sharing": "+".join(kinds), "events": events}
    return Prediction(arch=arch, model=model, throughput=out, details=details)

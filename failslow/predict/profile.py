"""Single-worker profiles: what a throughput prediction starts from.

A profile is what one worker of a data-parallel job looks like when it trains alone: per-layer
forward and backward times, parameter bytes per layer, the optimizer's update time, and the link it
talks over (rate, efficiency, per-message latency). `parse_profile` turns the JSON document written
by `failslow testbed dp-scaling` (format ``failslow-dp-profile/1``) into a validated `Profile`;
`read_profile` is the I/O wrapper. Every check raises `InputError`, so the CLI reports bad files as
one clear line.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError

FORMAT = "failslow-dp-profile/1"

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class LayerProfile:
    """One layer of the model as profiled on a single worker (mean times)."""

    name: str
    param_bytes: int
    forward_s: float
    backward_s: float


@dataclass(frozen=True)
class Profile:
    """What the predictors need to know about one worker, its model and its link.

    Attributes:
        layers: per-layer means, in forward order.
        batch_size: samples per worker per step (throughput is reported in samples/s).
        bandwidth_bytes_per_s: nominal link rate B of every node, each direction (what `tc tbf` was set to).
        link_efficiency: payload bytes/s actually achieved over nominal (TCP/IP and Ethernet headers,
            shaping granularity); the predictors use B × efficiency.
        latency_s: fixed cost of one message (software stack, round trip), paid once per transfer.
        ring_efficiency, ring_latency_s: the same two figures for one hop of the ring all-reduce as the
            collective library runs it (fitted from all-reduces of several sizes between two workers);
            the point-to-point figures when the profile has none.
        update_s: the optimizer applying one gradient to the whole model (per step, on the worker for
            ring all-reduce, on the server for a parameter server).
        accumulate_s: adding one worker's gradient into the server's sum (parameter server only).
        step_forward_s, step_backward_s: per-step samples, shape (n_steps, n_layers); the fine-grained
            simulation draws whole steps from them so that step-to-step variance (and the max over K
            workers at a barrier) is carried through. Steps run back to back.
        idle_step_forward_s, idle_step_backward_s: the same for steps that each start after an idle
            wait (optional). Under a CPU quota a step that starts after waiting for the network runs
            faster than one in a back-to-back sequence (the quota is full), and every step of a
            distributed job does; `after_idle` swaps these in.
        net_step_forward_s, net_step_backward_s: the same for a parameter-server worker's compute phase
            (load the received model, compute, flatten the gradient) right after a real whole-model
            transfer (optional); `after_transfer` swaps these in. The transfer's receive work shares
            the CPU quota, which an idle wait does not.
        ring_step_forward_s, ring_step_backward_s: the same for a ring worker's compute phase in a
            sequence of real all-reduce steps (optional); `after_allreduce` swaps these in.
        ring_peer_step_s: the other ring member's step times in the same steps, paired row by row
            with the after-all-reduce samples (optional, shape (n_steps,)); their correlation is
            `ring_shared_jitter`.
        ring_stagger_efficiency, ring_stagger_latency_s: one ring hop again, fitted to the collective
            after the last member's entry when every member first computes one real step, i.e. the
            entries are staggered by the compute jitter as in a job (optional; a measurement kept
            for diagnosis, `with_staggered_hop`; the models use the simultaneous hop).
        shared_jitter: the fraction ρ of the step-to-step variance that all workers of a synchronous
            job share (the same host, the same moment), 0 = independent. The barrier's max over K
            only sees the independent part: step_w = shared + independent_w. Set by
            `after_allreduce` from the paired ring samples; 0 otherwise.
        share_sigma_down, share_sigma_up: how unevenly simultaneous flows share the server's link
            (σ of the random per-transfer weights of the simulation's ``tcp`` sharing, fitted from a
            fan-out / fan-in microbenchmark); None when not measured.
        overlap: whether the profiled job overlaps communication with computation per layer.
    """

    layers: tuple[LayerProfile, ...]
    batch_size: int
    bandwidth_bytes_per_s: float
    link_efficiency: float = 1.0
    latency_s: float = 0.0
    ring_efficiency: float | None = None
    ring_latency_s: float | None = None
    ring_stagger_efficiency: float | None = None
    ring_stagger_latency_s: float | None = None
    update_s: float = 0.0
    accumulate_s: float = 0.0
    step_forward_s: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))
    step_backward_s: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))
    idle_step_forward_s: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))
    idle_step_backward_s: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))
    net_step_forward_s: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))
    net_step_backward_s: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))
    ring_step_forward_s: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))
    ring_step_backward_s: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))
    ring_peer_step_s: FloatArray = field(default_factory=lambda: np.zeros(0))
    shared_jitter: float = 0.0
    share_sigma_down: float | None = None
    share_sigma_up: float | None = None
    overlap: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        """Number of layers."""
        return len(self.layers)

    @property
    def param_bytes(self) -> FloatArray:
        """Parameter (= gradient) bytes per layer, forward order."""
        return np.array([ly.param_bytes for ly in self.layers], dtype=np.float64)

    @property
    def forward_s(self) -> FloatArray:
        """Mean forward time per layer."""
        return np.array([ly.forward_s for ly in self.layers], dtype=np.float64)

    @property
    def backward_s(self) -> FloatArray:
        """Mean backward time per layer."""
        return np.array([ly.backward_s for ly in self.layers], dtype=np.float64)

    @property
    def model_bytes(self) -> float:
        """M: bytes of the whole model (what a worker sends or receives per step)."""
        return float(self.param_bytes.sum())

    @property
    def effective_bandwidth(self) -> float:
        """Payload bytes per second one flow gets on an idle link."""
        return self.bandwidth_bytes_per_s * self.link_efficiency

    @property
    def ring_bandwidth(self) -> float:
        """Payload bytes per second of one ring all-reduce hop."""
        eff = self.link_efficiency if self.ring_efficiency is None else self.ring_efficiency
        return self.bandwidth_bytes_per_s * eff

    @property
    def ring_hop_latency(self) -> float:
        """Fixed cost of one ring all-reduce hop."""
        return self.latency_s if self.ring_latency_s is None else self.ring_latency_s

    def with_bandwidth(self, bytes_per_s: float) -> Profile:
        """The same profile on links of another nominal rate (efficiency and latency kept)."""
        if not (bytes_per_s > 0 and math.isfinite(bytes_per_s)):
            raise InputError(f"bandwidth must be a positive finite rate, got {bytes_per_s!r}")
        return replace(self, bandwidth_bytes_per_s=float(bytes_per_s))

    def after_idle(self) -> Profile:
        """The profile of steps that start after waiting (for the network), when it has such samples.

        Per-layer times become the medians of the after-idle samples, and those samples replace the
        back-to-back ones; without after-idle samples the profile itself.
        """
        if not self.idle_step_forward_s.size:
            return self
        return self._with_steps(self.idle_step_forward_s, self.idle_step_backward_s)

    def after_transfer(self) -> Profile:
        """The profile of a parameter-server worker's steps, each right after receiving the model.

        Uses the after-transfer samples when the profile has them, else `after_idle`.
        """
        if not self.net_step_forward_s.size:
            return self.after_idle()
        return self._with_steps(self.net_step_forward_s, self.net_step_backward_s)

    def after_allreduce(self) -> Profile:
        """The profile of a ring worker's steps in a job, each following a real all-reduce.

        Uses the after-all-reduce samples when the profile has them, else `after_idle`.
        Where the other ring member's paired steps were recorded, `shared_jitter` is set to
        `ring_shared_jitter`.
        """
        if not self.ring_step_forward_s.size:
            return self.after_idle()
        out = self._with_steps(self.ring_step_forward_s, self.ring_step_backward_s)
        return replace(out, shared_jitter=self.ring_shared_jitter)

    def with_staggered_hop(self) -> Profile:
        """The same profile with the ring hop measured with compute-staggered entries (a what-if).

        Not used by `predict`: on the session-4 holds the collective after the last entry was not
        shorter with staggered entries than with simultaneous ones (docs/predict.md, issue #7), so the
        hypothesis that made it the ring's hop in a job did not hold. Without the measurement, the profile.
        """
        if self.ring_stagger_efficiency is None:
            return self
        return replace(self, ring_efficiency=self.ring_stagger_efficiency,
                       ring_latency_s=self.ring_stagger_latency_s)

    @property
    def ring_shared_jitter(self) -> float:
        """ρ: how much of the ring members' step-time variance is shared, from the paired samples.

        With step_w = S + I_w (S common to both members of a step, I_w independent, equal spread),
        cov(step_1, step_2) = var(S) and var(step_w) = var(S) + var(I), so the Pearson correlation of
        the two members' step times is var(S) / var(step). Clipped to [0, 1] (a negative sample
        correlation is noise around "nothing shared"); 0 without paired samples.
        """
        peer = self.ring_peer_step_s
        if peer.size < 3 or peer.shape[0] != self.ring_step_forward_s.shape[0]:
            return 0.0
        mine = self.ring_step_forward_s.sum(axis=1) + self.ring_step_backward_s.sum(axis=1)
        if float(np.std(mine)) == 0.0 or float(np.std(peer)) == 0.0:
            return 0.0
        rho = float(np.corrcoef(mine, peer)[0, 1])
        return min(1.0, max(0.0, rho)) if math.isfinite(rho) else 0.0

    def _with_steps(self, fwd: FloatArray, bwd: FloatArray) -> Profile:
        fm = np.median(fwd, axis=0)
        bm = np.median(bwd, axis=0)
        layers = tuple(replace(ly, forward_s=float(f), backward_s=float(b))
                       for ly, f, b in zip(self.layers, fm, bm, strict=True))
        return replace(self, layers=layers, step_forward_s=fwd, step_backward_s=bwd)

    def step_samples(self) -> tuple[FloatArray, FloatArray]:
        """Per-step forward/backward samples; the means as a single step when none were recorded."""
        if self.step_forward_s.size:
            return self.step_forward_s, self.step_backward_s
        return self.forward_s[None, :], self.backward_s[None, :]


_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z/]*)\s*$")
_RATE_UNITS: dict[str, float] = {
    "": 1.0, "b/s": 1.0, "bps": 1.0,
    "bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8,
    "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9,
    "kib/s": 1024.0, "mib/s": 1024.0**2, "gib/s": 1024.0**3,
}


def parse_rate(text: str) -> float:
    """Bytes per second from a rate such as ``100mbit``, ``12.5MB/s``, ``2MiB/s`` or ``1e6`` (bytes/s).

    ``bit``-units are bits per second as in `tc` (``mbit`` = 10^6 bit/s); ``B/s`` units are bytes.
    """
    m = _RATE.match(text)
    if not m:
        raise InputError(f"bad rate {text!r}: expected e.g. 100mbit, 12.5MB/s or 1e6 (bytes/s)")
    unit = m.group(2).lower()
    if unit not in _RATE_UNITS:
        raise InputError(f"bad rate unit in {text!r}: use one of bit, kbit, mbit, gbit, B/s, kB/s, MB/s, GB/s, MiB/s")
    value = float(m.group(1)) * _RATE_UNITS[unit]
    if not (value > 0 and math.isfinite(value)):
        raise InputError(f"rate must be positive, got {text!r}")
    return value


def _num(d: dict[str, Any], key: str, where: str, *, positive: bool = False, default: float | None = None) -> float:
    if key not in d:
        if default is None:
            raise InputError(f"{where}: missing {key!r}")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise InputError(f"{where}: {key!r} must be a finite number, got {v!r}")
    if v < 0 or (positive and v == 0):
        raise InputError(f"{where}: {key!r} must be {'positive' if positive else 'non-negative'}, got {v!r}")
    return float(v)


def _step_pair(steps: Any, prefix: str, n: int) -> tuple[FloatArray, FloatArray]:
    """Optional ``steps.<prefix>forward_s`` / ``steps.<prefix>backward_s`` matrices (empty when both absent)."""
    fk, bk = f"{prefix}forward_s", f"{prefix}backward_s"
    if not isinstance(steps, dict) or (fk not in steps and bk not in steps):
        return np.zeros((0, 0)), np.zeros((0, 0))
    f = _matrix(steps.get(fk), n, f"steps.{fk}")
    b = _matrix(steps.get(bk), n, f"steps.{bk}")
    if f.shape != b.shape:
        raise InputError(f"profile: steps.{fk} and steps.{bk} differ in shape")
    return f, b


def _matrix(v: Any, n_layers: int, what: str) -> FloatArray:
    try:
        a = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"profile: {what} must be a list of per-layer lists of numbers") from exc
    if a.ndim != 2 or a.shape[1] != n_layers or a.shape[0] == 0:
        raise InputError(f"profile: {what} must have shape (steps, {n_layers}), got {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise InputError(f"profile: {what} must hold finite non-negative seconds")
    return a


def _vector(v: Any, what: str) -> FloatArray:
    try:
        a = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"profile: {what} must be a list of numbers") from exc
    if a.ndim != 1 or a.shape[0] == 0:
        raise InputError(f"profile: {what} must be a non-empty list of numbers, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise InputError(f"profile: {what} must hold finite non-negative seconds")
    return a


def _ring_hop(link: dict[str, Any], key: str, what: str) -> tuple[float | None, float | None]:
    """One ring hop's (efficiency, latency_s) from ``link[key]``, or (None, None) when absent."""
    hop = link.get(key)
    if hop is None:
        return None, None
    if not isinstance(hop, dict):
        raise InputError(f"profile: link.{key} must be an object")
    eff = _num(hop, "efficiency", f"profile: link.{key}", positive=True)
    if eff > 1.5:
        raise InputError(f"profile: {what} efficiency {eff} is implausible")
    return eff, _num(hop, "latency_s", f"profile: link.{key}", default=0.0)


def parse_profile(doc: Any) -> Profile:
    """Validate a decoded profile document and build a `Profile`.

    Args:
        doc: the decoded JSON object (format ``failslow-dp-profile/1``).

    Raises:
        InputError: on any missing or malformed field.
    """
    if not isinstance(doc, dict):
        raise InputError("profile: expected a JSON object")
    fmt = doc.get("format")
    if fmt != FORMAT:
        raise InputError(f"profile: unsupported format {fmt!r} (expected {FORMAT!r})")
    raw_layers = doc.get("layers")
    if not isinstance(raw_layers, list) or not raw_layers:
        raise InputError("profile: 'layers' must be a non-empty list")
    layers = []
    for i, ly in enumerate(raw_layers):
        where = f"profile: layer {i}"
        if not isinstance(ly, dict):
            raise InputError(f"{where}: expected an object")
        pb = _num(ly, "param_bytes", where)
        layers.append(LayerProfile(name=str(ly.get("name", f"layer{i}")), param_bytes=int(pb),
                                   forward_s=_num(ly, "forward_s", where),
                                   backward_s=_num(ly, "backward_s", where)))
    if sum(ly.param_bytes for ly in layers) <= 0:
        raise InputError("profile: the model has no parameter bytes")
    if sum(ly.forward_s + ly.backward_s for ly in layers) <= 0:
        raise InputError("profile: the model has no compute time")
    bs = doc.get("batch_size")
    if isinstance(bs, bool) or not isinstance(bs, int) or bs <= 0:
        raise InputError(f"profile: 'batch_size' must be a positive integer, got {bs!r}")
    link = doc.get("link", {})
    if not isinstance(link, dict):
        raise InputError("profile: 'link' must be an object")
    bw = _num(link, "bandwidth_bytes_per_s", "profile: link", positive=True)
    eff = _num(link, "efficiency", "profile: link", positive=True, default=1.0)
    if eff > 1.5:
        raise InputError(f"profile: link efficiency {eff} is implausible (payload rate over nominal rate)")
    lat = _num(link, "latency_s", "profile: link", default=0.0)
    ring_eff, ring_lat = _ring_hop(link, "allreduce", "all-reduce")
    ring_stag_eff, ring_stag_lat = _ring_hop(link, "allreduce_staggered", "staggered all-reduce")
    sharing = link.get("sharing")
    sig_down: float | None = None
    sig_up: float | None = None
    if sharing is not None:
        if not isinstance(sharing, dict):
            raise InputError("profile: link.sharing must be an object with down_sigma and up_sigma")
        sig_down = _num(sharing, "down_sigma", "profile: link.sharing")
        sig_up = _num(sharing, "up_sigma", "profile: link.sharing")
        if sig_down > 10 or sig_up > 10:
            raise InputError("profile: link.sharing sigmas above 10 are implausible")
    where = "profile"
    update = _num(doc, "update_s", where, default=0.0)
    accumulate = _num(doc, "accumulate_s", where, default=0.0)
    n = len(layers)
    steps = doc.get("steps")
    if steps is None:
        sf = np.zeros((0, 0))
        sb = np.zeros((0, 0))
    else:
        if not isinstance(steps, dict):
            raise InputError("profile: 'steps' must be an object with forward_s and backward_s")
        sf = _matrix(steps.get("forward_s"), n, "steps.forward_s")
        sb = _matrix(steps.get("backward_s"), n, "steps.backward_s")
        if sf.shape != sb.shape:
            raise InputError("profile: steps.forward_s and steps.backward_s differ in shape")
    idle_f, idle_b = _step_pair(steps, "idle_", n)
    net_f, net_b = _step_pair(steps, "net_", n)
    ring_f, ring_b = _step_pair(steps, "ring_", n)
    ring_peer = np.zeros(0)
    if isinstance(steps, dict) and "ring_peer_step_s" in steps:
        ring_peer = _vector(steps.get("ring_peer_step_s"), "steps.ring_peer_step_s")
        if ring_peer.shape[0] != ring_f.shape[0]:
            raise InputError(f"profile: steps.ring_peer_step_s has {ring_peer.shape[0]} steps, "
                             f"steps.ring_forward_s {ring_f.shape[0]}: they must be paired step by step")
    overlap = doc.get("overlap", False)
    if not isinstance(overlap, bool):
        raise InputError("profile: 'overlap' must be true or false")
    meta = doc.get("meta", {})
    return Profile(layers=tuple(layers), batch_size=bs, bandwidth_bytes_per_s=bw, link_efficiency=eff,
                   latency_s=lat, ring_efficiency=ring_eff, ring_latency_s=ring_lat,
                   ring_stagger_efficiency=ring_stag_eff, ring_stagger_latency_s=ring_stag_lat, update_s=update, accumulate_s=accumulate, step_forward_s=sf,
                   step_backward_s=sb, idle_step_forward_s=idle_f, idle_step_backward_s=idle_b,
                   net_step_forward_s=net_f, net_step_backward_s=net_b,
                   ring_step_forward_s=ring_f, ring_step_backward_s=ring_b, ring_peer_step_s=ring_peer,
                   share_sigma_down=sig_down, share_sigma_up=sig_up, overlap=overlap, meta=meta if isinstance(meta, dict) else {})


def read_profile(path: str | Path) -> Profile:
    """Read and validate a profile JSON file."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError as exc:
        raise InputError(f"profile {str(p)!r} does not exist") from exc
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read profile {str(p)!r}: {exc}") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"profile {str(p)!r} is not valid JSON: {exc}") from exc
    return parse_profile(doc)


def profile_to_doc(p: Profile) -> dict[str, Any]:
    """The JSON document for a profile (inverse of `parse_profile`)."""
    doc: dict[str, Any] = {
        "format": FORMAT,
        "batch_size": p.batch_size,
        "layers": [{"name": ly.name, "param_bytes": ly.param_bytes, "forward_s": ly.forward_s,
                    "backward_s": ly.backward_s} for ly in p.layers],
        "link": {"bandwidth_bytes_per_s": p.bandwidth_bytes_per_s, "efficiency": p.link_efficiency,
                 "latency_s": p.latency_s},
        "update_s": p.update_s,
        "accumulate_s": p.accumulate_s,
        "overlap": p.overlap,
        "meta": p.meta,
    }
    if p.ring_efficiency is not None:
        doc["link"]["allreduce"] = {"efficiency": p.ring_efficiency, "latency_s": p.ring_hop_latency}
    if p.ring_stagger_efficiency is not None:
        doc["link"]["allreduce_staggered"] = {"efficiency": p.ring_stagger_efficiency,
                                              "latency_s": p.ring_stagger_latency_s or 0.0}
    if p.step_forward_s.size:
        doc["steps"] = {"forward_s": p.step_forward_s.tolist(), "backward_s": p.step_backward_s.tolist()}
    if p.share_sigma_down is not None and p.share_sigma_up is not None:
        doc["link"]["sharing"] = {"down_sigma": p.share_sigma_down, "up_sigma": p.share_sigma_up}
    if p.idle_step_forward_s.size:
        doc.setdefault("steps", {}).update(idle_forward_s=p.idle_step_forward_s.tolist(),
                                           idle_backward_s=p.idle_step_backward_s.tolist())
    if p.net_step_forward_s.size:
        doc.setdefault("steps", {}).update(net_forward_s=p.net_step_forward_s.tolist(),
                                           net_backward_s=p.net_step_backward_s.tolist())
    if p.ring_step_forward_s.size:
        doc.setdefault("steps", {}).update(ring_forward_s=p.ring_step_forward_s.tolist(),
                                           ring_backward_s=p.ring_step_backward_s.tolist())
    if p.ring_peer_step_s.size:
        doc.setdefault("steps", {})["ring_peer_step_s"] = p.ring_peer_step_s.tolist()
    return doc

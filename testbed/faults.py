"""Fault injection: parse a spec string into a :class:`Fault`, then ``start()`` / ``stop()`` it.

Spec grammar: ``KIND:key=value,key=value,...``. Kinds and keys:

=========  ====================================  =======================================================
kind       keys                                  effect
=========  ====================================  =======================================================
link       node, rate                            ``tc qdisc tbf`` at `rate` on both ends of the node's veth
path       a, b, rate                            a congested path: traffic between nodes `a` and `b` only
                                                 (both directions) at `rate` (``htb`` + ``u32`` filter on
                                                 the dst address, on each node's end of its veth)
cpu        rank, quota                           cgroup v1 CPU quota (in CPUs) on the rank's process; on
                                                 its end the rank's base cap (``--cpu-cap``), if any
gc         rank, every, pause                    every `every` iterations the rank stops `pause` seconds
                                                 after a full ``gc.collect()``
seqlen     dp, factor                            DP replica `dp` trains on sequences `factor` × longer
stage      pp, factor | layers                   pipeline stage `pp` computes `factor` × as long (or as
                                                 if it had `layers` more layers, e.g. ``layers=+2``)
poisson    mean_gap, mean_dur, kinds,            a random schedule: exponential gaps and durations,
           [quota, rate, seed]                   each episode a cpu (random rank) or link (random node)
=========  ====================================  =======================================================

Every kind also takes a schedule: ``at=SECONDS`` / ``for=SECONDS`` (wall clock from the job's first
training start: a restart neither resets nor pauses it) or ``start_iter=N`` / ``stop_iter=N`` (by the
slowest rank's completed iterations). Without a schedule the fault is active for the whole run.

A link fault and a path fault both own the root qdisc of a node's ``eth0``, so a node takes at most one
of them at a time (two paths sharing a node included): binding refuses one whose schedule may overlap
another such fault on the same node, and starting refuses one whose node's ``eth0`` is already shaped.

A fault acts through a :class:`FaultTarget` (the running testbed, or any other harness such as the
DP-scaling testbed) that knows the link devices of a node, the process of a rank and how to tell the
trainers about in-process faults. Each activation is recorded as an episode with wall-clock
start/end, which the testbed writes to the report.

Example::

    fault = parse_spec("link:node=1,rate=20mbit")
    fault.bind(testbed)          # anything implementing FaultTarget
    fault.start(); ...; fault.stop()
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from failslow.errors import InputError
from testbed.cgroup import CpuCgroup
from testbed.netns import clear_rate, interface_address, parse_rate, root_qdisc_kind, set_path_rate, set_rate


class FaultTarget(Protocol):
    """What faults need from the environment they act on."""

    num_nodes: int
    world_size: int

    def link_devices(self, node: int) -> list[tuple[str, str]]:
        """(namespace, interface) pairs to shape for `node` (both directions); [] when links are unavailable."""
        ...

    def rank_pids(self, rank: int) -> list[int]:
        """Process ids of `rank`."""
        ...

    def cgroup_prefix(self) -> str:
        """Prefix for cgroups this target's faults create."""
        ...

    def set_trainer_fault(self, fault_id: str, payload: dict[str, Any] | None) -> int | None:
        """Activate (payload) or clear (None) an in-trainer fault on every rank; returns the iteration
        from which it applies, when known."""
        ...

    def layout_sizes(self) -> dict[str, int]:
        """Parallel sizes ``{"dp":…, "pp":…, "tp":…}`` used to validate targets."""
        ...


@dataclass
class Schedule:
    """When a fault is active: by wall time since job start or by completed iterations."""

    at_s: float | None = None
    for_s: float | None = None
    start_iter: int | None = None
    stop_iter: int | None = None

    @property
    def timed(self) -> bool:
        """Whether the fault has any schedule (else it is on for the whole run)."""
        return any(v is not None for v in (self.at_s, self.for_s, self.start_iter, self.stop_iter))

    def should_be_active(self, elapsed_s: float, iteration: int) -> bool:
        """Whether the fault should be on at `elapsed_s` seconds / `iteration` completed iterations."""
        on = True
        if self.at_s is not None:
            on = on and elapsed_s >= self.at_s
        if self.for_s is not None:
            on = on and elapsed_s < (self.at_s or 0.0) + self.for_s
        if self.start_iter is not None:
            on = on and iteration >= self.start_iter
        if self.stop_iter is not None:
            on = on and iteration < self.stop_iter
        return on


_SCHEDULE_KEYS = {"at", "for", "start_iter", "stop_iter"}


@dataclass
class Fault:
    """Base class of all faults: parsed spec, binding to a target, and the log of episodes."""

    spec: str
    schedule: Schedule = field(default_factory=Schedule)
    kind: ClassVar[str] = ""
    episodes: list[dict[str, Any]] = field(default_factory=list, init=False)
    target_env: FaultTarget | None = field(default=None, init=False, repr=False)
    active: bool = field(default=False, init=False)
    start_failed: bool = field(default=False, init=False)  # the last start() raised: nothing was applied

    def bind(self, target: FaultTarget) -> Fault:
        """Attach the environment the fault acts on; validates the fault's target against it."""
        self.validate(target)
        self.target_env = target
        return self

    def _env(self) -> FaultTarget:
        if self.target_env is None:
            raise RuntimeError(f"fault {self.spec!r} is not bound to a target (call bind())")
        return self.target_env

    @property
    def target(self) -> str:
        """Human-readable target, e.g. ``node=1`` or ``rank=3``."""
        return ""

    def validate(self, target: FaultTarget) -> None:
        """Raise InputError when the fault's target does not exist in `target`."""

    def _apply(self) -> None:
        raise NotImplementedError

    def _remove(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        """Activate the fault now (idempotent) and open an episode."""
        if self.active:
            return
        try:
            self._apply()
        except BaseException:
            self.start_failed = True
            raise
        self.start_failed = False
        self.active = True
        self.episodes.append({"spec": self.spec, "kind": self.kind, "target": self.target,
                              "start_unix_s": time.time(), "end_unix_s": None})

    def stop(self) -> None:
        """Deactivate the fault now (idempotent) and close the episode."""
        if not self.active:
            return
        try:
            self._remove()
        finally:
            self.active = False
            self.episodes[-1]["end_unix_s"] = time.time()

    def log(self) -> list[dict[str, Any]]:
        """Episodes with wall-clock start/end (end None while still active)."""
        return [dict(e) for e in self.episodes]


def _range_check(name: str, value: int, size: int, what: str) -> None:
    if not 0 <= value < size:
        raise InputError(f"{name}={value} is out of range: the job has {size} {what}")


@dataclass
class LinkFault(Fault):
    """Bandwidth cap on a node's link, both directions (tc tbf on both veth ends)."""

    node: int = 0
    rate: str = "20mbit"
    kind: ClassVar[str] = "link"
    _devices: list[tuple[str, str]] = field(default_factory=list, init=False, repr=False)

    @property
    def target(self) -> str:
        return f"node={self.node}"

    def validate(self, target: FaultTarget) -> None:
        _range_check("node", self.node, target.num_nodes, "nodes")
        if not target.link_devices(self.node):
            raise InputError("link faults are unavailable: the testbed runs on loopback (no root, no namespaces)")
        _check_qdisc_owners(self, target)

    def _apply(self) -> None:
        devices = self._env().link_devices(self.node)
        if not devices:
            raise InputError("link faults are unavailable: the testbed runs on loopback (no root, no namespaces)")
        _check_unshaped(self, self.node, devices[0])
        for ns, dev in devices:
            set_rate(ns, dev, self.rate)
        self._devices = devices

    def _remove(self) -> None:
        for ns, dev in self._devices:
            clear_rate(ns, dev)


@dataclass
class PathFault(Fault):
    """A congested path between nodes `a` and `b`: only their traffic with each other is capped at `rate`,
    both directions; their traffic with every other node is untouched (FALCON's congested link between two
    DP peers, as opposed to :class:`LinkFault`, a node's whole NIC).

    On each node's end of its veth (``eth0`` in its namespace) a root ``htb`` qdisc sends packets for the
    other node's address (``u32`` filter) to a class at rate = ceil = `rate`; other packets leave unshaped
    through htb's direct queue. Stopping deletes both root qdiscs.
    """

    a: int = 0
    b: int = 1
    rate: str = "20mbit"
    kind: ClassVar[str] = "path"
    _devices: list[tuple[str, str]] = field(default_factory=list, init=False, repr=False)

    @property
    def target(self) -> str:
        return f"nodes={self.a},{self.b}"

    def validate(self, target: FaultTarget) -> None:
        _range_check("a", self.a, target.num_nodes, "nodes")
        _range_check("b", self.b, target.num_nodes, "nodes")
        if self.a == self.b:
            raise InputError(f"path fault {self.spec!r} needs two different nodes (a != b)")
        if not target.link_devices(self.a):
            raise InputError("path faults are unavailable: the testbed runs on loopback (no root, no namespaces)")
        _check_qdisc_owners(self, target)

    def _apply(self) -> None:
        env = self._env()
        ends = [env.link_devices(n) for n in (self.a, self.b)]
        if not all(ends):
            raise InputError("path faults are unavailable: the testbed runs on loopback (no root, no namespaces)")
        devices = [ends[0][0], ends[1][0]]  # each node's own end of its veth
        for node, dev in zip((self.a, self.b), devices, strict=True):
            _check_unshaped(self, node, dev)
        addresses = [interface_address(ns, ifname) for ns, ifname in devices]
        done: list[tuple[str, str]] = []
        try:
            for (ns, ifname), peer in zip(devices, reversed(addresses), strict=True):
                set_path_rate(ns, ifname, peer, self.rate)
                done.append((ns, ifname))
        except BaseException:
            for ns, ifname in done:
                clear_rate(ns, ifname)
            raise
        self._devices = done

    def _remove(self) -> None:
        for ns, dev in self._devices:
            clear_rate(ns, dev)
        self._devices = []


def _qdisc_nodes(fault: Fault) -> set[int]:
    """Nodes whose ``eth0`` root qdisc `fault` sets (link and path faults)."""
    if isinstance(fault, LinkFault):
        return {fault.node}
    if isinstance(fault, PathFault):
        return {fault.a, fault.b}
    return set()


def _windows_overlap(s: Schedule, t: Schedule) -> bool:
    """Whether two schedules may be active at once (True unless both are windows of the same unit that are
    disjoint)."""
    def window(lo: float | None, hi: float | None) -> tuple[float, float]:
        return (lo or 0.0, float("inf") if hi is None else hi)

    by_iter = [x.start_iter is not None or x.stop_iter is not None for x in (s, t)]
    by_time = [x.at_s is not None or x.for_s is not None for x in (s, t)]
    if all(by_iter) and not any(by_time):
        (a0, a1), (b0, b1) = (window(x.start_iter, x.stop_iter) for x in (s, t))
    elif all(by_time) and not any(by_iter):
        (a0, a1), (b0, b1) = (window(x.at_s, None if x.for_s is None else (x.at_s or 0.0) + x.for_s)
                              for x in (s, t))
    else:
        return True
    return a0 < b1 and b0 < a1


def _check_qdisc_owners(fault: Fault, target: FaultTarget) -> None:
    """Refuse a link/path fault on a node whose ``eth0`` another link/path fault of `target` (its ``faults``,
    if it keeps them) shapes now or may shape at the same time."""
    mine = _qdisc_nodes(fault)
    for other in getattr(target, "faults", None) or []:
        shared = mine & _qdisc_nodes(other)
        if other is fault or not shared:
            continue
        # injected at run time and removed since, or refused when it was to start
        finished = not other.active and (bool(other.episodes) or other.start_failed) and not other.schedule.timed
        if other.active or (not finished and _windows_overlap(fault.schedule, other.schedule)):
            raise InputError(f"fault {fault.spec!r} and fault {other.spec!r} both shape node {min(shared)}'s link "
                             f"(the root qdisc of its eth0) at the same time; a node takes one link or path fault "
                             f"at a time")


def _check_unshaped(fault: Fault, node: int, device: tuple[str, str]) -> None:
    """Refuse to start a link/path fault on a node whose ``eth0`` already carries one (tbf or htb root)."""
    kind = root_qdisc_kind(*device)
    if kind in ("tbf", "htb"):
        what = "a link fault (tbf)" if kind == "tbf" else "a path fault (htb)"
        raise InputError(f"cannot start {fault.spec!r}: node {node}'s eth0 already carries {what}; a node takes "
                         f"one link or path fault at a time")


def _check_below_cap(target: object, quota: float, what: str, who: str = "the rank") -> None:
    """A CPU fault's quota must be below a capped target's base cap (``cpu_cap``): at or above it the
    "fault" would not slow the rank down."""
    cap = getattr(target, "cpu_cap", None)
    if cap is not None and quota >= cap:
        raise InputError(f"{what} quota {quota} CPUs is not below the ranks' base cap of {cap} CPUs "
                         f"(--cpu-cap / --device-speed): it would not slow {who} down")


@dataclass
class CpuFault(Fault):
    """CPU quota (in CPUs) on one rank's process via a cgroup v1 cpu cgroup.

    On a target that keeps each rank in its own cgroup (the testbed) the quota is set in place, at
    that cgroup's CFS period, and ending the fault puts back the quota the cgroup had before: the
    rank's base cap when the job runs capped (``--cpu-cap``, a dedicated-device emulation), no limit
    otherwise. A target with a base cap (``cpu_cap`` attribute) refuses a fault quota at or above it:
    such a "fault" would speed the rank up.
    """

    rank: int = 0
    quota: float = 0.3
    kind: ClassVar[str] = "cpu"
    # the rank on the device (node slot) the fault throttles; idle: no rank sits there since a restart
    device_rank: int = field(default=0, init=False)
    idle: bool = field(default=False, init=False)
    _cg: CpuCgroup | None = field(default=None, init=False, repr=False)
    _shared: CpuCgroup | None = field(default=None, init=False, repr=False)
    _before: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.device_rank = self.rank

    @property
    def target(self) -> str:
        if self.idle:
            return f"rank={self.rank} (its device holds no rank now)"
        return f"rank={self.device_rank}" if self.device_rank != self.rank else f"rank={self.rank}"

    def retarget(self, rank: int | None) -> None:
        """Move the fault with its device: after a restart with a new placement, `rank` is whichever rank now
        sits on the device (node slot) the fault throttles, None when no rank does (the fault then holds
        nothing back until a rank is placed there again). Call while the fault is stopped."""
        self.idle = rank is None
        if rank is not None:
            self.device_rank = rank

    def validate(self, target: FaultTarget) -> None:
        _range_check("rank", self.rank, target.world_size, "ranks")
        _check_below_cap(target, self.quota, "cpu fault", f"rank {self.rank}")

    def _apply(self) -> None:
        if self.idle:
            return
        env = self._env()
        rank = self.device_rank
        # a target that already keeps each rank in its own cgroup (the testbed) is capped in place;
        # otherwise the rank's processes move into a fresh cgroup for the fault's duration
        own = getattr(env, "rank_cgroup", None)
        cg_existing = own(rank) if own is not None else None
        if cg_existing is not None:
            # the period of the base cap, so that the fault only changes the share of it
            self._before = cg_existing.quota()
            cg_existing.set_quota(self.quota, period_us=cg_existing.period_us())
            self._shared = cg_existing
            return
        cg = CpuCgroup.create(f"r{rank}-{len(self.episodes)}", prefix=env.cgroup_prefix())
        try:
            for pid in env.rank_pids(rank):
                cg.add(pid)
            cg.set_quota(self.quota)
        except BaseException:
            cg.destroy()
            raise
        self._cg = cg

    def _remove(self) -> None:
        if self._shared is not None:
            if self._before is None:
                self._shared.clear_quota()
            else:
                self._shared.set_quota(self._before, period_us=self._shared.period_us())
            self._shared, self._before = None, None
        if self._cg is not None:
            self._cg.destroy()
            self._cg = None


@dataclass
class _TrainerFault(Fault):
    """A fault the trainers apply themselves, switched through the control channel."""

    _pending_iter: int | None = field(default=None, init=False, repr=False)

    def payload(self) -> dict[str, Any]:
        raise NotImplementedError

    def _id(self) -> str:
        return f"{self.kind}@{id(self):x}"

    def _apply(self) -> None:
        self._pending_iter = self._env().set_trainer_fault(self._id(), {"kind": self.kind, **self.payload()})

    def _remove(self) -> None:
        self._pending_iter = self._env().set_trainer_fault(self._id(), None)

    def start(self) -> None:
        """Activate; the episode also records the iteration the trainers switch at (``start_iter``)."""
        was = self.active
        super().start()
        if not was and self.active:
            self.episodes[-1]["start_iter"] = self._pending_iter

    def stop(self) -> None:
        """Deactivate; the episode also records the iteration the trainers switch back at (``end_iter``)."""
        was = self.active
        super().stop()
        if was and not self.active:
            self.episodes[-1]["end_iter"] = self._pending_iter


@dataclass
class GcFault(_TrainerFault):
    """Stop-the-world pauses on one rank: every `every` iterations, gc.collect() then `pause` seconds."""

    rank: int = 0
    every: int = 5
    pause: float = 0.2
    kind: ClassVar[str] = "gc"

    @property
    def target(self) -> str:
        return f"rank={self.rank}"

    def validate(self, target: FaultTarget) -> None:
        _range_check("rank", self.rank, target.world_size, "ranks")

    def payload(self) -> dict[str, Any]:
        return {"rank": self.rank, "every": self.every, "pause": self.pause}


@dataclass
class SeqlenFault(_TrainerFault):
    """Sequence-length imbalance: DP replica `dp` gets sequences `factor` × as long."""

    dp: int = 0
    factor: float = 1.5
    kind: ClassVar[str] = "seqlen"

    @property
    def target(self) -> str:
        return f"dp={self.dp}"

    def validate(self, target: FaultTarget) -> None:
        _range_check("dp", self.dp, target.layout_sizes()["dp"], "DP replicas")

    def payload(self) -> dict[str, Any]:
        return {"dp": self.dp, "factor": self.factor}


@dataclass
class StageFault(_TrainerFault):
    """Pipeline-stage imbalance: stage `pp` computes `factor` × as long, or as if it had `layers` more."""

    pp: int = 0
    factor: float | None = None
    layers: int | None = None
    kind: ClassVar[str] = "stage"

    @property
    def target(self) -> str:
        return f"pp={self.pp}"

    def validate(self, target: FaultTarget) -> None:
        _range_check("pp", self.pp, target.layout_sizes()["pp"], "pipeline stages")

    def payload(self) -> dict[str, Any]:
        return {"pp": self.pp, "factor": self.factor, "layers": self.layers}


@dataclass
class PoissonFault(Fault):
    """Random fault episodes: gaps ~ Exp(mean_gap), durations ~ Exp(mean_dur), kind drawn from `kinds`."""

    mean_gap: float = 30.0
    mean_dur: float = 10.0
    kinds: tuple[str, ...] = ("cpu", "link")
    quota: float = 0.3
    rate: str = "20mbit"
    seed: int = 0
    kind: ClassVar[str] = "poisson"
    children: list[Fault] = field(default_factory=list, init=False, repr=False)
    _stop_evt: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)

    @property
    def target(self) -> str:
        return "random"

    def validate(self, target: FaultTarget) -> None:
        if "link" in self.kinds and not target.link_devices(0):
            raise InputError("poisson with kinds=link needs link faults, unavailable on loopback")
        if "cpu" in self.kinds:
            _check_below_cap(target, self.quota, "poisson cpu")

    def _loop(self) -> None:
        rng = random.Random(self.seed)
        env = self._env()
        while not self._stop_evt.wait(rng.expovariate(1.0 / self.mean_gap)):
            kind = rng.choice(self.kinds)
            child: Fault
            if kind == "cpu":
                rank = rng.randrange(env.world_size)
                child = CpuFault(spec=f"cpu:rank={rank},quota={self.quota}", rank=rank, quota=self.quota)
            else:
                node = rng.randrange(env.num_nodes)
                child = LinkFault(spec=f"link:node={node},rate={self.rate}", node=node, rate=self.rate)
            try:
                child.bind(env)
                child.start()
            except InputError:  # the node's link is (or may be) a path fault's now: skip this episode
                continue
            self.children.append(child)
            self._stop_evt.wait(rng.expovariate(1.0 / self.mean_dur))
            child.stop()

    def _apply(self) -> None:
        self._stop_evt.clear()
        self._thread = threading.Thread(target=self._loop, name="poisson-faults", daemon=True)
        self._thread.start()

    def _remove(self) -> None:
        self._stop_evt.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for child in self.children:
            child.stop()

    def log(self) -> list[dict[str, Any]]:
        """The child episodes (each a cpu or link fault), tagged with the poisson spec."""
        out = []
        for child in self.children:
            for e in child.log():
                out.append({**e, "parent": self.spec})
        return out


def _num(key: str, raw: str, kind: type, spec: str) -> Any:
    try:
        return kind(raw)
    except ValueError:
        raise InputError(f"bad value {key}={raw!r} in fault spec {spec!r}") from None


_KINDS: dict[str, tuple[type[Fault], set[str], set[str]]] = {
    # kind: (class, required keys, optional keys)
    "link": (LinkFault, {"node", "rate"}, set()),
    "path": (PathFault, {"a", "b", "rate"}, set()),
    "cpu": (CpuFault, {"rank", "quota"}, set()),
    "gc": (GcFault, {"rank"}, {"every", "pause"}),
    "seqlen": (SeqlenFault, {"dp", "factor"}, set()),
    "stage": (StageFault, {"pp"}, {"factor", "layers"}),
    "poisson": (PoissonFault, {"mean_gap", "mean_dur"}, {"kinds", "quota", "rate", "seed"}),
}


def parse_spec(spec: str) -> Fault:
    """Parse a fault spec such as ``cpu:rank=3,quota=0.3,at=10,for=20`` (see module doc).

    Raises:
        InputError: unknown kind or key, missing key, or a value out of range.
    """
    kind, sep, rest = spec.strip().partition(":")
    if kind not in _KINDS:
        raise InputError(f"unknown fault kind {kind!r} in spec {spec!r}; known kinds: {', '.join(_KINDS)}")
    if not sep or not rest.strip():
        raise InputError(f"fault spec {spec!r} has no parameters (want {kind}:key=value,...)")
    cls, required, optional = _KINDS[kind]
    kv: dict[str, str] = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key or not value.strip() or "=" in value or " " in value.strip():
            raise InputError(f"bad item {item!r} in fault spec {spec!r} (want key=value)")
        if key not in required | optional | _SCHEDULE_KEYS:
            allowed = ", ".join(sorted(required | optional | _SCHEDULE_KEYS))
            raise InputError(f"unknown key {key!r} in fault spec {spec!r}; allowed: {allowed}")
        kv[key] = value.strip()
    missing = required - kv.keys()
    if missing:
        raise InputError(f"fault spec {spec!r} lacks {', '.join(sorted(missing))}")
    sched = Schedule(
        at_s=_num("at", kv["at"], float, spec) if "at" in kv else None,
        for_s=_num("for", kv["for"], float, spec) if "for" in kv else None,
        start_iter=_num("start_iter", kv["start_iter"], int, spec) if "start_iter" in kv else None,
        stop_iter=_num("stop_iter", kv["stop_iter"], int, spec) if "stop_iter" in kv else None,
    )
    for name, val in (("at", sched.at_s), ("for", sched.for_s), ("start_iter", sched.start_iter),
                      ("stop_iter", sched.stop_iter)):
        if val is not None and val < 0:
            raise InputError(f"{name} must be >= 0 in fault spec {spec!r}")
    args: dict[str, Any] = {}
    if kind == "link":
        args = {"node": _num("node", kv["node"], int, spec), "rate": kv["rate"]}
        try:
            parse_rate(kv["rate"])
        except ValueError as exc:
            raise InputError(f"{exc} in fault spec {spec!r}") from None
    elif kind == "path":
        args = {"a": _num("a", kv["a"], int, spec), "b": _num("b", kv["b"], int, spec), "rate": kv["rate"]}
        if args["a"] == args["b"]:
            raise InputError(f"path fault needs two different nodes (a != b) in spec {spec!r}")
        try:
            parse_rate(kv["rate"])
        except ValueError as exc:
            raise InputError(f"{exc} in fault spec {spec!r}") from None
    elif kind == "cpu":
        args = {"rank": _num("rank", kv["rank"], int, spec), "quota": _num("quota", kv["quota"], float, spec)}
        if not 0.01 <= args["quota"] <= 64:
            raise InputError(f"quota must be in [0.01, 64] CPUs in fault spec {spec!r}")
    elif kind == "gc":
        args = {"rank": _num("rank", kv["rank"], int, spec), "every": _num("every", kv.get("every", "5"), int, spec),
                "pause": _num("pause", kv.get("pause", "0.2"), float, spec)}
        if args["every"] < 1 or args["pause"] < 0:
            raise InputError(f"gc needs every >= 1 and pause >= 0 in fault spec {spec!r}")
    elif kind == "seqlen":
        args = {"dp": _num("dp", kv["dp"], int, spec), "factor": _num("factor", kv["factor"], float, spec)}
        if not 0.1 <= args["factor"] <= 4.0:
            raise InputError(f"seqlen factor must be in [0.1, 4] in fault spec {spec!r}")
    elif kind == "stage":
        if ("factor" in kv) == ("layers" in kv):
            raise InputError(f"stage fault needs exactly one of factor= or layers= in spec {spec!r}")
        args = {"pp": _num("pp", kv["pp"], int, spec)}
        if "factor" in kv:
            args["factor"] = _num("factor", kv["factor"], float, spec)
            if not 1.0 <= args["factor"] <= 20.0:
                raise InputError(f"stage factor must be in [1, 20] in fault spec {spec!r}")
        else:
            args["layers"] = _num("layers", kv["layers"], int, spec)
            if args["layers"] < 1:
                raise InputError(f"stage layers must be a positive count (e.g. +2) in fault spec {spec!r}")
    elif kind == "poisson":
        kinds = tuple(kv.get("kinds", "cpu|link").split("|"))
        bad = [k for k in kinds if k not in ("cpu", "link")]
        if bad or not kinds:
            raise InputError(f"poisson kinds must be cpu and/or link (cpu|link), got {kv.get('kinds')!r}")
        args = {"mean_gap": _num("mean_gap", kv["mean_gap"], float, spec),
                "mean_dur": _num("mean_dur", kv["mean_dur"], float, spec), "kinds": kinds,
                "quota": _num("quota", kv.get("quota", "0.3"), float, spec), "rate": kv.get("rate", "20mbit"),
                "seed": _num("seed", kv.get("seed", "0"), int, spec)}
        if args["mean_gap"] <= 0 or args["mean_dur"] <= 0:
            raise InputError(f"poisson mean_gap and mean_dur must be > 0 in spec {spec!r}")
        try:
            parse_rate(args["rate"])
        except ValueError as exc:
            raise InputError(f"{exc} in fault spec {spec!r}") from None
    for key in ("node", "a", "b", "rank", "dp", "pp"):
        if key in args and args[key] < 0:
            raise InputError(f"{key} must be >= 0 in fault spec {spec!r}")
    return cls(spec=spec.strip(), schedule=sched, **args)

"""The testbed launcher: namespaces, rank processes, fault schedule, control channel and the report.

:class:`Testbed` runs one job. ``start()`` creates one network namespace per node (as root; loopback
otherwise), writes the run directory (config, control file) and spawns one ``testbed.worker``
process per rank inside its node's namespace. ``poll()`` reads the ranks' progress lines, switches
scheduled faults on and off and checks the processes. ``wait()`` runs until the job ends and
returns the report. ``close()`` (also on SIGTERM/SIGINT via :func:`signals_raise`) removes every
process, qdisc, cgroup and namespace it created; everything is recorded in a state file first so
``failslow testbed cleanup`` can finish the job after a SIGKILL.

The object is also the :class:`testbed.faults.FaultTarget` faults act on and the backend of
:class:`testbed.adapter.TestbedAdapter` (micro-batch counts, checkpoints, restart with a new placement).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from failslow.errors import InputError
from failslow.topology import Layout
from testbed import validation
from testbed.cgroup import CpuCgroup, cpu_controller_available
from testbed.config import ModelConfig
from testbed.faults import CpuFault, Fault, parse_spec
from testbed.netns import NetCluster, have_root
from testbed.state import ENV_PREFIX, RUN_DIR_PREFIX, StateFile, cleanup, kill_process, new_prefix, pid_alive
from testbed.trace import write_trace

CONTROL_LEAD_ITERS = 3  # control changes apply this many iterations after the fastest rank's last one


class TestbedError(RuntimeError):
    """The job failed at run time (a rank died, a timeout); the message says which and why."""


def device_slot(placement: Sequence[int], rank: int) -> tuple[int, int]:
    """The device `rank` runs on: (its node, its index among that node's ranks in rank order)."""
    node = placement[rank]
    return node, [r for r, n in enumerate(placement) if n == node].index(rank)


def rank_at(placement: Sequence[int], slot: tuple[int, int]) -> int | None:
    """The rank `placement` puts on device `slot`, None when that node holds fewer ranks."""
    on = [r for r, n in enumerate(placement) if n == slot[0]]
    return on[slot[1]] if slot[1] < len(on) else None


@dataclass
class JobConfig:
    """Everything that defines a testbed job (see ``failslow testbed run --help``)."""

    dp: int = 2
    pp: int = 2
    tp: int = 1
    ranks_per_node: int | None = None
    iterations: int = 20
    micro_batches: int = 4
    model: ModelConfig = field(default_factory=ModelConfig)
    seed: int = 0
    job: str = "testbed"
    torch_hook: bool = False
    ring_dir: str | None = None
    lr: float = 2e-3
    weight_decay: float = 0.01
    namespaces: bool | None = None  # None: when root
    placement: list[int] | None = None  # node of each rank; default rank // ranks_per_node
    spare_nodes: int = 0  # extra nodes (namespaces) with no rank at start: room for a restart off a bad node
    microbatches: list[int] | None = None  # per DP replica from the start; default micro_batches each
    resume_dir: str | None = None
    dump_grads_iters: list[int] = field(default_factory=list)  # save the reduced gradient at these iterations
    repeat_data: bool = False  # every iteration trains on iteration 0's batch (gradient comparisons)
    timeout_s: float = 300.0
    cpu_weight: float = 2.0  # job cgroup weight in ordinary processes per rank; 0: no job cgroup
    # Dedicated-device emulation: every rank capped at `cpu_cap` CPUs (None: uncapped, the ranks share
    # the host's cores). With the caps summing below the cores a rank runs at its cap whatever its
    # neighbours do, as a GPU worker runs on its own device; a CPU fault then lowers one rank's cap.
    cpu_cap: float | None = None
    cpu_period_us: int = 100_000  # CFS period of the rank cgroups (base cap and CPU faults)
    pin_cpus: bool = False  # bind each rank's threads to one CPU (rank modulo the CPUs we may use)
    # Dedicated-device emulation by pacing: each compute op (forward, backward, optimizer) lasts its
    # CPU time / `device_speed` (None: as fast as the shared cores allow). See worker.Rank._pace.
    device_speed: float | None = None

    def layout(self) -> Layout:
        """The parallel layout (ranks per node defaults to the TP size: one TP group per node)."""
        return Layout(tp=self.tp, pp=self.pp, dp=self.dp, ranks_per_node=self.ranks_per_node or self.tp)

    @property
    def total_nodes(self) -> int:
        """Nodes of the cluster: the layout's nodes plus the spares (a placement may use any of them)."""
        return self.layout().num_nodes + self.spare_nodes

    def validate(self) -> Layout:
        """Check the job fits; return its layout.

        Raises:
            InputError: sizes that do not fit together (layers < stages, heads not divisible by TP,
                a world size that is not a whole number of nodes, a bad placement, ...).
        """
        lay = self.layout()
        m = self.model
        if self.iterations < 1:
            raise InputError(f"iterations must be >= 1, got {self.iterations}")
        if self.micro_batches < 1:
            raise InputError(f"micro-batches must be >= 1, got {self.micro_batches}")
        if m.layers < self.pp:
            raise InputError(f"the model has {m.layers} layers, fewer than {self.pp} pipeline stages")
        if m.heads % self.tp or m.d_model % m.heads:
            raise InputError(f"heads ({m.heads}) must divide d_model ({m.d_model}) and be divisible by tp ({self.tp})")
        if (m.ffn_mult * m.d_model) % self.tp:
            raise InputError(f"MLP width {m.ffn_mult * m.d_model} not divisible by tp={self.tp}")
        if min(m.vocab, m.d_model, m.seq_len, m.micro_batch_size) < 1:
            raise InputError("model sizes must be positive")
        if lay.world_size > 64:
            raise InputError(f"world size {lay.world_size} is too large for a testbed on this machine (max 64)")
        if self.microbatches is not None and (len(self.microbatches) != self.dp or min(self.microbatches) < 1):
            raise InputError(f"need {self.dp} micro-batch counts >= 1, got {self.microbatches}")
        if self.cpu_cap is not None:
            if not 0.01 <= self.cpu_cap <= 64:
                raise InputError(f"cpu cap must be in [0.01, 64] CPUs per rank, got {self.cpu_cap}")
            if self.cpu_weight <= 0:
                raise InputError("a cpu cap needs the job's cgroups (cpu_weight > 0)")
        if self.device_speed is not None and not 0.01 <= self.device_speed <= 1:
            raise InputError(f"device speed must be in [0.01, 1] (share of one CPU), got {self.device_speed}")
        if not 1_000 <= self.cpu_period_us <= 1_000_000:
            raise InputError(f"cpu period must be in [1000, 1000000] us, got {self.cpu_period_us}")
        if not 0 <= self.spare_nodes <= 64:
            raise InputError(f"spare nodes must be in 0..64, got {self.spare_nodes}")
        if self.placement is not None:
            nodes = lay.num_nodes + self.spare_nodes
            if len(self.placement) != lay.world_size:
                raise InputError(f"placement has {len(self.placement)} entries for {lay.world_size} ranks")
            if min(self.placement) < 0 or max(self.placement) >= nodes:
                raise InputError(f"placement nodes must be in 0..{nodes - 1}")
            rpn = lay.ranks_per_node or lay.world_size
            full = sorted({n for n in self.placement if self.placement.count(n) > rpn})
            if full:  # a node has as many devices as ranks_per_node, as on a real cluster
                raise InputError(f"placement puts more than {rpn} ranks (ranks per node) on node(s) {full}")
        return lay


def _pdeathsig() -> None:
    # rank processes die with the launcher, even on SIGKILL (PR_SET_PDEATHSIG survives exec of `ip`)
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)


class RankProcess:
    """A rank forked by the zygote: its pid and exit status (from the zygote's exit files)."""

    def __init__(self, pid: int, exit_dir: Path, zygote: subprocess.Popen[bytes]) -> None:
        self.pid, self.exit_dir, self._zygote = pid, exit_dir, zygote

    def poll(self) -> int | None:
        """Exit status, or None while running."""
        f = self.exit_dir / str(self.pid)
        if f.exists():
            return int(f.read_text())
        if self._zygote.poll() is not None and not pid_alive(self.pid):
            return -signal.SIGKILL  # the zygote is gone and took the rank with it
        return None


class Zygote:
    """The fork server process (testbed.zygote) and its request pipe."""

    def __init__(self, proc: subprocess.Popen[bytes], exit_dir: Path) -> None:
        self.proc, self.exit_dir = proc, exit_dir

    @classmethod
    def start(cls, exit_dir: Path, env: dict[str, str], on_started: Callable[[int], None] | None = None) -> Zygote:
        """Start the zygote and wait until it has imported torch (`on_started(pid)` runs before the wait)."""
        proc = subprocess.Popen([sys.executable, "-m", "testbed.zygote", str(exit_dir)], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=_pdeathsig, cwd=str(Path(__file__).resolve().parent.parent))
        z = cls(proc, exit_dir)
        if on_started is not None:
            on_started(proc.pid)
        if z._read().get("ready") is not True:
            raise TestbedError("zygote did not start")
        return z

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline() if self.proc.stdout is not None else b""
        if not line:
            err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
            raise TestbedError(f"zygote exited ({self.proc.poll()}): {err[-2000:]}")
        data: dict[str, Any] = json.loads(line)
        return data

    def spawn(self, req: dict[str, Any]) -> RankProcess:
        """Fork one rank; returns its handle."""
        if self.proc.stdin is None:
            raise TestbedError("zygote has no request pipe")
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        reply = self._read()
        return RankProcess(int(reply["pid"]), self.exit_dir, self.proc)

    def stop(self) -> None:
        """Close the pipe (the zygote kills any child left) and reap the zygote."""
        with contextlib.suppress(Exception):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """Turn SIGTERM/SIGINT into SystemExit/KeyboardInterrupt so ``finally`` clean-ups run."""

    def on_term(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    for s in old:
        signal.signal(s, on_term)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class Testbed:
    """One testbed job: set-up, run, faults, control and report. Use as a context manager."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, config: JobConfig, faults: Sequence[str | Fault] = (), *, run_dir: str | Path | None = None,
                 on_iteration: Callable[[dict[str, Any]], None] | None = None, log: Callable[[str], None] | None = None):
        self.config = config
        self.layout = config.validate()
        self.world_size = self.layout.world_size
        self.num_nodes = config.total_nodes  # the job's nodes and the spares: any may hold ranks after a restart
        self.placement = list(config.placement) if config.placement else \
            [self.layout.node_of(r) for r in range(self.world_size)]
        self.use_ns = have_root() if config.namespaces is None else config.namespaces
        if self.use_ns and not have_root():
            raise InputError("network namespaces need root")
        self.faults: list[Fault] = []
        self.net: NetCluster | None = None
        for f in faults:
            fault = parse_spec(f) if isinstance(f, str) else f
            fault.bind(self)
            self.faults.append(fault)
        self._own_dir = run_dir is None
        self.run_dir = Path(run_dir) if run_dir else Path(tempfile.mkdtemp(prefix=RUN_DIR_PREFIX))
        self.prefix = new_prefix()
        self.state = StateFile.for_owner()
        self.procs: dict[int, RankProcess] = {}
        self._zyg: Zygote | None = None
        self.on_iteration, self.log = on_iteration, log or (lambda _m: None)
        self.records: dict[int, list[dict[str, Any]]] = {r: [] for r in range(self.world_size)}
        self._offsets: dict[int, int] = {}
        self._ready: dict[int, float] = {}
        self._param_bytes: dict[int, int] = {}  # each rank's parameter bytes (its gradient's size)
        self._done: set[int] = set()
        self._snapshots: list[dict[str, Any]] = []
        self._segment = 0
        self._cpu_slots: dict[int, tuple[int, int]] = {}  # CPU faults whose device holds no rank now
        self._segments: list[dict[str, Any]] = []
        self._startup_s: float | None = None
        self.training_start: float | None = None  # of the current segment
        self._first_start: float | None = None  # of the job: timed fault schedules count from it
        self.start_unix = time.time()
        self._closed = False
        self.job_cgroup: CpuCgroup | None = None
        self._rank_cgroups: dict[int, CpuCgroup] = {}

    # --- FaultTarget --------------------------------------------------------------------------

    def link_devices(self, node: int) -> list[tuple[str, str]]:
        """Both veth ends of `node`, or [] on loopback (link faults unavailable)."""
        if not self.use_ns:
            return []
        if self.net is None:  # validation before start(): names are known in advance
            return [("pending", "eth0")]
        return self.net.link_devices(node)

    def rank_pids(self, rank: int) -> list[int]:
        """The process of `rank`."""
        p = self.procs.get(rank)
        return [p.pid] if p is not None and p.poll() is None else []

    def rank_cgroup(self, rank: int) -> CpuCgroup | None:
        """The cgroup holding `rank`'s process (CPU faults set its quota), if the job has cgroups."""
        return self._rank_cgroups.get(rank)

    @property
    def cpu_cap(self) -> float | None:
        """The most CPU a healthy rank computes with (the smaller of its cgroup cap and its device
        speed), or None when unlimited: a CPU fault's quota must be below it to slow the rank."""
        limits = [x for x in (self.config.cpu_cap, self.config.device_speed) if x is not None]
        return min(limits) if limits else None

    def cgroup_prefix(self) -> str:
        """Cgroups of this job's faults share its prefix."""
        return self.prefix

    def layout_sizes(self) -> dict[str, int]:
        """{"dp", "pp", "tp"} of the job."""
        return {"dp": self.layout.dp, "pp": self.layout.pp, "tp": self.layout.tp}

    def set_trainer_fault(self, fault_id: str, payload: dict[str, Any] | None) -> int:
        """Switch an in-trainer fault on (payload) or off (None) from a near-future iteration (returned)."""
        state = self._current()
        faults = dict(state.get("faults") or {})
        if payload is None:
            faults.pop(fault_id, None)
        else:
            faults[fault_id] = payload
        return self._push({"faults": faults})

    # --- control channel ----------------------------------------------------------------------

    def _current(self) -> dict[str, Any]:
        return dict(self._snapshots[-1]) if self._snapshots else {"apply_at": 0}

    def completed(self) -> int:
        """Iterations completed by the slowest rank (in this job's numbering)."""
        return min((recs[-1]["it"] + 1) if recs else self._start_iter for recs in self.records.values())

    def _max_completed(self) -> int:
        return max((recs[-1]["it"] + 1) if recs else self._start_iter for recs in self.records.values())

    def _next_apply_at(self) -> int:
        # far enough ahead that no rank has started that iteration yet, and never before an earlier
        # snapshot: ranks take the last snapshot whose iteration has come, so order must be monotonic
        if self.procs:
            self.poll(check=False)
        base = (self._max_completed() + CONTROL_LEAD_ITERS) if self.procs else self._start_iter
        return max(base, self._snapshots[-1]["apply_at"] if self._snapshots else 0)

    def _push(self, changes: dict[str, Any], apply_at: int | None = None) -> int:
        """Append a control snapshot; returns the iteration from which every rank applies it."""
        if apply_at is None:
            apply_at = self._next_apply_at()
        snap = {**self._current(), **changes, "apply_at": apply_at}
        self._snapshots.append(snap)
        path = self.run_dir / "control.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"snapshots": self._snapshots}))
        os.replace(tmp, path)
        return apply_at

    def set_microbatches(self, counts: Sequence[int]) -> int:
        """Micro-batches per DP replica from a near-future iteration; returns that iteration.

        The loss of each micro-batch is divided by the total count, so the global-batch gradient
        is unchanged as long as the total stays the same.

        Raises:
            InputError: wrong length or a count < 1.
        """
        counts = [int(c) for c in counts]
        if len(counts) != self.layout.dp or min(counts) < 1:
            raise InputError(f"need {self.layout.dp} micro-batch counts >= 1, got {counts}")
        return self._push({"microbatches": counts})

    def checkpoint(self, directory: str | Path, *, stop: bool = False, timeout_s: float = 120.0) -> int:
        """Save model and optimizer state of every (pp, tp) shard after a near-future iteration.

        Returns:
            The iteration the checkpoint resumes from.
        """
        directory = Path(directory)
        after = self._next_apply_at()
        if after > self.config.iterations - 1:
            raise TestbedError(f"the job ends (iteration {self.config.iterations}) before a checkpoint can be "
                               f"taken at iteration {after}")
        changes: dict[str, Any] = {"checkpoint": {"dir": str(directory), "after_iter": after}}
        if stop:
            changes["stop_at"] = after + 1
        self._push(changes, apply_at=after)
        need = {r for r in range(self.world_size) if self.layout.coords(r).dp == 0}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.poll()
            got = {r for r in need if any(rec.get("checkpoint") == str(directory) for rec in self.records[r])}
            if got == need:
                return after + 1
            if self.finished():
                break
            time.sleep(0.05)
        raise TestbedError(f"checkpoint to {directory} did not complete")

    # --- life cycle ---------------------------------------------------------------------------

    @property
    def _start_iter(self) -> int:
        return self._segments[-1]["resume_iter"] if self._segments else 0

    def start(self) -> None:
        """Create the network, write the run directory and spawn the ranks."""
        if self.config.cpu_cap is not None and not (have_root() and cpu_controller_available()):
            raise InputError("a cpu cap (--cpu-cap) needs root and a cgroup v1 cpu controller")
        cleanup()  # what dead testbeds left behind; live ones are untouched
        for sub in ("progress", "trace", "logs", "requests", "responses", "exits", "grads", "validate"):
            # a reused --run-dir must not feed the previous job's progress lines into this one
            shutil.rmtree(self.run_dir / sub, ignore_errors=True)
            if sub not in ("exits", "grads", "validate"):
                (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        if self.use_ns:
            self.net = NetCluster.create(self.num_nodes, prefix=self.prefix, state=self.state)
        initial: dict[str, Any] = {"faults": {}, "microbatches": self.config.microbatches}
        self._snapshots = []
        self._push(initial, apply_at=0)
        for f in self.faults:
            if not f.schedule.timed and f.kind in ("gc", "seqlen", "stage"):
                f.start()
        self._segments.append({"resume_iter": 0, "placement": list(self.placement), "start_unix": time.time()})
        (self.run_dir / "testbed.json").write_text(json.dumps({
            "pid": os.getpid(), "prefix": self.prefix, "job": self.config.job, "layout": self.layout.to_dict(),
            "placement": self.placement, "namespaces": self.use_ns, "num_nodes": self.num_nodes}))
        self._spawn(self.config.resume_dir)
        for f in self.faults:
            if not f.schedule.timed and f.kind not in ("gc", "seqlen", "stage"):
                f.start()

    def _spawn(self, resume_dir: str | None) -> None:
        cfg = self.config
        seg = self._segment
        run_cfg = {
            "layout": {"tp": cfg.tp, "pp": cfg.pp, "dp": cfg.dp, "ranks_per_node": self.layout.ranks_per_node},
            "model": asdict(cfg.model), "seed": cfg.seed,
            "iterations": cfg.iterations, "micro_batches": cfg.micro_batches, "job": cfg.job,
            "torch_hook": cfg.torch_hook, "optimizer": {"lr": cfg.lr, "weight_decay": cfg.weight_decay},
            "resume_dir": resume_dir, "dump_grads_iters": cfg.dump_grads_iters,
            "repeat_data": cfg.repeat_data, "timeout_s": cfg.timeout_s,
            "segment": seg, "pin_cpus": cfg.pin_cpus, "device_speed": cfg.device_speed,
        }
        (self.run_dir / "config.json").write_text(json.dumps(run_cfg, indent=1))
        if self.net is not None:
            master, port, ifname = self.net.address(self.placement[0]), 29500 + seg, self.net.nodes[0].ifname
        else:
            master, port, ifname = "127.0.0.1", _free_port(), "lo"
        zygote = self._zygote()
        self._segments[-1]["spawned_unix"] = time.time()
        for rank in range(self.world_size):
            env = {**os.environ, "MASTER_ADDR": master, "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": ifname,
                   "RANK": str(rank), "WORLD_SIZE": str(self.world_size), "OMP_NUM_THREADS": "1",
                   "MKL_NUM_THREADS": "1", "FAILSLOW_JOB": cfg.job, ENV_PREFIX: self.prefix,
                   "FAILSLOW_NODE_ID": str(self.placement[rank]), "PYTHONUNBUFFERED": "1"}
            if cfg.ring_dir:
                env["FAILSLOW_SHM_DIR"] = cfg.ring_dir
            req = {"rank": rank, "netns": self.net.nodes[self.placement[rank]].netns if self.net else None,
                   "env": env, "log": str(self.run_dir / "logs" / f"rank{rank}.seg{seg}.log"),
                   "argv": [str(self.run_dir), str(rank)]}
            proc = zygote.spawn(req)
            self.state.add("pids", proc.pid)
            self.procs[rank] = proc
        self._place_in_cgroups()

    def _zygote(self) -> Zygote:
        if self._zyg is None:
            env = {**os.environ, ENV_PREFIX: self.prefix, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            self._zyg = Zygote.start(self.run_dir / "exits", env, on_started=self._into_job_cgroup)
            self.state.add("pids", self._zyg.proc.pid)
        return self._zyg

    def _job_cgroup(self) -> CpuCgroup | None:
        if not (have_root() and cpu_controller_available() and self.config.cpu_weight > 0):
            return None
        if self.job_cgroup is None:
            self.job_cgroup = CpuCgroup.create("job", prefix=self.prefix, state=self.state)
            self.job_cgroup.set_shares(int(1024 * self.world_size * self.config.cpu_weight))
        return self.job_cgroup

    def _into_job_cgroup(self, pid: int) -> None:
        # the zygote imports torch for every rank: give that the job's weight too
        job = self._job_cgroup()
        if job is not None:
            with contextlib.suppress(Exception):
                job.add(pid)

    def _place_in_cgroups(self) -> None:
        # One cgroup per rank under a job cgroup. The job's CPU weight keeps measurements about the
        # injected faults rather than about whatever else loads this shared machine, and a CPU fault
        # only has to set a quota on the rank's cgroup.
        job = self._job_cgroup()
        if job is None:
            return
        cap = self.config.cpu_cap
        for rank, proc in self.procs.items():
            cg = self._rank_cgroups.get(rank) or job.child(f"r{rank}")
            self._rank_cgroups[rank] = cg
            if cg.quota() is None:  # a restart keeps a cap (or a fault's quota) in place
                if cap is not None:
                    cg.set_quota(cap, period_us=self.config.cpu_period_us)
                else:  # a CPU fault sets its quota at the cgroup's period
                    cg.set_period(self.config.cpu_period_us)
            with contextlib.suppress(Exception):
                cg.add(proc.pid)

    def _log_tail(self, rank: int, n: int = 15) -> str:
        path = self.run_dir / "logs" / f"rank{rank}.seg{self._segment}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def poll(self, check: bool = True) -> list[dict[str, Any]]:
        """Read new progress lines, run fault schedules, check the ranks; returns new iteration records.

        Raises:
            TestbedError: a rank exited with an error (its log tail is in the message).
        """
        new: list[dict[str, Any]] = []
        for rank in range(self.world_size):
            path = self.run_dir / "progress" / f"rank{rank}.jsonl"
            try:
                with open(path) as f:
                    f.seek(self._offsets.get(rank, 0))
                    chunk = f.read()
            except OSError:
                continue
            complete = chunk[: chunk.rfind("\n") + 1]
            self._offsets[rank] = self._offsets.get(rank, 0) + len(complete.encode())
            for line in complete.splitlines():
                rec = json.loads(line)
                if rec.get("ready"):
                    self._ready[rank] = rec["t"]
                    if rec.get("param_bytes") is not None:
                        self._param_bytes[rank] = int(rec["param_bytes"])
                elif rec.get("done"):
                    self._done.add(rank)
                else:
                    rec["segment"] = self._segment
                    self.records[rank].append(rec)
                    new.append(rec)
        if self.training_start is None and len(self._ready) == self.world_size:
            self.training_start = time.monotonic()
            if self._first_start is None:
                self._first_start = self.training_start
        for rec in new:
            if self.on_iteration is not None:
                self.on_iteration(rec)
        if check:
            self._run_schedules()
            for rank, p in self.procs.items():
                rc = p.poll()
                if rc not in (None, 0):
                    raise TestbedError(f"rank {rank} exited with status {rc}; its log ends:\n{self._log_tail(rank)}")
        return new

    def _run_schedules(self) -> None:
        # a schedule in seconds is the cluster's clock: a restart of the job neither resets nor pauses it
        if self.training_start is None or self._first_start is None:
            return
        elapsed = time.monotonic() - self._first_start
        done = self.completed()
        for f in self.faults:
            if not f.schedule.timed:
                continue
            sch = f.schedule
            if (sch.start_iter is not None and sch.stop_iter is not None and not f.active and not f.episodes
                    and not f.start_failed
                    and done >= sch.stop_iter > sch.start_iter):
                # The whole window passed between two polls (a short window early in a fast job on a busy
                # machine): run it late, for as many iterations, rather than not at all.
                n = sch.stop_iter - sch.start_iter
                self.log(f"fault window {f.spec} passed before a poll saw it (iteration {done}): "
                         f"running it for iterations {done}-{done + n}")
                f.schedule = replace(sch, start_iter=done, stop_iter=done + n)
            want = f.schedule.should_be_active(elapsed, done)
            if want and not f.active and not self.finished():
                self.log(f"fault on:  {f.spec} (iteration {done}, {elapsed:.1f} s)")
                f.start()
            elif not want and f.active:
                self.log(f"fault off: {f.spec} (iteration {done}, {elapsed:.1f} s)")
                f.stop()

    def inject(self, spec: str | Fault) -> Fault:
        """Start a fault now (Python API for run-time injection); returns it for :meth:`remove`."""
        fault = parse_spec(spec) if isinstance(spec, str) else spec
        fault.bind(self)
        self.faults.append(fault)
        fault.start()
        self.log(f"fault on:  {fault.spec}")
        return fault

    def remove(self, fault: Fault) -> None:
        """Stop a fault started with :meth:`inject` (or any fault of this job)."""
        fault.stop()
        self.log(f"fault off: {fault.spec}")

    def finished(self) -> bool:
        """Whether every rank process has exited."""
        return bool(self.procs) and all(p.poll() is not None for p in self.procs.values())

    def wait(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Run until the job ends; returns the report."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.finished():
            self.poll()
            self.serve_requests()
            if deadline is not None and time.monotonic() > deadline:
                raise TestbedError(f"job did not finish within {timeout_s} s")
            time.sleep(0.05)
        self.poll()
        for f in self.faults:
            f.stop()
        return self.report()

    def serve_requests(self) -> int:
        """Answer pending requests of the run directory's file protocol (see testbed.adapter); returns how many."""
        reqs = sorted((self.run_dir / "requests").glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        for path in reqs:
            try:
                req = json.loads(path.read_text())
                rid = str(req.get("id") or path.stem)
            except (OSError, ValueError):
                continue
            path.unlink(missing_ok=True)
            try:
                result = self._handle(req)
                resp: dict[str, Any] = {"id": rid, "ok": True, "result": result}
            except (InputError, TestbedError, KeyError, TypeError, ValueError) as exc:
                resp = {"id": rid, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
            out = self.run_dir / "responses" / f"{rid}.json"
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(resp))
            os.replace(tmp, out)
        return len(reqs)

    def status(self) -> dict[str, Any]:
        """What a controller needs to know of the running job (the ``status`` request's answer).

        ``microbatches`` is the split the newest control snapshot asks for (from its ``apply_at``
        iteration); ``last_iteration_end_unix`` and ``recent_iteration_s`` (median of the last 10 iterations
        of the slowest rank) let a controller measure the pause an action caused. ``num_nodes`` counts every
        node, spares (``--spare-nodes``) included; ``spare_nodes`` lists those holding no rank now.
        ``resume_iteration`` is where the current segment started and ``restart_pause_s`` the time no rank
        trained across the last restart (from the end of the last iteration before it to the start of the
        first after it; None before a restart or until that iteration ends). ``startup_s`` is what the job
        took to come up (:meth:`startup`) and ``expected_costs`` what each strategy should cost it before one
        was measured (:meth:`expected_costs`).
        """
        cur = self._current()
        ends = [recs[-1]["end_unix"] for recs in self.records.values() if recs]
        recent = sorted(r["dt"] for recs in self.records.values() for r in recs[-10:])
        return {"layout": self.layout.to_dict(), "placement": self.placement, "num_nodes": self.num_nodes,
                "completed": self.completed(), "faults": [f.spec for f in self.faults if f.active],
                "run_dir": str(self.run_dir), "job": self.config.job,
                "microbatches": cur.get("microbatches") or [self.config.micro_batches] * self.layout.dp,
                "microbatches_from": cur.get("apply_at", 0), "segments": len(self._segments),
                "last_iteration_end_unix": min(ends) if len(ends) == self.world_size else None,
                "recent_iteration_s": recent[len(recent) // 2] if recent else None,
                "iterations": self.config.iterations, "spare_nodes": self.spare_nodes(),
                "resume_iteration": self._start_iter, "restart_pause_s": self._restart_pause(),
                "startup_s": self.startup(), "expected_costs": self.expected_costs(), "traffic": self.traffic()}

    def startup(self) -> float | None:
        """Seconds from spawning the job's first ranks (torch already imported by the zygote) to the start of
        their first iteration (rendezvous, model, data): the part of a restart that does not depend on the
        checkpoint. None until every rank ended its first iteration."""
        if self._startup_s is None and self._segments and "spawned_unix" in self._segments[0]:
            first = self._segments[0]["resume_iter"]
            starts = [float(recs[0]["end_unix"] - recs[0]["dt"]) for recs in self.records.values()
                      if recs and recs[0]["segment"] == 0 and recs[0]["it"] == first]
            if len(starts) == self.world_size:
                self._startup_s = max(0.0, min(starts) - float(self._segments[0]["spawned_unix"]))
        return self._startup_s

    def expected_costs(self) -> dict[str, float]:
        """Seconds of training each strategy should cost this job, for a planner that has measured none yet:
        a split applies at an iteration boundary (0), a validation the benchmarks' length
        (:func:`testbed.validation.expected_pause_s` over the nodes holding ranks), a restart or a new placement
        the job's start-up, once known: the part of a restart the job has shown already, to which stopping at
        a boundary with a checkpoint and reading it back add (a restart of DP2xPP2 at 0.4 CPU paused
        0.54-0.64 s where its start-up took 0.14 s)."""
        out = {"rebalance": 0.0, "validate": validation.expected_pause_s(len(set(self.placement)))}
        up = self.startup()
        if up is not None:
            out["topology"] = out["restart"] = up
        return out

    def traffic(self) -> dict[str, Any] | None:
        """Bytes the job moves, for a placement model (:class:`failslow.plan.placement.PlacementParams`):
        ``grad_bytes`` per stage (the gradient all-reduced across DP replicas each iteration, all TP shards
        of the stage together, as the ranks reported their parameters) and ``p2p_bytes`` per micro-batch
        across a pipeline hop (activations forward and their gradients backward, float32); None until
        every rank reported."""
        if len(self._param_bytes) < self.world_size:
            return None
        lay = self.layout
        grad = [sum(self._param_bytes[r] for r in range(lay.world_size)
                    if lay.coords(r).pp == s and lay.coords(r).dp == 0) for s in range(lay.pp)]
        m = self.config.model
        return {"grad_bytes": grad, "p2p_bytes": 2 * m.micro_batch_size * m.seq_len * m.d_model * 4}

    def _restart_pause(self) -> float | None:
        if self._segment == 0:
            return None
        resume = self._start_iter
        stopped: list[float] = []
        started: list[float] = []
        for recs in self.records.values():
            for rec in reversed(recs):
                if rec["it"] == resume and rec["segment"] == self._segment:
                    started.append(float(rec["end_unix"] - rec["dt"]))  # the first iteration starts at the barrier
                elif rec["it"] == resume - 1 and rec["segment"] < self._segment:
                    stopped.append(float(rec["end_unix"]))
                    break
        if len(started) < self.world_size or len(stopped) < self.world_size:
            return None
        return max(0.0, min(started) - max(stopped))

    def spare_nodes(self) -> list[int]:
        """Nodes of the cluster (``--spare-nodes`` included) that hold no rank now."""
        used = set(self.placement)
        return [n for n in range(self.num_nodes) if n not in used]

    def _handle(self, req: dict[str, Any]) -> Any:
        action = req.get("action")
        if action == "status":
            return self.status()
        if action == "set_microbatches":
            return self.set_microbatches(req["counts"])
        if action == "checkpoint":
            return self.checkpoint(req["dir"])
        if action == "restart":
            return self.restart(req.get("placement"), req.get("dir"))
        if action == "inject":
            return self.inject(req["spec"]).spec
        if action == "remove":
            hits = [f for f in self.faults if f.spec == req["spec"] and f.active]
            if not hits:
                raise InputError(f"no active fault {req['spec']!r}")
            for f in hits:
                self.remove(f)
            return len(hits)
        if action == "validate_compute":
            return self.validate_compute(req["ranks"], req.get("peers"), vid=req.get("id"))
        if action == "validate_links":
            thresholds = {k: req[k] for k in ("bandwidth_fraction", "latency_multiple") if req.get(k) is not None}
            return self.validate_links(req.get("nodes"), req.get("ranks"), req.get("suspects"),
                                       req.get("topology", "ring"), vid=req.get("id"), **thresholds)
        raise InputError(f"unknown action {action!r}")

    def validate_compute(self, ranks: Sequence[int], peers: Sequence[int] | None = None,
                         **kw: Any) -> dict[str, Any]:
        """GEMM benchmark on suspect ranks and healthy peers at a near-future iteration boundary (see
        :func:`testbed.validation.validate_compute`)."""
        return validation.validate_compute(self, ranks, peers, **kw)

    def validate_links(self, nodes: Sequence[int] | None = None, ranks: Sequence[int] | None = None,
                       suspects: Sequence[int] | None = None, topology: str = "ring", **kw: Any) -> dict[str, Any]:
        """O(1)-round point-to-point link test of a communicator at a near-future iteration boundary (see
        :func:`testbed.validation.validate_links`)."""
        return validation.validate_links(self, nodes, ranks, suspects, topology, **kw)

    def restart(self, placement: Sequence[int] | None = None, checkpoint_dir: str | Path | None = None) -> int:
        """Checkpoint, stop the ranks and start them again from the checkpoint with a new rank-to-node placement.

        Returns:
            The iteration the job resumed from.
        """
        placement = list(placement) if placement is not None else list(self.placement)
        JobConfig(**{**asdict(self.config), "model": self.config.model, "placement": placement}).validate()
        ck_dir = Path(checkpoint_dir) if checkpoint_dir else self.run_dir / f"ckpt-seg{self._segment}"
        resume = self.checkpoint(ck_dir, stop=True)
        deadline = time.monotonic() + 120
        while not self.finished():
            if time.monotonic() > deadline:
                raise TestbedError("ranks did not stop for the restart")
            self.poll()
            time.sleep(0.05)
        self.poll()
        self._segments[-1]["end_unix"] = time.time()
        for rank, p in self.procs.items():
            self.state.remove("pids", p.pid)
            _ = rank
        cpu_faults = [f for f in self.faults if f.active and isinstance(f, CpuFault)]
        # a CPU fault stands for a slow device: it stays on its node slot (node, index among the node's
        # ranks) and throttles whichever rank the new placement puts there, or nothing when none is
        slots = {id(f): self._cpu_slots.get(id(f)) or device_slot(self.placement, f.device_rank)
                 for f in cpu_faults}
        for f in cpu_faults:  # their processes are gone; re-applied to the new processes below
            f.stop()
        self.procs = {}
        self._ready, self._done = {}, set()
        self.training_start = None
        self._segment += 1
        self.placement = placement
        self._segments.append({"resume_iter": resume, "placement": list(placement), "start_unix": time.time(),
                               "checkpoint": str(ck_dir)})
        self._push({"stop_at": None, "checkpoint": None}, apply_at=resume)
        self._spawn(str(ck_dir))
        for f in cpu_faults:
            slot = slots[id(f)]
            now_on = rank_at(placement, slot)
            f.retarget(now_on)
            if now_on is None:
                self._cpu_slots[id(f)] = slot
            else:
                self._cpu_slots.pop(id(f), None)
            f.start()
        self.log(f"restarted from {ck_dir} at iteration {resume} with placement {placement}")
        return resume

    # --- report -------------------------------------------------------------------------------

    def report(self, trace: str | Path | None = None) -> dict[str, Any]:
        """The report dict (and the trace file when `trace` is given)."""
        times: dict[str, list[float]] = {}
        ends: dict[str, list[float]] = {}
        its: dict[str, list[int]] = {}
        per_it_losses: dict[int, list[tuple[float, int]]] = {}
        for rank, recs in self.records.items():
            times[str(rank)] = [r["dt"] for r in recs]
            ends[str(rank)] = [r["end_unix"] for r in recs]
            its[str(rank)] = [r["it"] for r in recs]
            c = self.layout.coords(rank)
            if c.pp == self.layout.pp - 1 and c.tp == 0:
                for r in recs:
                    if r["loss"] is not None:
                        per_it_losses.setdefault(r["it"], []).append((r["loss"], r["mb"]))
        losses = [sum(lo * m for lo, m in v) / sum(m for _, m in v) for _, v in sorted(per_it_losses.items())]
        faults = [self._effective(e) for f in self.faults for e in f.log()]
        faults.sort(key=lambda e: e["start_unix_s"])
        lay = self.layout
        rep: dict[str, Any] = {
            "job": self.config.job,
            "layout": {**lay.to_dict(), "world_size": lay.world_size, "num_nodes": lay.num_nodes},
            "placement": self.placement,
            "num_nodes": self.num_nodes,
            "spare_nodes": self.spare_nodes(),
            "namespaces": self.use_ns,
            "link_faults_available": self.use_ns,
            "model": asdict(self.config.model),
            "micro_batches": self.config.micro_batches,
            "iterations": its,
            "iteration_time_s": times,
            "iteration_end_unix_s": ends,
            "losses": losses,
            "faults": faults,
            "segments": self._segments,
            "start_unix_s": self.start_unix,
            "end_unix_s": time.time(),
            "run_dir": str(self.run_dir),
            "prefix": self.prefix,
        }
        if trace is not None:
            meta = write_trace(Path(trace), self.run_dir, lay, self.records)
            rep["trace"], rep["trace_meta"] = str(trace), str(meta)
        return rep

    def _iteration_start_unix(self, it: int) -> float | None:
        starts = [r["end_unix"] - r["dt"] for recs in self.records.values() for r in recs if r["it"] == it]
        return min(starts) if starts else None

    def _effective(self, ep: dict[str, Any]) -> dict[str, Any]:
        # trainer faults act from the iteration the control snapshot applies at, not from the moment
        # the launcher wrote it: report that onset (and end), the ground truth detection is scored on
        ep = dict(ep)
        last_end = max((r["end_unix"] for recs in self.records.values() for r in recs), default=None)
        for key, it_key in (("start_unix_s", "start_iter"), ("end_unix_s", "end_iter")):
            if ep.get(it_key) is not None:
                t = self._iteration_start_unix(ep[it_key])
                if t is None and last_end is not None:
                    t = last_end  # switches at an iteration the job never reached: it held to the end
                if t is not None:
                    ep[key] = t
        return ep

    def close(self) -> None:
        """Stop everything this job created (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for f in self.faults:
            with contextlib.suppress(Exception):
                f.stop()
        for p in self.procs.values():
            if p.poll() is None:
                kill_process(p.pid, grace_s=2.0)
            self.state.remove("pids", p.pid)
        if self._zyg is not None:
            self._zyg.stop()
            self.state.remove("pids", self._zyg.proc.pid)
        if self.job_cgroup is not None:
            self.job_cgroup.destroy()
        if self.net is not None:
            self.net.destroy()
        if self._own_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_job(config: JobConfig, faults: Sequence[str] = (), *, report: str | Path | None = None,
            trace: str | Path | None = None, run_dir: str | Path | None = None,
            on_iteration: Callable[[dict[str, Any]], None] | None = None,
            log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run one job start to end (faults by spec); write the report JSON when `report` is given."""
    with Testbed(config, faults, run_dir=run_dir, on_iteration=on_iteration, log=log) as tb:
        tb.start()
        tb.wait()
        rep = tb.report(trace=trace)
    if report is not None:
        Path(report).write_text(json.dumps(rep, indent=1))
    return rep

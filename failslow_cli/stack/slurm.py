"""A real one-machine Slurm cluster for tests: munged, slurmctld and one slurmd per node name, as root.

Debian's slurm-wlm (22.05) runs several slurmd on one host when each is started with ``-N <NodeName>``
and each node has its own ``Port=``; spool, pid and log paths carry ``%n`` so the daemons do not share
files. Everything lives in a fresh temporary directory: the munge key and socket (``AuthInfo=socket=``
points Slurm at it, so a system munged is neither needed nor touched), ``slurm.conf``, the state and
spool directories and the logs. Client commands find the cluster through ``SLURM_CONF`` in
:attr:`SlurmCluster.env`.

Two settings make the cluster quick enough for tests and are the only departures from a production
config: ``cred_expire`` (Slurm holds a requeued job for that long before it may start again; 120 s by
default) and a 1 s scheduler and backfill interval (60 s / 30 s by default), so a requeued job runs
again within seconds instead of minutes.

A daemon that exits or a node that does not become idle raises RuntimeError with the log tails, so the
calling test fails instead of skipping. On exit every job is cancelled, the daemons are stopped by PID,
any process still holding a file in the directory (a slurmstepd left behind by a killed slurmd) is
killed, and the directory is removed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from failslow_cli.stack.processes import free_port, require_binary

MUNGED = "/usr/sbin/munged"
MUNGEKEY = "/usr/sbin/mungekey"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
CLIENTS = ("sbatch", "squeue", "scontrol", "sinfo", "scancel")
CLIENT_DIR = "/usr/bin"


@dataclass
class SlurmCluster:
    """A started cluster: where it lives, its nodes, and how to talk to it.

    Attributes:
        root: The temporary directory holding config, state, spool, logs and the munge socket.
        conf: The slurm.conf path (``SLURM_CONF`` for every client command).
        nodes: Node names, all in one default partition.
        partition: The partition's name.
        env: Environment for client commands (this process's, without inherited ``SLURM_*`` job variables,
            plus ``SLURM_CONF``).
        bin_dir: Where the client commands live.
        procs: The daemons by name (``munged``, ``slurmctld``, ``slurmd-<node>``), to stop one on purpose.
    """

    root: Path
    conf: Path
    nodes: list[str]
    partition: str
    env: dict[str, str]
    bin_dir: str = CLIENT_DIR
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def run(self, *argv: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (``sinfo``, ``scontrol``, ...) against this cluster.

        Raises:
            RuntimeError: the command failed and `check` is set (its stderr in the message).
        """
        cmd = [str(Path(self.bin_dir) / argv[0]), *argv[1:]]
        res = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout, check=False)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
        return res

    def sbatch(self, script: Path, *args: str) -> int:
        """Submit `script` with extra sbatch `args`; returns the job id.

        Jobs run in ``root/jobs`` unless `args` say otherwise, so that cleanup finds anything they leave.
        """
        jobs = self.root / "jobs"
        jobs.mkdir(exist_ok=True)
        out = self.run("sbatch", "--parsable", f"--chdir={jobs}", f"--output={jobs}/slurm-%j.out", *args,
                       str(script)).stdout.strip()
        return int(out.split(";")[0])

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo's long form names it (``idle``, ``allocated``, ``drained``, ...)."""
        lines = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
        return dict(zip(lines[0::2], lines[1::2], strict=True))

    def log_tail(self, chars: int = 3000) -> str:
        """The end of every daemon log, for failure messages."""
        parts = []
        for log in sorted((self.root / "log").glob("*")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)


def _client_env(conf: Path) -> dict[str, str]:
    # Inherited job variables (a test run inside a Slurm job) would make the clients talk about that job.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(conf)
    return env


def render_slurm_conf(root: Path, nodes: Sequence[str], *, ctld_port: int, node_ports: Sequence[int],
                      partition: str = "main", cred_expire_s: int = 5) -> str:
    """The slurm.conf text for a one-host cluster rooted at `root` (pure; the harness writes it)."""
    host = socket.gethostname().split(".")[0]
    lines = [
        "# written by failslow_cli.stack.slurm for one test run",
        "ClusterName=failslow",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        # a global default is still required; every node overrides it below
        f"SlurmdPort={node_ports[0]}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root / 'munge' / 'munge.socket'},cred_expire={cred_expire_s}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}/%n",
        f"SlurmctldPidFile={root / 'run'}/slurmctld.pid",
        f"SlurmdPidFile={root / 'run'}/slurmd-%n.pid",
        f"SlurmctldLogFile={root / 'log'}/slurmctld.log",
        f"SlurmdLogFile={root / 'log'}/slurmd-%n.log",
        f"PlugStackConfig={root / 'plugstack.conf'}",
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "SelectType=select/linear",
        "MpiDefault=none",
        "ReturnToService=2",
        "JobRequeue=1",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=sched_interval=1,bf_interval=1",
        "KillWait=5",
        "MailProg=/bin/true",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
    ]
    for name, port in zip(nodes, node_ports, strict=True):
        lines.append(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=1 "
                     "State=UNKNOWN")
    lines.append(f"PartitionName={partition} Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def _holders(root: Path) -> list[int]:
    """PIDs (not this one) whose cwd or an open file lies under `root`: leftovers of this cluster only."""
    prefix = str(root) + "/"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            links = [os.readlink(entry / "cwd")]
            links += [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue  # gone meanwhile, or a kernel thread
        if any(link == str(root) or link.startswith(prefix) for link in links):
            found.append(int(entry.name))
    return found


def _check_alive(cluster: SlurmCluster) -> None:
    for name, proc in cluster.procs.items():
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited ({proc.returncode}):\n{cluster.log_tail()}")


def _wait_idle(cluster: SlurmCluster, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        _check_alive(cluster)
        res = cluster.run("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=10)
        last = res.stdout + res.stderr
        if res.returncode == 0:
            states = dict(zip(res.stdout.split()[0::2], res.stdout.split()[1::2], strict=True))
            if all(states.get(n) == "idle" for n in cluster.nodes):
                return
        time.sleep(0.3)
    raise RuntimeError(f"Slurm nodes not idle after {timeout}s (sinfo: {last.strip()!r}):\n{cluster.log_tail()}")


def _wait_munge(proc: subprocess.Popen[bytes], sock: Path, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"munged did not come up:\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)


def _teardown(cluster: SlurmCluster) -> None:
    """Cancel jobs while the daemons still run (so steps end cleanly), then stop daemons and leftovers."""
    ctld = cluster.procs.get("slurmctld")
    if ctld is not None and ctld.poll() is None:
        try:
            ids = cluster.run("squeue", "-h", "-o", "%i", check=False, timeout=10).stdout.split()
            if ids:
                cluster.run("scancel", *ids, check=False, timeout=10)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and cluster.run(
                        "squeue", "-h", "-o", "%i", check=False, timeout=10).stdout.strip():
                    time.sleep(0.3)
        except (subprocess.TimeoutExpired, OSError):
            pass  # the daemons are killed below regardless
    # slurmd before slurmctld (a node losing its controller first retries for a while), munge last
    order = [n for n in cluster.procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]
    for name in order:
        if name in cluster.procs:
            _stop(cluster.procs[name])
    for pid in _holders(cluster.root):
        # a slurmstepd whose slurmd is gone ignores SIGTERM while it waits for its controller
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextmanager
def slurm_cluster(nodes: Sequence[str] = ("n1", "n2", "n3"), *, partition: str = "main",
                  cred_expire_s: int = 5, timeout: float = 60.0, parent: Path | None = None) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and one slurmd per node in a fresh temp dir; wait until all nodes are idle.

    Args:
        nodes: Node names (one slurmd each, all on this host, each on its own free port).
        partition: Name of the one (default) partition holding every node.
        cred_expire_s: Slurm's ``cred_expire``, which is also how long a requeued job waits before it may
            start again.
        timeout: Seconds for the nodes to become idle.
        parent: Where to make the temp dir (default: the system temp dir).

    Raises:
        RuntimeError: not root, a binary is missing, or a daemon did not come up (with the log tails).
    """
    if os.geteuid() != 0:
        raise RuntimeError("the Slurm test cluster needs root (slurmd runs jobs as any user)")
    for binary in (MUNGED, MUNGEKEY, SLURMCTLD, SLURMD, *(f"{CLIENT_DIR}/{c}" for c in CLIENTS)):
        require_binary(binary)
    root = Path(tempfile.mkdtemp(prefix="failslow-slurm-", dir=parent))
    # munged refuses a socket directory others may write to, and warns unless all may traverse it
    root.chmod(0o755)
    for sub in ("munge", "state", "spool", "run", "log", "jobs"):
        (root / sub).mkdir()
    for name in nodes:
        (root / "spool" / name).mkdir()
    (root / "munge").chmod(0o755)
    (root / "plugstack.conf").write_text("")
    ports = [free_port() for _ in range(len(nodes) + 1)]
    conf = root / "slurm.conf"
    conf.write_text(render_slurm_conf(root, nodes, ctld_port=ports[0], node_ports=ports[1:],
                                      partition=partition, cred_expire_s=cred_expire_s))
    env = _client_env(conf)
    cluster = SlurmCluster(root=root, conf=conf, nodes=list(nodes), partition=partition, env=env)
    try:
        key = root / "munge" / "munge.key"
        subprocess.run([MUNGEKEY, "--create", f"--keyfile={key}"], check=True, capture_output=True, timeout=30)
        sock = root / "munge" / "munge.socket"
        log = root / "log" / "munged.log"
        cluster.procs["munged"] = _start(
            [MUNGED, "--foreground", "--force", f"--key-file={key}", f"--socket={sock}",
             f"--pid-file={root / 'run' / 'munged.pid'}", f"--seed-file={root / 'munge' / 'munged.seed'}",
             f"--log-file={log}"], root / "log" / "munged.out", env)
        _wait_munge(cluster.procs["munged"], sock, root / "log" / "munged.out", timeout)
        cluster.procs["slurmctld"] = _start([SLURMCTLD, "-D", "-f", str(conf)], root / "log" / "slurmctld.out", env)
        for name in nodes:
            cluster.procs[f"slurmd-{name}"] = _start([SLURMD, "-D", "-N", name, "-f", str(conf)],
                                                     root / "log" / f"slurmd-{name}.out", env)
        _wait_idle(cluster, timeout)
        yield cluster
    finally:
        _teardown(cluster)
        shutil.rmtree(root, ignore_errors=True)

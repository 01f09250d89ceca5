"""Per-node network namespaces joined by a bridge: the "cluster" part of the cluster in a box.

Each testbed node is a network namespace with one veth interface (``eth0``) whose peer sits on a
Linux bridge. The bridge lives in a namespace of its own, so the testbed never adds an interface,
address or route to the root namespace. Traffic between ranks on different nodes therefore crosses
two veth ends, which is where link faults (``tc qdisc ... tbf``) are applied: the node end shapes
what the node sends, the bridge end shapes what it receives.
Path faults (:func:`set_path_rate`: ``htb`` with a ``u32`` filter on the peer's address) shape the
node ends only, each for traffic to the other node.

Names carry a prefix with the owning process id (``fsltb<pid>-<k>-n0``, ``fsltb<pid>-<k>-br``), so several
testbeds can run side by side and ``failslow testbed cleanup`` can tell whose resources are stale.
Every resource is recorded in a :class:`testbed.state.StateFile` before it is created.

Usage (as root)::

    with NetCluster.create(num_nodes=4) as net:
        argv = net.exec_prefix(node=1) + ["python", "-m", "my.worker"]
        set_rate(*net.link_devices(1)[0], rate="20mbit")
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType

from testbed.state import PREFIX, StateFile, new_prefix

NODE_IFNAME = "eth0"
DEFAULT_SUBNET = "10.77.0.0/24"
LATENCY = "100ms"
# Per-namespace TCP settings of the nodes. Gloo's connections idle between bursts (p2p per
# micro-batch, one gradient all-reduce per iteration); with slow start after idle, a link that was
# just throttled keeps collapsing the congestion window long after the throttle is gone.
NODE_SYSCTLS = {"net.ipv4.tcp_slow_start_after_idle": "0", "net.ipv4.tcp_no_metrics_save": "1"}


class NetError(RuntimeError):
    """An `ip`/`tc` command failed (the message carries the command and its stderr)."""


def have_root() -> bool:
    """Whether this process may create namespaces, qdiscs and cgroups."""
    return os.geteuid() == 0


def run_cmd(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one `ip`/`tc` command; raise :class:`NetError` with its stderr when it fails."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def ip(args: Sequence[str], netns: str | None = None, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`ip [-n NETNS] ARGS...`."""
    argv = ["ip"] + (["-n", netns] if netns else []) + list(args)
    return run_cmd(argv, check=check)


def list_namespaces(prefix: str = PREFIX) -> list[str]:
    """Names of the network namespaces whose name starts with `prefix`."""
    out = run_cmd(["ip", "netns", "list"], check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(prefix))


def delete_namespace(name: str) -> bool:
    """Delete one namespace (its veth ends and qdiscs go with it); False when it did not exist."""
    return run_cmd(["ip", "netns", "delete", name], check=False).returncode == 0


def owner_pid(name: str, prefix: str = PREFIX) -> int | None:
    """The owning process id encoded in a resource name such as ``fsltb1234-n0``."""
    m = re.match(re.escape(prefix) + r"(\d+)-", name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Node:
    """One testbed node: its namespace, interface names on both veth ends and its address."""

    index: int
    netns: str
    ifname: str
    bridge_ifname: str
    address: str


@dataclass
class NetCluster:
    """A set of per-node namespaces on one bridge; create with :meth:`create`, remove with :meth:`destroy`."""

    prefix: str
    bridge_netns: str
    nodes: list[Node]
    subnet: str = DEFAULT_SUBNET
    state: StateFile | None = field(default=None, repr=False)

    @classmethod
    def create(
        cls,
        num_nodes: int,
        *,
        prefix: str | None = None,
        subnet: str = DEFAULT_SUBNET,
        state: StateFile | None = None,
    ) -> NetCluster:
        """Create `num_nodes` namespaces, a bridge namespace and the veth pairs joining them.

        Args:
            num_nodes: how many nodes (1 … 250).
            prefix: name prefix; default ``fsltb<pid>-<k>-``. Must be unique on the machine.
            subnet: a private /24 (or larger) used only inside these namespaces.
            state: where created resources are recorded for crash-safe cleanup; default one
                state file per owning process.

        Raises:
            NetError: not root, or an `ip` command failed (whatever was created is removed).
        """
        if not have_root():
            raise NetError("network namespaces need root")
        net = ipaddress.ip_network(subnet)
        hosts = list(net.hosts())
        if not 1 <= num_nodes <= min(250, len(hosts)):
            raise NetError(f"num_nodes must be in 1..{min(250, len(hosts))}, got {num_nodes}")
        prefix = prefix or new_prefix()
        state = state or StateFile.for_owner()
        cluster = cls(prefix=prefix, bridge_netns=f"{prefix}br", nodes=[], subnet=subnet, state=state)
        try:
            state.add("namespaces", cluster.bridge_netns)
            run_cmd(["ip", "netns", "add", cluster.bridge_netns])
            ip(["link", "set", "lo", "up"], cluster.bridge_netns)
            ip(["link", "add", "br0", "type", "bridge"], cluster.bridge_netns)
            ip(["link", "set", "br0", "up"], cluster.bridge_netns)
            for i in range(num_nodes):
                node = Node(index=i, netns=f"{prefix}n{i}", ifname=NODE_IFNAME, bridge_ifname=f"v{i}",
                            address=str(hosts[i]))
                state.add("namespaces", node.netns)
                run_cmd(["ip", "netns", "add", node.netns])
                ip(["link", "add", node.bridge_ifname, "type", "veth", "peer", "name", node.ifname,
                    "netns", node.netns], cluster.bridge_netns)
                ip(["link", "set", node.bridge_ifname, "master", "br0", "up"], cluster.bridge_netns)
                ip(["addr", "add", f"{node.address}/{net.prefixlen}", "dev", node.ifname], node.netns)
                ip(["link", "set", node.ifname, "up"], node.netns)
                ip(["link", "set", "lo", "up"], node.netns)
                for key, value in NODE_SYSCTLS.items():
                    run_cmd(["ip", "netns", "exec", node.netns, "sysctl", "-q", "-w", f"{key}={value}"], check=False)
                cluster.nodes.append(node)
        except BaseException:
            cluster.destroy()
            raise
        return cluster

    @property
    def num_nodes(self) -> int:
        """Number of nodes."""
        return len(self.nodes)

    def address(self, node: int) -> str:
        """The IPv4 address of `node` (inside its namespace)."""
        return self.nodes[node].address

    def exec_prefix(self, node: int) -> list[str]:
        """argv prefix that runs a command inside `node`'s namespace."""
        return ["ip", "netns", "exec", self.nodes[node].netns]

    def link_devices(self, node: int) -> list[tuple[str, str]]:
        """(namespace, interface) of both ends of `node`'s link: node egress first, then node ingress."""
        n = self.nodes[node]
        return [(n.netns, n.ifname), (self.bridge_netns, n.bridge_ifname)]

    def namespaces(self) -> list[str]:
        """Every namespace of this cluster (nodes and bridge)."""
        return [n.netns for n in self.nodes] + [self.bridge_netns]

    def destroy(self) -> None:
        """Delete all namespaces of this cluster (idempotent; qdiscs and veths go with them)."""
        names = set(self.namespaces()) | set(list_namespaces(self.prefix))
        for name in sorted(names):
            delete_namespace(name)
            if self.state is not None:
                self.state.remove("namespaces", name)

    def __enter__(self) -> NetCluster:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.destroy()


def _rate_bits(rate: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)(bit|bps)", rate.strip().lower())
    if not m:
        raise ValueError(f"bad rate {rate!r} (want e.g. 20mbit, 500kbit, 1gbit, 2mbps)")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    return value * (8 if m.group(3) == "bps" else 1)


def parse_rate(rate: str) -> float:
    """A tc-style rate string (``20mbit``, ``500kbit``, ``2mbps``) in bits per second."""
    bits = _rate_bits(rate)
    if bits <= 0:
        raise ValueError(f"rate must be positive, got {rate!r}")
    return bits


def set_rate(netns: str, ifname: str, rate: str) -> None:
    """Limit egress of `ifname` in `netns` to `rate` with a token bucket filter (replaces any root qdisc).

    The bucket holds ~10 ms of traffic (at least 16 KB) so short bursts are not dropped outright;
    the queue holds 100 ms, beyond which TCP backs off, as on a congested real link.
    """
    bits = parse_rate(rate)
    burst = max(16_000, int(bits / 8 / 100))
    run_cmd(["ip", "netns", "exec", netns, "tc", "qdisc", "replace", "dev", ifname, "root", "tbf",
             "rate", f"{int(bits)}bit", "burst", str(burst), "latency", LATENCY])


def clear_rate(netns: str, ifname: str) -> None:
    """Remove the root qdisc of `ifname` in `netns` (no error when none is set or the namespace is gone)."""
    run_cmd(["ip", "netns", "exec", netns, "tc", "qdisc", "del", "dev", ifname, "root"], check=False)


def show_qdisc(netns: str, ifname: str) -> str:
    """`tc qdisc show dev IFNAME` inside `netns` (for tests and diagnostics)."""
    return run_cmd(["ip", "netns", "exec", netns, "tc", "qdisc", "show", "dev", ifname], check=False).stdout


PATH_CLASS = "1:1"


def set_path_rate(netns: str, ifname: str, peer_address: str, rate: str) -> None:
    """Limit what `ifname` in `netns` sends to `peer_address` to `rate`; other traffic stays unshaped.

    A root ``htb`` qdisc (handle ``1:``) without a default class, so unclassified packets leave
    through htb's direct queue at full speed; one class at rate = ceil = `rate` (burst as in
    :func:`set_rate`, leaf: htb's default pfifo) and a ``u32`` filter sending packets whose
    destination is `peer_address` to it. Uses ``qdisc add``, so it fails on a device that already
    has a root qdisc of its own (a tbf link fault, another path); remove with :func:`clear_rate`.
    """
    bits = parse_rate(rate)
    burst = str(max(16_000, int(bits / 8 / 100)))
    tc = ["ip", "netns", "exec", netns, "tc"]
    run_cmd([*tc, "qdisc", "add", "dev", ifname, "root", "handle", "1:", "htb"])
    try:
        run_cmd([*tc, "class", "add", "dev", ifname, "parent", "1:", "classid", PATH_CLASS, "htb",
                 "rate", f"{int(bits)}bit", "ceil", f"{int(bits)}bit", "burst", burst, "cburst", burst])
        run_cmd([*tc, "filter", "add", "dev", ifname, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                 "match", "ip", "dst", f"{peer_address}/32", "flowid", PATH_CLASS])
    except BaseException:
        clear_rate(netns, ifname)
        raise


def root_qdisc_kind(netns: str, ifname: str) -> str | None:
    """Kind of the root qdisc of `ifname` in `netns` (``noqueue`` for an untouched veth, ``tbf`` under a
    link fault, ``htb`` under a path fault); None when the device or namespace does not exist."""
    for line in show_qdisc(netns, ifname).splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0] == "qdisc" and parts[3] == "root":
            return parts[1]
    return None


def interface_address(netns: str, ifname: str) -> str:
    """The IPv4 address of `ifname` in `netns` (raises :class:`NetError` when it has none)."""
    out = ip(["-o", "-4", "addr", "show", "dev", ifname], netns).stdout
    m = re.search(r"\binet (\d+\.\d+\.\d+\.\d+)/", out)
    if not m:
        raise NetError(f"{ifname} in {netns} has no IPv4 address")
    return m.group(1)

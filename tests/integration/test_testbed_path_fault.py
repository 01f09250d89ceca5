"""A `path` fault on a real 3-node cluster in a box: only the two nodes' traffic with each other is throttled.

Throughput is real TCP between the nodes' namespaces: a receiver counts bytes from the first to EOF, a sender
pushes for a fixed time. 5 mbit is 0.625 MB/s; an unshaped veth pair on this machine carries ~1 GB/s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from failslow.errors import InputError
from testbed.faults import PathFault, parse_spec
from testbed.netns import NetCluster, root_qdisc_kind, show_qdisc
from testbed.state import StateFile, leftovers

pytestmark = [pytest.mark.integration, pytest.mark.root, pytest.mark.testbed]

RATE_BPS = 5e6 / 8

RECEIVER = """
import socket, sys, time
srv = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("up", flush=True)
conn, _ = srv.accept()
n, t0 = 0, None
while True:
    b = conn.recv(1 << 16)
    if not b:
        break
    t0 = t0 or time.monotonic()
    n += len(b)
print(n / (time.monotonic() - t0), flush=True)
"""

SENDER = """
import socket, sys, time
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
data, end = b"x" * (1 << 16), time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    conn.sendall(data)
conn.close()
"""


def throughput(net: NetCluster, src: int, dst: int, port: int, seconds: float) -> float:
    """Bytes per second a TCP stream from node `src` to node `dst` delivers (measured at the receiver)."""
    rx = subprocess.Popen([*net.exec_prefix(dst), sys.executable, "-c", RECEIVER, str(port)],
                          stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout is not None and rx.stdout.readline().strip() == "up"
        subprocess.run([*net.exec_prefix(src), sys.executable, "-c", SENDER, net.address(dst), str(port),
                        str(seconds)], check=True, timeout=30)
        return float(rx.stdout.readline())
    finally:
        rx.kill()
        rx.wait()


def test_path_fault_throttles_only_the_path(tmp_path: Path) -> None:
    state = StateFile(path=tmp_path / "state.json")
    with NetCluster.create(3, state=state) as net:
        fault = parse_spec("path:a=0,b=1,rate=5mbit")
        assert isinstance(fault, PathFault)
        fault.bind(net)
        fault.start()
        try:
            for node in (0, 1):
                shown = show_qdisc(net.nodes[node].netns, "eth0")
                assert "htb 1: root" in shown, shown
            assert root_qdisc_kind(net.nodes[2].netns, "eth0") not in ("htb", "tbf")
            # a link fault on a node of the path is refused (and vice versa below)
            with pytest.raises(InputError, match="node 1's eth0 already carries a path fault"):
                parse_spec("link:node=1,rate=20mbit").bind(net).start()
            slow = {(0, 1): throughput(net, 0, 1, 5101, 1.5), (1, 0): throughput(net, 1, 0, 5102, 1.5)}
            fast = {(0, 2): throughput(net, 0, 2, 5103, 0.5), (2, 1): throughput(net, 2, 1, 5104, 0.5),
                    (1, 2): throughput(net, 1, 2, 5105, 0.5)}
        finally:
            fault.stop()
        print("path 0<->1 at 5mbit, bytes/s:", {**slow, **fast})
        assert all(RATE_BPS / 2 < v < RATE_BPS * 2 for v in slow.values()), slow
        assert all(v > 10 * max(slow.values()) for v in fast.values()), (slow, fast)
        # removed: the root qdiscs are gone and 0 <-> 1 is fast again
        assert all(root_qdisc_kind(net.nodes[n].netns, "eth0") not in ("htb", "tbf") for n in (0, 1))
        after = throughput(net, 0, 1, 5106, 0.5)
        print("0->1 after removal, bytes/s:", after)
        assert after > 10 * max(slow.values())
        # a path fault on a node with a link fault is refused at start, and leaves nothing behind
        link = parse_spec("link:node=0,rate=20mbit").bind(net)
        link.start()
        try:
            with pytest.raises(InputError, match="node 0's eth0 already carries a link fault"):
                parse_spec("path:a=1,b=0,rate=5mbit").bind(net).start()
            assert root_qdisc_kind(net.nodes[1].netns, "eth0") not in ("htb", "tbf")
        finally:
            link.stop()
        prefix = net.prefix
    assert leftovers(prefix)["namespaces"] == []


def test_testbed_run_slows_down_when_the_dp_path_is_congested(tmp_path: Path, failslow_cmd: list[str]) -> None:
    """DP2×PP1 on nodes 0 and 1: the gradient all-reduce crosses the path, so iterations slow down after it."""
    out = tmp_path / "out.json"
    proc = subprocess.run([*failslow_cmd, "testbed", "run", "--dp", "2", "--pp", "1",
                           "--iterations", "20", "--layers", "2", "--d-model", "64",
                           "--inject", "path:a=0,b=1,rate=10mbit,start_iter=5", "--report", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(out.read_text())
    [episode] = rep["faults"]
    assert (episode["kind"], episode["target"]) == ("path", "nodes=0,1") and episode["end_unix_s"] is not None
    times = rep["iteration_time_s"]["0"]
    ends = rep["iteration_end_unix_s"]["0"]
    before = sorted(times[1:5])[1:3]
    during = [t for t, end in zip(times, ends, strict=True) if end > episode["start_unix_s"] + 0.5 * max(times)]
    print("before:", [round(t, 3) for t in times[:5]], "during:", [round(t, 3) for t in during])
    assert len(during) >= 5 and min(sorted(during)[1:]) > 3 * max(before), (times, during)
    assert leftovers(rep["prefix"])["namespaces"] == []

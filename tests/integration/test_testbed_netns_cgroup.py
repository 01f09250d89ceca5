"""The reusable building blocks (testbed.netns, testbed.cgroup) on their own, as root, for real."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.cgroup import CpuCgroup, current_cgroup
from testbed.netns import NetCluster, clear_rate, list_namespaces, set_rate, show_qdisc
from testbed.state import StateFile, leftovers

pytestmark = [pytest.mark.integration, pytest.mark.testbed]

# These need root; the project's machines run the suite as root (a non-root run fails loudly here).


def test_netcluster_links_nodes_and_shapes_both_ends(tmp_path: Path) -> None:
    state = StateFile(path=tmp_path / "state.json")
    with NetCluster.create(3, state=state) as net:
        assert set(net.namespaces()) <= set(list_namespaces(net.prefix))
        assert sorted(state.read()["namespaces"]) == sorted(net.namespaces())
        # a TCP round trip from node 0 to node 2 across the bridge
        server = subprocess.Popen([*net.exec_prefix(2), sys.executable, "-c",
                                   "import socket; s = socket.create_server(('0.0.0.0', 5555)); print('up', flush=True);"
                                   " c, _ = s.accept(); c.sendall(b'pong'); c.close()"],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "up"
            client = subprocess.run([*net.exec_prefix(0), sys.executable, "-c",
                                     f"import socket; print(socket.create_connection(('{net.address(2)}', 5555),"
                                     " timeout=5).recv(4).decode())"], capture_output=True, text=True, timeout=30)
            assert client.stdout.strip() == "pong", client.stderr
        finally:
            server.kill()
            server.wait()
        # no address of ours leaks into the root namespace
        assert net.address(2) not in subprocess.run(["ip", "addr"], capture_output=True, text=True).stdout
        ends = net.link_devices(1)
        assert [ns for ns, _ in ends] == [net.nodes[1].netns, net.bridge_netns]
        for ns, dev in ends:
            set_rate(ns, dev, "20mbit")
        assert all("tbf" in show_qdisc(ns, dev) and "20Mbit" in show_qdisc(ns, dev) for ns, dev in ends)
        for ns, dev in ends:
            clear_rate(ns, dev)
        assert not any("tbf" in show_qdisc(ns, dev) for ns, dev in ends)
        prefix = net.prefix
    assert leftovers(prefix)["namespaces"] == []
    assert not state.path.exists()  # the state file goes when nothing is left in it


def test_cpu_cgroup_quota_and_release(tmp_path: Path) -> None:
    state = StateFile(path=tmp_path / "state.json")
    proc = subprocess.Popen(["sleep", "30"])
    try:
        origin = current_cgroup(proc.pid)
        cg = CpuCgroup.create("unit", state=state)
        cg.add(proc.pid)
        assert cg.pids() == [proc.pid] and current_cgroup(proc.pid) == cg.path
        cg.set_quota(0.5)
        assert cg.quota() == 0.5 and (cg.path / "cpu.cfs_quota_us").read_text().strip() == "50000"
        cg.clear_quota()
        assert cg.quota() is None
        child = cg.child("inner")
        child.add(proc.pid)
        cg.destroy()
        assert not cg.path.exists() and current_cgroup(proc.pid) == origin
        assert not os.path.exists(state.path)
    finally:
        proc.kill()
        proc.wait()

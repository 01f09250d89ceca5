"""The `path` fault kind (a congested path between two nodes): spec parsing and validation, no processes."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from failslow.errors import InputError
from testbed.faults import Fault, LinkFault, PathFault, PoissonFault, parse_spec
from testbed.launcher import JobConfig, Testbed


@dataclass
class _Target:
    """A FaultTarget with `num_nodes` nodes on namespaces (or loopback) that keeps its faults like the testbed."""

    num_nodes: int = 3
    world_size: int = 3
    loopback: bool = False
    faults: list[Fault] = field(default_factory=list)

    def link_devices(self, node: int) -> list[tuple[str, str]]:
        return [] if self.loopback else [(f"ns{node}", "eth0"), ("br", f"v{node}")]

    def layout_sizes(self) -> dict[str, Any]:
        return {"dp": self.world_size, "pp": 1, "tp": 1}

    def add(self, spec: str) -> Fault:
        fault = parse_spec(spec).bind(self)
        self.faults.append(fault)
        return fault


def test_parse_path_with_schedule() -> None:
    f = parse_spec("path:a=0,b=1,rate=10mbit")
    assert isinstance(f, PathFault) and (f.a, f.b, f.rate) == (0, 1, "10mbit") and not f.schedule.timed
    assert f.kind == "path" and f.target == "nodes=0,1"
    f = parse_spec("path:b=0,a=2,rate=500kbit,start_iter=5,stop_iter=9")
    assert (f.a, f.b) == (2, 0) and (f.schedule.start_iter, f.schedule.stop_iter) == (5, 9)
    f = parse_spec("path:a=1,b=3,rate=2mbps,at=10,for=5")
    assert (f.schedule.at_s, f.schedule.for_s) == (10.0, 5.0)


@pytest.mark.parametrize("spec, words", [
    ("path:a=0,rate=10mbit", "lacks b"),
    ("path:a=0,b=1", "lacks rate"),
    ("path:a=1,b=1,rate=10mbit", "a != b"),
    ("path:a=0,b=1,rate=fast", "bad rate"),
    ("path:a=0,b=1,rate=0mbit", "positive"),
    ("path:a=-1,b=1,rate=10mbit", ">= 0"),
    ("path:a=x,b=1,rate=10mbit", "bad value"),
    ("path:a=0,b=1,rate=10mbit,node=2", "unknown key"),
    ("path:a=0,b=1,rate=10mbit,start_iter=-2", ">= 0"),
])
def test_bad_path_specs_raise_input_error(spec: str, words: str) -> None:
    with pytest.raises(InputError, match=words):
        parse_spec(spec)


def test_path_validation_node_range_and_loopback() -> None:
    assert parse_spec("path:a=2,b=0,rate=10mbit").bind(_Target(num_nodes=3)).target_env is not None
    with pytest.raises(InputError, match="b=3 is out of range: the job has 3 nodes"):
        parse_spec("path:a=0,b=3,rate=10mbit").bind(_Target(num_nodes=3))
    with pytest.raises(InputError, match="a=5 is out of range"):
        parse_spec("path:a=5,b=0,rate=10mbit").bind(_Target(num_nodes=3))
    with pytest.raises(InputError, match=r"path faults are unavailable.*loopback"):
        parse_spec("path:a=0,b=1,rate=10mbit").bind(_Target(loopback=True))


def test_path_and_link_on_one_node_are_refused_when_they_may_overlap() -> None:
    t = _Target(num_nodes=4)
    t.add("link:node=1,rate=20mbit")
    with pytest.raises(InputError, match="both shape node 1's link"):
        t.add("path:a=0,b=1,rate=10mbit")
    t.add("path:a=0,b=2,rate=10mbit")  # no node in common with the link fault
    with pytest.raises(InputError, match="both shape node 2's link"):
        t.add("link:node=2,rate=20mbit,start_iter=5")
    with pytest.raises(InputError, match="both shape node 0's link"):
        t.add("path:a=3,b=0,rate=10mbit")  # two paths sharing a node

    t = _Target(num_nodes=4)
    t.add("link:node=1,rate=20mbit,start_iter=0,stop_iter=10")
    t.add("path:a=0,b=1,rate=10mbit,start_iter=10,stop_iter=20")  # disjoint iteration windows
    t.add("path:a=1,b=3,rate=10mbit,start_iter=25")
    with pytest.raises(InputError, match="both shape node 1's link"):
        t.add("link:node=1,rate=20mbit,start_iter=15,stop_iter=30")
    t.add("link:node=2,rate=5mbit,at=0,for=30")
    with pytest.raises(InputError, match="both shape node 2's link"):
        t.add("path:a=2,b=0,rate=10mbit,start_iter=40")  # seconds vs iterations: may overlap


def test_a_removed_run_time_fault_no_longer_blocks_the_node() -> None:
    t = _Target()
    link = t.add("link:node=1,rate=20mbit")
    link.episodes.append({"start_unix_s": 0.0, "end_unix_s": 1.0})  # started and stopped at run time
    assert t.add("path:a=0,b=1,rate=10mbit").kind == "path"
    link.active = True  # while it is on, it blocks
    with pytest.raises(InputError, match="both shape node 1's link"):
        t.add("path:a=2,b=1,rate=10mbit")
    # a run-time fault whose start was refused blocks nothing either (the testbed keeps it in its faults)
    t = _Target()
    t.add("path:a=0,b=1,rate=10mbit").start_failed = True
    assert t.add("link:node=1,rate=20mbit").kind == "link"


def test_poisson_kinds_still_exclude_path() -> None:
    with pytest.raises(InputError, match="cpu and/or link"):
        parse_spec("poisson:mean_gap=1,mean_dur=1,kinds=path")
    assert isinstance(parse_spec("poisson:mean_gap=1,mean_dur=1,kinds=link"), PoissonFault)
    assert isinstance(parse_spec("link:node=0,rate=1mbit"), LinkFault)


def test_testbed_validates_path_faults_before_starting() -> None:
    # loopback: refused like link faults
    with pytest.raises(InputError, match="path faults are unavailable"):
        Testbed(JobConfig(dp=2, pp=1, iterations=2, namespaces=False), ["path:a=0,b=1,rate=10mbit"])
    if os.geteuid() != 0:
        return
    # nodes 0..1 of the job and node 2, a spare: a path to the spare is valid, node 3 is not
    cfg = JobConfig(dp=2, pp=1, iterations=2, namespaces=True, spare_nodes=1)
    with Testbed(cfg, ["path:a=0,b=2,rate=10mbit"]) as tb:
        assert [f.kind for f in tb.faults] == ["path"]
    with pytest.raises(InputError, match="b=3 is out of range: the job has 3 nodes"):
        Testbed(cfg, ["path:a=0,b=3,rate=10mbit"])
    with pytest.raises(InputError, match="both shape node 1's link"):
        Testbed(cfg, ["link:node=1,rate=20mbit", "path:a=0,b=1,rate=10mbit,start_iter=5"])


def test_poisson_skips_link_episodes_on_a_path_faults_nodes() -> None:
    t = _Target(num_nodes=2)
    t.add("path:a=0,b=1,rate=10mbit")
    poisson = t.add("poisson:mean_gap=0.01,mean_dur=0.01,kinds=link")
    poisson.start()
    time.sleep(0.3)
    assert isinstance(poisson, PoissonFault) and poisson._thread is not None and poisson._thread.is_alive()
    poisson.stop()
    assert poisson.children == [] and poisson.log() == []

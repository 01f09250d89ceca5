"""Fault specs, schedules and trace naming: pure logic, no processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from failslow.errors import InputError
from testbed.config import stage_layers
from testbed.faults import (
    CpuFault,
    GcFault,
    LinkFault,
    PoissonFault,
    Schedule,
    SeqlenFault,
    StageFault,
    parse_spec,
)
from testbed.netns import parse_rate
from testbed.trace import meta_path


def test_parse_each_kind() -> None:
    f = parse_spec("link:node=1,rate=20mbit")
    assert isinstance(f, LinkFault) and (f.node, f.rate) == (1, "20mbit") and not f.schedule.timed
    f = parse_spec("cpu:rank=3,quota=0.3,at=10,for=5")
    assert isinstance(f, CpuFault) and (f.rank, f.quota) == (3, 0.3)
    assert (f.schedule.at_s, f.schedule.for_s) == (10.0, 5.0)
    f = parse_spec("gc:rank=2,every=5,pause=0.2")
    assert isinstance(f, GcFault) and (f.rank, f.every, f.pause) == (2, 5, 0.2)
    f = parse_spec("seqlen:dp=1,factor=1.5,start_iter=3,stop_iter=9")
    assert isinstance(f, SeqlenFault) and (f.dp, f.factor) == (1, 1.5)
    assert (f.schedule.start_iter, f.schedule.stop_iter) == (3, 9)
    f = parse_spec("stage:pp=1,layers=+2")
    assert isinstance(f, StageFault) and (f.pp, f.layers, f.factor) == (1, 2, None)
    f = parse_spec("stage:pp=0,factor=1.8")
    assert isinstance(f, StageFault) and f.factor == 1.8
    f = parse_spec("poisson:mean_gap=30,mean_dur=10,kinds=cpu|link")
    assert isinstance(f, PoissonFault) and f.kinds == ("cpu", "link") and (f.mean_gap, f.mean_dur) == (30, 10)


@pytest.mark.parametrize("spec, words", [
    ("disk:node=1", "unknown fault kind"),
    ("link", "no parameters"),
    ("link:node=1", "lacks rate"),
    ("link:node=1,rate=fast", "bad rate"),
    ("cpu:rank=1,quota=0", "quota"),
    ("cpu:rank=x,quota=0.3", "bad value"),
    ("cpu:rank=1,quota=0.3,colour=red", "unknown key"),
    ("cpu:rank=-1,quota=0.3", ">= 0"),
    ("gc:rank=1,every=0", "every"),
    ("seqlen:dp=0,factor=9", "factor"),
    ("stage:pp=1", "exactly one"),
    ("stage:pp=1,factor=2,layers=1", "exactly one"),
    ("poisson:mean_gap=1,mean_dur=1,kinds=disk", "kinds"),
    ("cpu:rank=1,quota=0.5,at=-3", ">= 0"),
    ("cpu:rank=1 quota=0.5", "key=value"),
])
def test_bad_specs_raise_input_error(spec: str, words: str) -> None:
    with pytest.raises(InputError, match=words):
        parse_spec(spec)


def test_schedule_windows() -> None:
    s = Schedule(at_s=10, for_s=5)
    assert [s.should_be_active(t, 0) for t in (0, 9.9, 10, 14.9, 15, 100)] == [False, False, True, True, False, False]
    s = Schedule(start_iter=3, stop_iter=6)
    assert [s.should_be_active(0, i) for i in range(8)] == [False] * 3 + [True] * 3 + [False] * 2
    s = Schedule(for_s=2)
    assert s.should_be_active(1.0, 0) and not s.should_be_active(2.5, 0)
    assert Schedule().should_be_active(123, 456) and not Schedule().timed


def test_rates() -> None:
    assert parse_rate("20mbit") == 20e6
    assert parse_rate("500kbit") == 500e3
    assert parse_rate("2mbps") == 16e6
    with pytest.raises(ValueError):
        parse_rate("0mbit")


def test_stage_layers_cover_all_blocks() -> None:
    for layers in range(1, 9):
        for pp in range(1, layers + 1):
            parts = stage_layers(layers, pp)
            assert [i for r in parts for i in r] == list(range(layers))
            assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_meta_path_like_the_whatif_data() -> None:
    assert meta_path(Path("/x/trace-ST.parquet")) == Path("/x/meta-ST.yaml")
    assert meta_path(Path("/x/trace-job.csv.gz")) == Path("/x/meta-job.yaml")
    assert meta_path(Path("/x/ops.csv")) == Path("/x/ops.meta.yaml")

"""`failslow period`: CSV and shim-dump input through the real entry point; parsers with literals."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from failslow import period_synth as ps
from failslow.errors import InputError
from failslow.period_io import parse_calls, parse_csv, parse_jsonl
from failslow.ring import OP_NAMES, RingWriter


def _run(cmd: list[str], *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, "period", *args], capture_output=True, text=True, timeout=120, env=env,
                          check=False)


def _write_csv(path: Path, tr: ps.SynthTrace, columns: tuple[str, ...]) -> None:
    cols = {"t_start_s": tr.t_start, "op": [OP_NAMES[int(o)] for o in tr.op], "bytes": tr.nbytes,
            "duration_s": tr.duration, "comm": tr.comm}
    lines = [",".join(columns)]
    for i in range(len(tr.t_start)):
        lines.append(",".join(repr(float(cols[c][i])) if c in ("t_start_s", "duration_s") else str(cols[c][i])
                              for c in columns))
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("columns", [("t_start_s", "op"), ("t_start_s", "op", "bytes", "duration_s", "comm")])
def test_period_csv(tmp_path: Path, failslow_cmd: list[str], columns: tuple[str, ...]) -> None:
    tr = ps.generate([ps.pp_1f1b(1, 4, 6, dp_allreduce=True)], [30], seed=7)
    f = tmp_path / "calls.csv"
    _write_csv(f, tr, columns)
    p = _run(failslow_cmd, str(f))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["period"] == tr.period[0]
    assert abs(out["iteration_time_s"] / np.median(tr.iteration_s) - 1) < 0.02
    assert len(out["iterations_s"]) >= 25


def test_period_shim_dump_jsonl(tmp_path: Path, failslow_cmd: list[str]) -> None:
    # Records written by the real ring writer, dumped by the real `failslow shim-dump`.
    tr = ps.generate([ps.pp_1f1b(0, 2, 4)], [30], seed=8)
    w = RingWriter.create(directory=tmp_path, job="j", rank=0, world_size=2, capacity=1024)
    try:
        for i in range(len(tr.t_start)):
            t0 = int(tr.t_start[i] * 1e9)
            w.append(int(tr.op[i]), int(tr.comm[i]), 2, 0, 1, 256, int(tr.nbytes[i]), 7, t0, t0,
                     t0 + int(tr.duration[i] * 1e9), 1)
        dump = subprocess.run([*failslow_cmd, "shim-dump", "--dir", str(tmp_path)], capture_output=True,
                              text=True, timeout=60, check=True).stdout
    finally:
        w.close(unlink=True)
    f = tmp_path / "dump.jsonl"
    f.write_text(dump)
    p = _run(failslow_cmd, str(f))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["period"] == 8
    assert abs(out["iteration_time_s"] / np.median(tr.iteration_s) - 1) < 0.02


@pytest.mark.parametrize("content, message", [
    ("", "empty"),
    ("t_start_s,op\n1.0,AllReduce\nabc,AllReduce\n", "line 3"),
    ("time,op\n1,AllReduce\n", "t_start_s"),
    ('{"pid": 1, "op": "Send"}\n', "missing key"),
    ("{not json\n", "not JSON"),
    ("t_start_s,op\n" + "".join(f"{i * 0.37 % 1:.3f},Send\n" for i in range(3)), "no periodic"),
])
def test_period_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
                                  message: str) -> None:
    # In-process through the real dispatcher (the subprocess path is covered below).
    from failslow_cli.main import main

    f = tmp_path / "bad.txt"
    f.write_text(content)
    assert main(["period", str(f)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("failslow period: ") and message in err
    assert out == ""


def test_period_missing_file_exits_2(tmp_path: Path, failslow_cmd: list[str]) -> None:
    p = _run(failslow_cmd, str(tmp_path / "nope.csv"))
    assert p.returncode == 2 and "cannot read" in p.stderr


def test_parsers_with_literals() -> None:
    c = parse_csv("t_start_s,op,comm\n0.5,Send,a\n0.2,Recv,b\n0.9,Send,a\n")
    assert c.t_start.tolist() == [0.2, 0.5, 0.9]  # sorted by time
    assert c.op.tolist() == [0, 1, 1] and c.comm.tolist() == [1, 0, 0]
    assert np.isnan(c.duration).all()
    c = parse_csv("1.0,AllReduce,1024\n2.0,AllReduce,1024\n")  # positional, no header
    assert c.nbytes.tolist() == [0, 0]
    two = ('{"pid": 5, "rank": 0, "op": "Send", "t_enqueue_ns": 2000000000, "seq": 2}\n'
           '{"pid": 5, "rank": 0, "op": "CommInit", "t_enqueue_ns": 1, "seq": 1}\n'
           '{"pid": 6, "rank": 1, "op": "Recv", "t_enqueue_ns": 1000000000, "t_start_ns": 5, "t_end_ns": 9}\n')
    with pytest.raises(InputError, match="2 processes"):
        parse_jsonl(two)
    c = parse_calls(two, rank=1)
    assert c.t_start.tolist() == [1.0] and c.duration[0] == pytest.approx(4e-9)
    assert parse_calls(two, pid=5).t_start.tolist() == [2.0]  # the control event is skipped
    with pytest.raises(InputError):
        parse_calls("t_start_s,op\n1,Send\n", pid=3)
    with pytest.raises(InputError, match="unknown column"):
        parse_csv("t_start_s,op,foo\n1,Send,2\n")

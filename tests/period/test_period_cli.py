"""`failslow period`: CSV and shim-dump input through the real entry point.

The parsers with literals: tests/period/test_io.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from period_scenarios import ring_of

from failslow.period import synth as ps
from failslow.record import OP_NAMES, Op, RingWriter


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


def test_period_of_a_recorded_shim_dump_holds_the_collective_rule(tmp_path: Path, failslow_cmd: list[str]) -> None:
    """The batch form knows which calls are collectives from their names: a recorded DP2xPP2 stage under a
    CPU quota (its iterations long and short by turns), dumped by `failslow shim-dump`, is read at its own
    period. Without the rule the same calls gave 554 of 628 iterations (27 calls, then 7, then 5)."""
    _, recs = ring_of("dp2pp2_stage1_quota", tmp_path, rank=2, layout={"tp": 1, "pp": 2, "dp": 2, "cp": 1})
    dump = subprocess.run([*failslow_cmd, "shim-dump", "--dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=60, check=True).stdout
    f = tmp_path / "dump.jsonl"
    f.write_text(dump)
    p = _run(failslow_cmd, str(f))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    allreduces = int((recs["op"] == int(Op.ALLREDUCE)).sum())
    assert out["periods"] == [9, 7, 5], out["periods"]
    assert allreduces - 6 <= len(out["iterations_s"]) <= allreduces

"""`failslow whatif` end to end through the dispatcher, on the real trace and on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from failslow.whatif.synth import SynthConfig, generate
from failslow.whatif.trace import write_trace

KEYS = {"S", "S_t", "W", "S_w", "M_W", "M_S", "simulation_error", "root_cause"}


def _run(cmd: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120, check=False)


def _main(capsys, *args: str) -> tuple[int, str, str]:
    # in-process through the real dispatcher: same exit codes and messages, no interpreter start-up
    from failslow_cli.main import main

    try:
        rc = main(["whatif", *args])
    except SystemExit as exc:  # argparse
        rc = int(exc.code or 0)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_real_trace_with_all_outputs(capsys, st_dir: Path, tmp_path: Path) -> None:
    out, png, prom = tmp_path / "r.json", tmp_path / "h.png", tmp_path / "w.prom"
    rc, stdout, err = _main(capsys, str(st_dir / "trace-ST.csv.gz"), "--out", str(out), "--heatmap", str(png),
                            "--textfile", str(prom), "--job", "st-job")
    assert rc == 0, err
    doc = json.loads(stdout)
    assert doc.keys() >= KEYS
    assert json.loads(out.read_text()) == doc
    assert abs(doc["S"] / 1.179 - 1) <= 0.02  # metadata found beside the trace (meta-ST.yaml)
    assert doc["layout"] == {"dp": 2, "pp": 4, "vpp": 1}
    assert doc["root_cause"]["verdict"] == "stage_partitioning_imbalance"
    assert len(doc["S_w"]) == 8
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2000
    lines = [ln for ln in prom.read_text().splitlines() if ln and not ln.startswith("#")]
    assert len(lines) == 8
    series = {}
    for ln in lines:
        name_labels, value = ln.rsplit(" ", 1)
        assert name_labels.startswith('failslow_whatif_worker_slowdown_ratio{job="st-job",dp_rank="')
        series[name_labels] = float(value)
    hot = 'failslow_whatif_worker_slowdown_ratio{job="st-job",dp_rank="0",pp_rank="3"}'
    assert series[hot] == max(series.values()) or series[hot] > 1.2
    assert "# TYPE failslow_whatif_worker_slowdown_ratio gauge" in prom.read_text()


def test_hot_path_imports_neither_pandas_nor_matplotlib(failslow_cmd: list[str], st_dir: Path) -> None:
    # the installed entry point works ...
    p = _run(failslow_cmd, "--help")
    assert p.returncode == 0 and "whatif" in p.stdout
    # ... and the dispatcher, in a fresh interpreter, pulls in neither pandas nor matplotlib
    code = (
        "import sys, io, contextlib\n"
        "from failslow_cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main(['whatif', {str(st_dir / 'trace-ST.parquet')!r}])\n"
        "print(rc, 'pandas' in sys.modules, 'matplotlib' in sys.modules)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert p.stdout.split() == ["0", "False", "False"], p.stderr


def test_bad_inputs_exit_2_with_a_message(capsys, st_dir: Path, tmp_path: Path) -> None:
    rc, _, err = _main(capsys, str(tmp_path / "missing.parquet"))
    assert rc == 2 and "failslow whatif:" in err and "does not exist" in err

    broken = tmp_path / "broken.csv"
    broken.write_text("dp_rank,stage\n0,0\n")
    rc, _, err = _main(capsys, str(broken))
    assert rc == 2 and "lacks column" in err

    # a trace missing one operation in one step: inconsistent
    st = generate(SynthConfig(dp=2, pp=2, micro_batches=2, steps=2, seed=4))
    cols = dict(st.columns)
    keep = np.ones(len(cols["start_ts"]), bool)
    keep[7] = False
    codes, names = cols["optype"]
    cols = {k: (v[keep] if k != "optype" else (codes[keep], names)) for k, v in cols.items()}
    holey = tmp_path / "holey.parquet"
    write_trace(holey, cols)
    rc, _, err = _main(capsys, str(holey))
    assert rc == 2 and "inconsistent trace" in err

    # metadata that contradicts the trace
    (tmp_path / "m").mkdir()
    meta = tmp_path / "m" / "meta.yaml"
    meta.write_text("dp_size: 1\npp_size: 4\n")
    rc, _, err = _main(capsys, str(st_dir / "trace-ST.parquet"), "--meta", str(meta))
    assert rc == 2 and "dp_rank out of range" in err

    # a trace the model cannot explain (large untraced gaps) is refused, unless allowed
    gappy = tmp_path / "gappy.parquet"
    write_trace(gappy, generate(SynthConfig(dp=2, pp=2, micro_batches=4, steps=2, launch_delay=0.004)).columns)
    rc, _, err = _main(capsys, str(gappy))
    assert rc == 2 and "simulation error" in err
    rc, out, _ = _main(capsys, str(gappy), "--max-sim-error", "0.9")
    assert rc == 0 and json.loads(out)["simulation_error"] > 0.05
    # keeping the gaps as (idealised) work explains the trace
    rc, out, _ = _main(capsys, str(gappy), "--launch-delays", "ideal")
    assert rc == 0 and json.loads(out)["simulation_error"] < 0.01

    rc, _, _ = _main(capsys, str(st_dir / "trace-ST.parquet"), "--ideal", "mode")
    assert rc == 2  # argparse
    rc, _, err = _main(capsys, str(st_dir / "trace-ST.parquet"), "--skip-steps", "40")
    assert rc == 2 and "no steps left" in err


def test_shared_cpu_option(capsys, tmp_path: Path) -> None:
    st = generate(SynthConfig(dp=2, pp=2, micro_batches=4, steps=3, slow_workers=((1, 1, 1.5),), seed=4))
    path = tmp_path / "trace-cpu.parquet"
    write_trace(path, st.columns)
    rc, stdout, err = _main(capsys, str(path), "--continuous", "--ideal", "median", "--host-cpus", "2")
    assert rc == 0, err
    doc = json.loads(stdout)["shared_cpu"]
    assert doc["host_cpus"] == 2 and doc["simulation_error"] < 1e-6 and doc["S_fix_top"] > 1
    rc, _, err = _main(capsys, str(path), "--host-cpus", "2")
    assert rc == 2 and "continuous" in err

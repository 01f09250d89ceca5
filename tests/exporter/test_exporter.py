"""Node exporter: golden exposition, promtool, live processes over real HTTP, NVML absent, fakes, textfiles."""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
from exporter_ringdata import golden_rings
from scrape import families, value

from exporter.collector import CollectorSet
from exporter.collectors.nvml import NvmlCollector
from exporter.collectors.ring import RingCollector
from exporter.collectors.textfile import TextfileCollector
from exporter.gpu import FakeGpuBackend, NvmlBackend
from exporter.server import Exporter, build_collectors
from exporter.settings import Settings
from failslow.catalogue import by_name

GOLDEN = Path(__file__).parent / "golden" / "metrics.prom"
WHATIF = textwrap.dedent("""\
    # HELP failslow_whatif_worker_slowdown_ratio What-if slowdown attributable to one worker.
    # TYPE failslow_whatif_worker_slowdown_ratio gauge
    failslow_whatif_worker_slowdown_ratio{job="gpt-a",dp_rank="0",pp_rank="1"} 1.18
    failslow_whatif_worker_slowdown_ratio{job="gpt-a",dp_rank="1",pp_rank="1"} 1.01
    """)


def _golden_exporter(tmp_path: Path) -> tuple[Exporter, FakeGpuBackend]:
    rings = tmp_path / "rings"
    rings.mkdir()
    golden_rings(rings)
    text = tmp_path / "text"
    text.mkdir()
    (text / "whatif.prom").write_text(WHATIF)
    gpus = FakeGpuBackend(2)
    gpus.set(1, sm_clock_hz=1.2e9, clock_event_reasons=0x40, temperature_c=91.0)
    gpus.inject_xid(1, 79)
    collectors = [
        ("ring", RingCollector(rings, node="n0", window=20, alive=lambda pid: True)),
        ("nvml", NvmlCollector(gpus, "n0")),
        ("textfile", TextfileCollector(text)),
    ]
    s = Settings(port=0, address="127.0.0.1", ring_dir=rings, node="n0", textfile_dir=text)
    return Exporter(s, collectors), gpus


def _normalise(text: str) -> str:
    # Durations of collectors differ on every run; everything else is deterministic.
    return re.sub(r"^(failslow_exporter_collector_duration_seconds\{[^}]*\}) .*$", r"\1 0.0", text, flags=re.M)


def test_golden_exposition_and_promtool(tmp_path: Path) -> None:
    exp, _ = _golden_exporter(tmp_path)
    text = _normalise(exp.render().decode())
    if os.environ.get("FAILSLOW_REGEN_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "exposition changed; FAILSLOW_REGEN_GOLDEN=1 regenerates the golden file"
    p = subprocess.run(["promtool", "check", "metrics"], input=GOLDEN.read_text(), capture_output=True,
                       text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip() == "" and p.stderr.strip() == "", p.stdout + p.stderr  # no lint warnings


def test_golden_content_is_right(tmp_path: Path) -> None:
    exp, _ = _golden_exporter(tmp_path)
    fams = families(exp.render().decode())
    cat = by_name()
    for name in fams:
        # the parser names counter families without their _total suffix
        assert name in cat or f"{name}_total" in cat, f"{name} is not in failslow/catalogue.py"
    it = fams["failslow_iteration_duration_seconds"]
    # stage 0 and stage 1 of pipeline dp=0, and the DP-only job whose layout is inferred (dp=2)
    for rank, dp, pp, node in (("0", "0", "0", "0"), ("2", "0", "1", "1")):
        v = value(it, job="gpt-a", rank=rank, dp_rank=dp, pp_rank=pp, tp_rank="0", node=node)
        assert 0.1 < v < 0.2  # 4 micro-batches of ~30 ms plus the optimizer
    v = value(it, job="bert-b", rank="1", dp_rank="1", pp_rank="0", tp_rank="0", node="n0")
    assert abs(v - 0.14) < 0.01
    period = fams["failslow_iteration_period_calls"]
    assert value(period, job="gpt-a", rank="0") == 9  # 4 sends + 4 recvs + the DP all-reduce
    assert value(period, job="bert-b", rank="1") == 4  # 3 buckets + the loss all-reduce
    assert value(fams["failslow_iterations"], job="bert-b", rank="1") >= 27
    info = fams["failslow_comm_info"]
    assert value(info, job="gpt-a", rank="0", comm="0000000000000101") == 1
    assert {s.labels["group"] for s in info if s.labels["job"] == "gpt-a"} == {"dp", "world"}
    gpu = fams["failslow_gpu_clock_event_active"]
    assert value(gpu, gpu="1", reason="hw_thermal_slowdown") == 1
    assert value(gpu, gpu="0", reason="hw_thermal_slowdown") == 0
    assert value(fams["failslow_gpu_xid_errors"], gpu="1") == 1
    assert value(fams["failslow_gpu_last_xid"], gpu="1") == 79
    assert value(fams["failslow_whatif_worker_slowdown_ratio"], dp_rank="0", pp_rank="1") == 1.18
    ok = fams["failslow_exporter_collector_success"]
    assert [value(ok, collector=c) for c in ("ring", "nvml", "textfile")] == [1, 1, 1]


def test_nvml_without_gpu_reports_failure_and_nothing_breaks(tmp_path: Path) -> None:
    # The real NVML backend on this GPU-less machine: success 0, no GPU series, rings still served.
    rings = tmp_path / "rings"
    rings.mkdir()
    golden_rings(rings)
    cs = CollectorSet([("ring", RingCollector(rings, node="n0", alive=lambda pid: True)),
                       ("nvml", NvmlCollector(NvmlBackend(), "n0"))])
    for _ in range(2):  # and again: a failed init is retried, not cached as a crash
        fams = {f.name: f for f in cs.collect()}
        ok = {s.labels["collector"]: s.value for s in fams["failslow_exporter_collector_success"].samples}
        assert ok == {"ring": 1.0, "nvml": 0.0}
        assert not any(n.startswith("failslow_gpu_") for n in fams)
        assert fams["failslow_iteration_duration_seconds"].samples


def test_textfile_bad_file_is_skipped_and_reported(tmp_path: Path) -> None:
    (tmp_path / "good.prom").write_text(WHATIF)
    (tmp_path / "bad.prom").write_text("this is { not prometheus\n")
    (tmp_path / "ignored.txt").write_text("nope")
    cs = CollectorSet([("textfile", TextfileCollector(tmp_path))])
    fams = {f.name: f for f in cs.collect()}
    assert len(fams["failslow_whatif_worker_slowdown_ratio"].samples) == 2
    assert fams["failslow_exporter_collector_success"].samples[0].value == 0.0
    (tmp_path / "bad.prom").unlink()
    fams = {f.name: f for f in cs.collect()}
    assert fams["failslow_exporter_collector_success"].samples[0].value == 1.0
    missing = CollectorSet([("textfile", TextfileCollector(tmp_path / "absent"))])
    fams = {f.name: f for f in missing.collect()}
    assert fams["failslow_exporter_collector_success"].samples[0].value == 0.0


@pytest.mark.parametrize("args, message", [
    (["--port", "-5"], "port"),
    (["--window", "0"], "window"),
    (["--collectors", "ring,bogus"], "unknown collector"),
    (["--window", "x"], "invalid int"),
])
def test_cli_bad_settings_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    from failslow_cli.main import main

    try:
        rc = main(["exporter", "--once", *args])
    except SystemExit as exc:  # argparse errors exit 2 by themselves
        rc = int(exc.code or 0)
    assert rc == 2
    assert message in capsys.readouterr().err


def test_cli_once_prints_a_scrape(tmp_path: Path, failslow_cmd: list[str]) -> None:
    golden_rings(tmp_path)
    p = subprocess.run([*failslow_cmd, "exporter", "--once", "--ring-dir", str(tmp_path), "--fake-gpus", "1",
                        "--node", "x"], capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    fams = families(p.stdout)
    # the golden rings' producers (fictitious pids) are not running: their series are not served
    assert "failslow_iteration_duration_seconds" not in fams or not fams["failslow_iteration_duration_seconds"]
    assert value(fams["failslow_gpu_sm_clock_hertz"], gpu="0") == 1.98e9


def test_settings_are_built_once_and_passed_down(tmp_path: Path) -> None:
    s = Settings(ring_dir=tmp_path, fake_gpus=1, collectors="ring,nvml", window=7, buffer_calls=512)
    built = dict(build_collectors(s))
    assert list(built) == ["ring", "nvml"]
    ring = built["ring"]
    assert isinstance(ring, RingCollector) and ring.window == 7 and ring.buffer == 512
    assert json.loads(Settings(ring_dir=tmp_path).model_dump_json())["port"] == 9400
    assert np.isclose(Settings(scan_interval_s=0.5).scan_interval_s, 0.5)


def test_two_rings_of_one_rank_and_unknown_ranks_keep_series_unique(tmp_path: Path) -> None:
    from exporter_ringdata import write_trace

    from failslow.period import synth as ps

    tr = ps.generate([ps.dp_buckets(2)], [20], seed=3)
    # the same rank seen by two producers (e.g. shim + torch hook), and two processes of unknown rank
    write_trace(tmp_path, tr, pid=5001, rank=0, world=2, job="dup", layout={"dp": 2, "pp": 1, "tp": 1},
                comm_rank={1: 0})
    write_trace(tmp_path, tr, pid=5002, rank=0, world=2, job="dup", layout={"dp": 2, "pp": 1, "tp": 1},
                comm_base=0x200, comm_rank={1: 0})
    for pid in (5003, 5004):
        write_trace(tmp_path, tr, pid=pid, rank=-1, world=0, job="anon", layout=None)
    text = b"".join(generate_latest_of(RingCollector(tmp_path, node="n", alive=lambda pid: True))).decode()
    p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60,
                       check=False)
    assert p.returncode == 0, p.stdout + p.stderr  # no duplicate series
    fams = families(text)
    assert {s.labels["rank"] for s in fams["failslow_iterations"]} == {"0", "pid-5003", "pid-5004"}
    calls = fams["failslow_comm_calls"]
    assert {s.labels["comm"] for s in calls if s.labels["job"] == "dup"} == {"0000000000000101",
                                                                              "0000000000000201"}


def generate_latest_of(collector: RingCollector) -> list[bytes]:
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)  # type: ignore[arg-type]
    return [generate_latest(reg)]


def test_ring_overflow_is_counted_and_iterations_resume(tmp_path: Path) -> None:
    """A producer that laps the exporter: lost records are counted and the tracker restarts at the hole."""
    from failslow.period import synth as ps
    from failslow.record import Flag, RingWriter

    tr = ps.generate([ps.dp_buckets(3)], [400], seed=5)  # 1600 calls
    w = RingWriter.create(directory=tmp_path, job="ovf", rank=0, world_size=2, layout={"dp": 2, "pp": 1, "tp": 1},
                          capacity=256, pid=6001)
    col = RingCollector(tmp_path, node="n", alive=lambda pid: True)

    def write(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            t0 = 10**9 + int((tr.t_start[i] - tr.t_start[0]) * 1e9)
            w.append(int(tr.op[i]), 1, 2, 0, -1, 1, int(tr.nbytes[i]), 7, t0, t0, t0 + 100_000,
                     int(Flag.HOST_TIMES))

    try:
        write(0, 200)
        col.poll()
        write(200, 900)  # laps the 256-record ring: 444 records are overwritten unread
        col.poll()
        write(900, 1100)
        col.poll()
        fams = {f.name: f for f in col.collect()}
        dropped = fams["failslow_ring_dropped_records"].samples
        assert [s.value for s in dropped] == [444.0]
        tracks = list(col.tracks.values())
        assert tracks[0].period == 4
        mean = tracks[0].mean_iteration_s
        assert mean is not None and abs(mean / float(np.mean(tr.iteration_s)) - 1) < 0.03
    finally:
        w.close()
        col.close()

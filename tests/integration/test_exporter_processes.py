"""The exporter as a process: live producer processes over HTTP, and `python -m exporter` from the environment."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

from exporter.server import Exporter
from exporter.settings import Settings
from failslow_cli.stack.processes import free_port
from tests.exporter.scrape import families, value

_PRODUCER = textwrap.dedent("""\
    import sys, time
    from failslow.record import RingWriter, Op, Flag
    d, rank = sys.argv[1], int(sys.argv[2])
    w = RingWriter.create(directory=d, job="live", rank=rank, world_size=2, layout={"dp": 2, "pp": 1, "tp": 1})
    print("ready", flush=True)
    i = 0
    while True:
        # one iteration: 30 ms compute then two bucket all-reduces of different sizes
        time.sleep(0.03)
        for b in (1 << 20, 1 << 19):
            t0 = time.monotonic_ns()
            t1 = t0 + 200_000
            w.append(Op.ALLREDUCE, 7, 2, rank, -1, b // 4, b, 7, t0, t0, t1, int(Flag.HOST_TIMES))
        i += 1
    """)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def test_live_processes_over_http(tmp_path: Path) -> None:
    """Real producer processes come and go; the exporter follows them and drops the dead one's series."""
    rings = tmp_path / "rings"
    rings.mkdir()
    s = Settings(port=0, address="127.0.0.1", ring_dir=rings, node="n0", scan_interval_s=0.2,
                 collectors=("ring",))
    exp = Exporter(s)
    port = exp.start()
    procs = []
    try:
        for rank in (0, 1):
            p = subprocess.Popen([sys.executable, "-c", _PRODUCER, str(rings), str(rank)], stdout=subprocess.PIPE,
                                 text=True)
            procs.append(p)
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60
        fams: dict[str, list] = {}
        while time.monotonic() < deadline:
            fams = families(_get(f"http://127.0.0.1:{port}/metrics"))
            ranks = {smp.labels["rank"] for smp in fams.get("failslow_iteration_duration_seconds", [])}
            if ranks == {"0", "1"}:
                break
            time.sleep(0.3)
        it = fams["failslow_iteration_duration_seconds"]
        for rank in ("0", "1"):
            v = value(it, job="live", rank=rank, dp_rank=rank, pp_rank="0", tp_rank="0")
            assert 0.025 < v < 0.5  # ~30 ms sleeps; a loaded machine only makes them longer
            assert value(fams["failslow_iteration_period_calls"], job="live", rank=rank) == 2
        last = value(fams["failslow_last_iteration_timestamp_seconds"], job="live", rank="0")
        assert abs(last - time.time()) < 30
        procs[1].kill()
        procs[1].wait(timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            fams = families(_get(f"http://127.0.0.1:{port}/metrics"))
            ranks = {smp.labels["rank"] for smp in fams.get("failslow_iterations", [])}
            if ranks == {"0"}:
                break
            time.sleep(0.3)
        assert ranks == {"0"}
        assert value(fams["failslow_exporter_rings"], producer="python") == 1
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)
        exp.stop()


def test_python_m_exporter_reads_env_settings(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "FAILSLOW_EXPORTER_PORT": str(port), "FAILSLOW_EXPORTER_ADDRESS": "127.0.0.1",
           "FAILSLOW_EXPORTER_RING_DIR": str(tmp_path), "FAILSLOW_EXPORTER_FAKE_GPUS": "3",
           "FAILSLOW_EXPORTER_NODE": "envnode"}
    p = subprocess.Popen([sys.executable, "-m", "exporter"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        assert p.stdout is not None
        seen = []
        for line in p.stdout:  # log lines first, then the serving line
            seen.append(line)
            if "/metrics" in line:
                break
        assert f":{port}/metrics" in seen[-1], seen
        fams = families(_get(f"http://127.0.0.1:{port}/metrics"))
        assert {s.labels["gpu"] for s in fams["failslow_gpu_sm_clock_hertz"]} == {"0", "1", "2"}
        assert {s.labels["node"] for s in fams["failslow_gpu_sm_clock_hertz"]} == {"envnode"}
    finally:
        p.terminate()
        assert p.wait(timeout=20) == 0  # SIGTERM is a clean shutdown

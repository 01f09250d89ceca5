"""Check the shim, the exporter and the GPU paths against a real GPU, real NCCL and real NVML.

Run on a machine with an NVIDIA GPU and PyTorch built for CUDA (one GPU is enough):

    python3 scripts/gpu_check.py --out /tmp/gpu_check

It builds the shim, runs a small data-parallel-style training job under it (NCCL, world size 1: NCCL refuses
two ranks on one GPU) with a healthy phase and a slow phase (twice the compute per iteration, or with
``--fault contention`` another process's matrix products on the same GPU), and meanwhile:

* serves the exporter on the job's ring and NVML, and keeps one scrape from each phase;
* turns the shim's PROFILE bit on for a stretch of the healthy phase (CUDA-event GPU times);
* records a few steps with `torch.profiler` (CPU and CUDA activity, ``ProfilerStep#N`` annotations);
* times the validation GEMM on the GPU (`testbed.validation.Gemm`).

Everything it saw goes to ``--out``: ``results.json`` (a summary), ``log.txt``, ``iterations.csv`` (the
job's own synchronised step times), ``shim_dump.jsonl.gz`` (every record of the ring), the two scrapes and
the profiler trace. Nothing here asserts: the summary says what happened, a person reads it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import traceback
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHIM = ROOT / "shim" / "build" / "libfailslow_shim.so"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------------------------------------
# the training job (a child process, under LD_PRELOAD)


def job(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available() and args.backend == "nccl"
    dev = torch.device("cuda:0" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group(args.backend, rank=0, world_size=1,
                            **({"device_id": dev} if cuda else {}))
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)
    layers = [torch.nn.Linear(args.width, args.width, bias=False).to(dev, dtype) for _ in range(args.layers)]
    params = [p for m in layers for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=1e-4)
    x = torch.randn(args.batch, args.width, device=dev, dtype=dtype)
    progress = Path(args.progress)
    out = Path(args.out)
    times: list[tuple[int, float, float]] = []

    def step(it: int) -> None:
        # the "throttled GPU" phase: the compute of every step twice (two accumulated micro-batches), the
        # communication unchanged
        for _ in range(2 if it >= args.healthy_iters and args.fault == "compute" else 1):
            h = x
            for m in layers:
                h = torch.relu(m(h))
            loss = h.float().pow(2).mean()
            loss.backward()
        # DDP-style: one all-reduce per gradient bucket (a layer's gradient each), then the loss for logging
        for p in params:
            assert p.grad is not None
            dist.all_reduce(p.grad)
        lt = loss.detach().reshape(1)
        dist.all_reduce(lt)
        opt.step()
        opt.zero_grad(set_to_none=False)
        float(lt.item())  # synchronises with the GPU, as a training loop's logging does
        time.sleep(args.host_gap_s)  # the data loader's share of the step

    total = args.healthy_iters + args.slow_iters
    prof_at = args.profile_at
    for it in range(total):
        if it == prof_at:
            from torch.profiler import ProfilerActivity, profile, schedule

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            n = args.profile_steps
            path = str(out / "trace_raw.json")
            with profile(activities=acts, schedule=schedule(wait=0, warmup=1, active=n, repeat=1),
                         on_trace_ready=lambda p, path=path: p.export_chrome_trace(path)) as prof:
                for k in range(n + 1):
                    t0 = time.monotonic()
                    step(it + k)
                    times.append((it + k, t0, time.monotonic() - t0))
                    prof.step()
            continue
        if prof_at < it <= prof_at + args.profile_steps:
            continue
        t0 = time.monotonic()
        step(it)
        times.append((it, t0, time.monotonic() - t0))
        if it % 10 == 0:
            progress.write_text(str(it))
    progress.write_text(str(total))
    with open(out / "iterations.csv", "w") as f:
        f.write("iteration,t_monotonic_s,duration_s\n")
        for it, t0, d in sorted(times):
            f.write(f"{it},{t0:.6f},{d:.6f}\n")
    dist.destroy_process_group()


# --------------------------------------------------------------------------------------------------------
# the controller


class Check:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.res: dict[str, Any] = {}
        self.hog: subprocess.Popen[bytes] | None = None

    def log(self, *a: Any) -> None:
        line = " ".join(str(x) for x in a)
        print(line, flush=True)
        with open(self.out / "log.txt", "a") as f:
            f.write(line + "\n")

    def sh(self, cmd: list[str] | str, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
        self.log("$", cmd if isinstance(cmd, str) else " ".join(cmd))
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, shell=isinstance(cmd, str), **kw)
        self.log(p.stdout[-4000:], p.stderr[-4000:], f"rc={p.returncode}")
        return p

    def step(self, name: str, fn: Any) -> Any:
        t0 = time.monotonic()
        try:
            v = fn()
            self.res[name] = v
        except Exception as e:  # a step that fails is reported, the others still run
            self.res[name] = {"error": f"{type(e).__name__}: {e}"}
            self.log(traceback.format_exc())
            v = None
        self.log(f"[{name}] {time.monotonic() - t0:.1f} s: {json.dumps(self.res[name], default=str)[:2000]}")
        self.save()
        return v

    def save(self) -> None:
        (self.out / "results.json").write_text(json.dumps(self.res, indent=1, default=str))


def env_info(c: Check) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__,
                            "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        info["cuda"] = torch.version.cuda
    try:
        import nvidia.nccl  # type: ignore[import-not-found]

        libs = sorted(Path(next(iter(nvidia.nccl.__path__))).rglob("libnccl.so*"))
        info["libnccl"] = [str(p) for p in libs]
    except ImportError:
        info["libnccl"] = []
    if shutil.which("nvidia-smi"):
        p = c.sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv"])
        info["nvidia_smi"] = p.stdout.strip()
    return info


def build_shim(c: Check) -> dict[str, Any]:
    b = c.sh(["make", "-C", str(ROOT / "shim")], timeout=120)
    t = c.sh(["make", "-C", str(ROOT / "shim"), "test"], timeout=300)
    return {"build_rc": b.returncode, "test_rc": t.returncode, "test_tail": t.stdout[-600:]}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def pick(text: str, prefixes: tuple[str, ...]) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(prefixes)]


def run_job(c: Check, args: argparse.Namespace) -> dict[str, Any]:
    from failslow.record.layout import Control, Flag
    from failslow.record.reader import RingReader

    ring_dir = c.out / "rings"
    shutil.rmtree(ring_dir, ignore_errors=True)
    ring_dir.mkdir()
    progress = c.out / "progress"
    progress.write_text("-1")
    env = dict(os.environ, FAILSLOW_SHM_DIR=str(ring_dir), FAILSLOW_KEEP_RINGS="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()), PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}")
    if args.backend == "nccl":
        env["LD_PRELOAD"] = str(SHIM)
        libs = c.res.get("env", {}).get("libnccl") or []
        if libs:
            env["FAILSLOW_NCCL_LIB"] = libs[0]
    port = _free_port()
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    exp_log, job_log = os.open(c.out / "exporter.log", flags, 0o644), os.open(c.out / "job.log", flags, 0o644)
    exp = subprocess.Popen([sys.executable, "-m", "failslow_cli", "exporter", "--port", str(port), "--address",
                            "127.0.0.1", "--ring-dir", str(ring_dir), "--node", "gpu-check", "--scan-interval",
                            "0.5"], env=dict(env, LD_PRELOAD=""), stdout=exp_log,
                           stderr=subprocess.STDOUT)
    cmd = [sys.executable, __file__, "--job", "--out", str(c.out), "--progress", str(progress),
           "--backend", args.backend, "--layers", str(args.layers), "--width", str(args.width),
           "--batch", str(args.batch), "--healthy-iters", str(args.healthy_iters), "--slow-iters",
           str(args.slow_iters), "--profile-at", str(args.profile_at), "--profile-steps", str(args.profile_steps),
           "--host-gap-s", str(args.host_gap_s), "--fault", args.fault]
    c.log("$", " ".join(cmd))
    t_start = time.monotonic()
    jp = subprocess.Popen(cmd, env=env, stdout=job_log, stderr=subprocess.STDOUT)
    out: dict[str, Any] = {}

    def it_now() -> int:
        try:
            return int(progress.read_text() or -1)
        except ValueError:
            return -1

    def wait_for(it: int, limit_s: float) -> bool:
        end = time.monotonic() + limit_s
        while time.monotonic() < end and jp.poll() is None:
            if it_now() >= it:
                return True
            time.sleep(0.05)
        return it_now() >= it

    reader = None
    h, s = args.healthy_iters, args.slow_iters
    try:
        if wait_for(max(0, args.profile_on[0] - 20), 240):
            rings = sorted(ring_dir.glob("*.ring"))
            out["rings"] = [r.name for r in rings]
            if rings:
                reader = RingReader(rings[0])
                out["header"] = {"producer": int(reader.header.producer), "features": int(reader.header.features),
                                 "clock_source": int(reader.header.clock_source)}
        if reader is not None and wait_for(args.profile_on[0], 240):
            reader.set_control(int(Control.PROFILE))
            out["profile_on_at"] = it_now()
            wait_for(args.profile_on[1], 240)
            reader.set_control(0)
            out["profile_off_at"] = it_now()
        if wait_for(h - args.scrape_before, 240):
            m = scrape(port)
            (c.out / "metrics_healthy.prom").write_text(m)
            out["healthy_scrape_at"] = it_now()
        if args.fault == "contention" and wait_for(h, 240):
            c.hog = subprocess.Popen([sys.executable, "-c", HOG], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            out["contention_from"] = it_now()
        if wait_for(h + s - args.scrape_before, 480):
            m = scrape(port)
            (c.out / "metrics_slow.prom").write_text(m)
            out["slow_scrape_at"] = it_now()
        jp.wait(timeout=300)
    finally:
        if jp.poll() is None:
            jp.kill()
        exp.terminate()
        try:
            exp.wait(timeout=10)
        except subprocess.TimeoutExpired:
            exp.kill()
        os.close(exp_log)
        os.close(job_log)
    out["job_rc"] = jp.returncode
    out["job_wall_s"] = round(time.monotonic() - t_start, 1)
    out["job_log_tail"] = (c.out / "job.log").read_text()[-1500:]
    keys = ("failslow_iteration_duration_seconds", "failslow_iteration_period", "failslow_iteration_compute",
            "failslow_iteration_comm", "failslow_gpu_", "failslow_exporter_collector_success",
            "failslow_ring_dropped", "failslow_comm_info")
    for name in ("metrics_healthy", "metrics_slow"):
        f = c.out / f"{name}.prom"
        if f.exists():
            out[name] = pick(f.read_text(), keys)[:60]
    if reader is not None:
        reader.close()
    # every record of the ring, and what the PROFILE bit gave
    rings = sorted(ring_dir.glob("*.ring"))
    if rings:
        d = subprocess.run([sys.executable, "-m", "failslow_cli", "shim-dump", "--dir", str(ring_dir)],
                           capture_output=True, text=True, env=dict(env, LD_PRELOAD=""), timeout=120)
        recs = [json.loads(ln) for ln in d.stdout.splitlines() if ln.strip()]
        with gzip.open(c.out / "shim_dump.jsonl.gz", "wt") as f:
            f.write(d.stdout)
        ops: dict[str, int] = {}
        for r in recs:
            ops[r.get("op", "?")] = ops.get(r.get("op", "?"), 0) + 1
        gpu = [r for r in recs if int(r.get("flags", 0)) & int(Flag.GPU_TIMES)]
        failed = [r for r in recs if int(r.get("flags", 0)) & int(Flag.GPU_FAILED)]
        gdur: dict[str, list[float]] = {}
        for r in gpu:
            gdur.setdefault(r["op"], []).append((r["t_end_ns"] - r["t_start_ns"]) / 1e3)
        out["records"] = {"n": len(recs), "ops": ops, "gpu_times": len(gpu), "gpu_failed": len(failed),
                          "gpu_us_median": {k: sorted(v)[len(v) // 2] for k, v in gdur.items()},
                          "first": recs[:2], "first_gpu": gpu[:3]}
        with RingReader(rings[0], pending_timeout_s=0.0) as r0:
            hd = r0.header
            out["ring"] = {"capacity": hd.capacity, "write_index": hd.write_index, "dropped": hd.dropped,
                           "overwritten": hd.overwritten, "features": hd.features, "producer": hd.producer,
                           "clock_source": hd.clock_source}
    return out


def period_checks(c: Check) -> dict[str, Any]:
    out: dict[str, Any] = {}
    raw = c.out / "trace_raw.json"
    if raw.exists():
        with open(raw, "rb") as fi, gzip.open(c.out / "trace.json.gz", "wb") as fo:
            shutil.copyfileobj(fi, fo)
        raw.unlink()
    for name in ("shim_dump.jsonl.gz", "trace.json.gz"):
        f = c.out / name
        if not f.exists():
            continue
        src = f
        if name.endswith(".jsonl.gz"):  # the period command reads shim-dump lines uncompressed
            src = c.out / "shim_dump.jsonl"
            with gzip.open(f, "rb") as fi, open(src, "wb") as fo:
                shutil.copyfileobj(fi, fo)
        p = subprocess.run([sys.executable, "-m", "failslow_cli", "period", str(src)], capture_output=True,
                           text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        out[name] = {"rc": p.returncode, "stdout": p.stdout[:3000], "stderr": p.stderr[-1500:]}
        if src != f:
            src.unlink()
    return out


def gemm(c: Check) -> dict[str, Any]:
    """The validation GEMM on the GPU, three times (with ``--fault contention``: while the other process
    still runs, judged against the same benchmark before the job as the healthy peer)."""
    import torch

    from failslow.plan.validate import compute_verdict
    from testbed.validation import CUDA_GEMM_REPS, CUDA_GEMM_SIZE, Gemm

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA"}
    g = Gemm(CUDA_GEMM_SIZE, 0)
    runs = []
    for _ in range(3):
        g.timed(CUDA_GEMM_REPS)
        runs.append(g.result())
    out: dict[str, Any] = {"runs": runs}
    before = c.res.get("gemm_before", {}).get("runs")
    if before and c.hog is not None:
        v = compute_verdict({1: runs[-1]["gflops"]}, {0: before[-1]["gflops"]}, metric="gflops")
        out["verdict_vs_before"] = {"confirmed": list(v.confirmed), "ratio": runs[-1]["gflops"] / before[-1]["gflops"]}
    return out


#: Another process's bf16 matrix products on the same GPU, until it is killed: contention for the device,
#: one real cause of a GPU straggler.
HOG = """
import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
while True:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--progress", default="")
    ap.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=16384)
    ap.add_argument("--healthy-iters", type=int, default=600)
    ap.add_argument("--slow-iters", type=int, default=600)
    ap.add_argument("--scrape-before", type=int, default=40, help="scrape this many iterations before a phase ends")
    ap.add_argument("--profile-at", type=int, default=60, help="first step recorded by torch.profiler")
    ap.add_argument("--profile-steps", type=int, default=6)
    ap.add_argument("--profile-on", type=int, nargs=2, default=(300, 400),
                    help="iterations between which the shim's PROFILE bit is on")
    ap.add_argument("--host-gap-s", type=float, default=0.02)
    ap.add_argument("--fault", choices=("compute", "contention"), default="compute",
                    help="the slow phase: the job's compute twice (default), or another process's matrix "
                         "products on the same GPU")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.job:
        job(args)
        return
    sys.path.insert(0, str(ROOT))
    c = Check(out)
    c.step("env", lambda: env_info(c))
    if args.backend == "nccl":
        c.step("shim", lambda: build_shim(c))
    if args.fault == "contention":
        c.step("gemm_before", lambda: gemm(c))
    c.step("job", lambda: run_job(c, args))
    c.step("period", lambda: period_checks(c))
    c.step("gemm", lambda: gemm(c))
    if c.hog is not None:
        c.hog.kill()
        c.hog.wait()
    shutil.rmtree(out / "rings", ignore_errors=True)
    (out / "progress").unlink(missing_ok=True)
    c.log("done")


if __name__ == "__main__":
    main()

"""What-if analysis: accuracy on the real trace, speed against peers, testbed validation.

Run with `.venv/bin/python -m bench whatif` (writes the `whatif` section of docs/BENCHMARKS.md).
Environment: FAILSLOW_BENCH_WHATIF_TESTBED=0 skips the testbed validation (it runs real training for
a few minutes); FAILSLOW_WHATIF_REFERENCE=/path/to/StragglerAnalysis also times the authors' analyzer
(`python -m analyzer.wia`) on the 64-GPU-sized trace when a checkout is available.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
ST = REPO.parent / "shared" / "data" / "whatif-ST"
PY = sys.executable
FAILSLOW = str(Path(PY).parent / "failslow")

TITLE = "What-if analysis (`failslow whatif`)"


def _wall(cmd: list[str], runs: int, env: dict[str, str] | None = None) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        out.append(time.perf_counter() - t)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr[-2000:]}")
    return out


def _accuracy() -> str:
    from failslow.whatif import analyze, read_meta, read_trace

    r = analyze(read_trace(ST / "trace-ST.parquet", read_meta(ST / "meta-ST.yaml")))
    pub = json.loads((ST / "result-ST.json").read_text())
    ms = json.loads((ST / "ms-ST.json").read_text())
    mw = json.loads((ST / "mw-ST.json").read_text())
    rows = [
        ("S", r.S, pub["blocking_slowdown"]),
        ("M_S", r.M_S, ms["Ms"]),
        ("M_W", r.M_W, mw["Mw"]),
        ("T (simulated original, s)", r.T, ms["tori"]),
        ("T_ideal (s)", r.T_ideal, ms["tideal"]),
        ("S_t forward-compute", r.S_t["forward-compute"], pub["blocking_decompose_by_optype"]["forward-compute"]),
        ("S_stage 3", r.S_stage[3], pub["blocking_decompose_by_stage"]["3"]),
        ("simulation error (= launch slowdown - 1)", r.simulation_error, pub["launch_slowdown"] - 1),
    ]
    per_step = max(abs(r.per_step[int(k)] / v - 1) for k, v in pub["blocking_step_slowdown"].items())
    lines = ["### Accuracy on the real trace (../shared/data/whatif-ST, DP2 x PP4)", "",
             "`failslow whatif ../shared/data/whatif-ST/trace-ST.parquet` against the authors' published results "
             "(result-ST.json, ms-ST.json, mw-ST.json). Targets: S within 2% of 1.179, M_S within 0.05 of 1.219.",
             "", "| figure | ours | published | difference |", "|---|---|---|---|"]
    for name, ours, theirs in rows:
        lines.append(f"| {name} | {ours:.4f} | {theirs:.4f} | {ours - theirs:+.4f} ({(ours / theirs - 1) * 100:+.2f}%) |")
    lines.append(f"| per-step slowdown, worst of 32 steps | | | {per_step * 100:.2f}% |")
    lines.append("")
    lines.append(f"Root cause: **{r.root_cause.verdict}** - {r.root_cause.summary}.")
    return "\n".join(lines)


def _speed() -> str:
    from failslow.whatif.synth import SynthConfig, generate
    from failslow.whatif.trace import write_trace

    tmp = Path(tempfile.mkdtemp(prefix="bench-whatif-"))
    cases = {
        "64-GPU-sized (DP4 x PP4 = 16 workers, 32 micro-batches, 44 steps)":
            SynthConfig(dp=4, pp=4, micro_batches=32, steps=44, slow_workers=((2, 1, 1.3),), seed=1, name="gpu64"),
        "1024 workers (DP64 x PP16, 32 micro-batches, 4 steps)":
            SynthConfig(dp=64, pp=16, micro_batches=32, steps=4, slow_workers=((5, 7, 1.3),), seed=2,
                        name="gpu1024"),
    }
    lines = ["### Speed (whole process: interpreter start, imports, read, all decompositions, JSON out)", ""]
    floor_cmd = [PY, "-c", "import numpy, yaml, pyarrow.parquet"]
    pandas_cmd = [PY, "-c", "import pandas, numpy, yaml; pandas.read_parquet({path!r})"]
    rows = []
    paths = {}
    for name, cfg in cases.items():
        st = generate(cfg)
        path = tmp / f"trace-{cfg.name}.parquet"
        write_trace(path, st.columns)
        (tmp / f"meta-{cfg.name}.yaml").write_text(
            f"dp_size: {cfg.dp}\npp_size: {cfg.pp}\nvpp_size: 1\ntrial_name: {cfg.name}\n")
        paths[name] = path
        runs = 7 if cfg.dp * cfg.pp <= 64 else 3
        ours = _wall([FAILSLOW, "whatif", str(path)], runs)
        with_heat = _wall([FAILSLOW, "whatif", str(path), "--heatmap", str(tmp / "h.png"), "--textfile",
                           str(tmp / "w.prom")], 1)
        floor = _wall(floor_cmd, runs)
        pandas_read = _wall([PY, "-c", pandas_cmd[2].format(path=str(path))], runs)
        rows.append((name, len(st.columns["start_ts"]), ours, with_heat[0], floor, pandas_read))
    lines += ["| trace | ops | `failslow whatif` median (min) | + heatmap + textfile | peer: python + imports only "
              "(numpy, yaml, pyarrow) | peer: `import pandas` + `pandas.read_parquet` (the reference analyzer's "
              "first step) | ours vs pandas peer |", "|---|---|---|---|---|---|---|"]
    for name, n, ours, heat, floor, pr in rows:
        lines.append(f"| {name} | {n:,} | {statistics.median(ours):.3f} s ({min(ours):.3f}) | {heat:.3f} s | "
                     f"{statistics.median(floor):.3f} s | {statistics.median(pr):.3f} s | "
                     f"{statistics.median(ours) / statistics.median(pr):.2f}x |")
    lines.append("")
    gpu64 = next(iter(paths.values()))
    ref = os.environ.get("FAILSLOW_WHATIF_REFERENCE")
    if ref and (Path(ref) / "analyzer" / "wia.py").is_file():
        env = dict(os.environ, PYTHONPATH=ref)
        meta = gpu64.with_name("meta-gpu64.yaml")
        t_ref = _wall([PY, "-m", "analyzer.wia", "--trace", str(gpu64), "--metadata", str(meta), "--dump-dir",
                       str(tmp / "ref")], 3, env)
        ours64 = statistics.median(rows[0][2])
        lines.append(f"Authors' reference analyzer (`python -m analyzer.wia`, {ref}) on the 64-GPU-sized trace: "
                     f"median {statistics.median(t_ref):.3f} s; ours is {statistics.median(t_ref) / ours64:.1f}x "
                     "faster (target >= 3x).")
    else:
        ours64 = statistics.median(rows[0][2])
        lines.append(
            "The authors' reference analyzer is not installed here (set FAILSLOW_WHATIF_REFERENCE to a checkout of "
            "ByteDance-Seed/StragglerAnalysis to time it in the same run). The issue quotes about 2 s for it on this "
            f"machine (not measured by this benchmark); against that figure ours ({ours64:.3f} s) would be "
            f"{2.0 / ours64:.1f}x faster (target >= 3x, i.e. <= 0.67 s). Measured in this run: ours takes "
            f"{ours64 / statistics.median(rows[0][5]):.2f}x the time the reference needs just to import pandas and "
            "read the trace, before any analysis.")
    lines.append("")
    lines.append(f"Commands: `{FAILSLOW} whatif TRACE` (traces from `failslow.whatif.synth`, seeds 1 and 2, one "
                 "slow worker each), peers as in the table header. Target for 1024 workers: < 30 s.")
    return "\n".join(lines)


def _iterations(report: dict[str, Any], skip: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-iteration (index, mean time over ranks, end time) from a testbed report."""
    its = report["iteration_time_s"]
    ends = report["iteration_end_unix_s"]
    n = min(len(v) for v in its.values())
    t = np.mean([v[:n] for v in its.values()], axis=0)
    e = np.max([v[:n] for v in ends.values()], axis=0)
    idx = np.arange(n)
    return idx[skip:], t[skip:], e[skip:]


def testbed_validation(levels: tuple[float, ...] = (0.2, 0.1, 0.05), window: int = 12, gap: int = 10,
                       warmup: int = 6, rank: int = 1, out_dir: Path | None = None) -> tuple[str, list[dict[str, Any]]]:
    """Run one testbed job whose rank `rank` is CPU-capped at each level in turn, with healthy
    stretches between, and compare each level's measured slowdown with the what-if estimate.

    One job (not one per level) keeps the background load of this shared machine as equal as
    possible between the healthy and the faulty iterations they are compared with.
    """
    from failslow.whatif import analyze, read_trace
    from failslow.whatif.trace import select_steps

    out_dir = out_dir or Path(tempfile.mkdtemp(prefix="bench-whatif-tb-"))
    specs, windows = [], []
    it = warmup + gap
    for q in levels:
        specs += ["--inject", f"cpu:rank={rank},quota={q},start_iter={it},stop_iter={it + window}"]
        windows.append((q, it, it + window))
        it += window + gap
    n_iter = it
    trace = out_dir / "trace-tbval.parquet"
    report = out_dir / "report-tbval.json"
    cmd = [FAILSLOW, "testbed", "run", "--dp", "2", "--pp", "2", "--iterations", str(n_iter), "--trace",
           str(trace), "--report", str(report), "--job", f"whatif-val-{os.getpid()}", *specs]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"testbed run failed ({p.returncode}): {p.stderr[-3000:]}")
    rep = json.loads(report.read_text())
    idx, t_it, t_end = _iterations(rep, warmup)
    faults = sorted(rep.get("faults", []), key=lambda f: f["start_unix_s"])
    # which iterations ran entirely inside / entirely outside a fault window (by wall time)
    starts = t_end - t_it
    inside = np.full(idx.shape, -1)
    outside = np.ones(idx.shape, bool)
    for k, f in enumerate(faults):
        a, b = f["start_unix_s"], f.get("end_unix_s") or np.inf
        inside[(starts >= a) & (t_end <= b)] = k
        outside &= (t_end < a) | (starts > b)
    full = read_trace(trace)
    results = []
    for k, (q, _a, _b) in enumerate(windows):
        sel = idx[inside == k]
        if sel.size < 3:
            raise RuntimeError(f"fault level {q}: only {sel.size} iterations inside its window")
        lo, hi = sel.min(), sel.max()
        before = idx[outside & (idx < lo)][-gap:]
        after = idx[outside & (idx > hi)][:gap]
        healthy = np.concatenate([before, after])
        t_f = float(np.mean(t_it[np.isin(idx, sel)]))
        t_h = float(np.mean(t_it[np.isin(idx, healthy)]))
        tr_f = select_steps(full, 0, sel.tolist())
        tr_h = select_steps(full, 0, healthy.tolist())
        opts = dict(ideal="median", launch_delays="ideal", max_sim_error=1.0)
        r_f = analyze(tr_f, **opts)  # type: ignore[arg-type]
        r_h = analyze(tr_h, **opts)  # type: ignore[arg-type]
        r_paper = analyze(tr_f, max_sim_error=1.0)
        fix = r_f.T / r_f.T_fix_top
        results.append({
            "quota": q, "iterations_faulty": int(sel.size), "iterations_healthy": int(healthy.size),
            "measured": t_f / t_h, "S": r_f.S, "S_healthy": r_h.S, "S_rel": r_f.S / r_h.S,
            "S_fix_top": fix, "top": r_f.M_W_workers, "verdict": r_f.root_cause.verdict,
            "S_paper": r_paper.S, "sim_err_nodelay": r_f.simulation_error_without_delays,
        })
    lines = ["### Testbed validation (CPU fault on one rank, three levels)", "",
             f"One `failslow testbed run --dp 2 --pp 2 --iterations {n_iter}` job (4 CPU ranks, gloo, network "
             f"namespaces) with `cpu:rank={rank},quota=Q` switched on for {window} iterations at each level, "
             f"{gap} healthy iterations between; {wall:.0f} s wall. Measured slowdown = mean iteration time inside "
             "the window / mean of the healthy iterations right before and after it (testbed report). Estimates "
             "from the trace of the same iterations: `S_fix` = T / T with only the top worker (found by the "
             "analysis, not told) idealised - the what-if answer to *how much faster without this straggler*; `S` "
             "= T / T_ideal (everything idealised: on this shared 2-core machine the healthy iterations already "
             "have S_healthy > 1 from CPU contention noise), and `S / S_healthy`. Options: `--ideal median "
             "--launch-delays ideal` (the testbed's Python overhead between ops is on the critical path and slows "
             "with the CPU cap). The paper: measured 1.16 / 1.40 / 2.03 vs simulated 1.21 / 1.42 / 1.98.", "",
             "| quota (CPUs) | iterations (faulty / healthy) | measured | S_fix | error | S | S / S_healthy | "
             "S (study's defaults) | top worker (dp, pp) | verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r['quota']} | {r['iterations_faulty']} / {r['iterations_healthy']} | {r['measured']:.3f} | "
            f"{r['S_fix_top']:.3f} | {(r['S_fix_top'] / r['measured'] - 1) * 100:+.1f}% | {r['S']:.3f} | "
            f"{r['S_rel']:.3f} | {r['S_paper']:.3f} | {r['top'][0]} | {r['verdict']} |")
    lines.append("")
    lines.append(f"Rank {rank} is dp_rank {rank % 2}, pp_rank {rank // 2} in the testbed's tp-cp-dp-pp order.")
    return "\n".join(lines), results


def run() -> str:
    """All what-if figures as Markdown."""
    parts = [_accuracy(), _speed()]
    if os.environ.get("FAILSLOW_BENCH_WHATIF_TESTBED", "1") != "0":
        if os.geteuid() != 0:
            parts.append("### Testbed validation\n\nNot run: needs root for cgroup CPU quotas.")
        else:
            parts.append(testbed_validation()[0])
    return "\n\n".join(parts)

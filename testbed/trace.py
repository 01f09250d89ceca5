"""Merge the ranks' operation timings into one trace in the what-if schema (CSV or Parquet + meta YAML).

Columns (as in ``../shared/data/whatif-ST``): ``dp_rank, stage, rank, step, optype, start_ts, duration,
seq_id, mc, gmc, mb_id``. ``start_ts`` is seconds from the step's start, where a step starts when the
first rank starts that iteration; all ranks share one CLOCK_MONOTONIC, so start times are comparable
across ranks (what-if analysis needs that to tell waiting from transfer). Op types follow Megatron's
names: ``forward-compute``, ``backward-compute``, ``forward-send``, ``forward-recv``, ``backward-send``,
``backward-recv``, ``grads-all-reduce`` (our DP gradient all-reduce; Megatron's distributed optimizer
would show ``grads-reduce-scatter``), ``optimizer`` and ``gc``, plus one op type of ours,
``step-overhead``: a rank's CPU work between the end of its previous iteration and its first op
(progress record, control file, zero_grad). It starts exactly where the rank's previous iteration
ended, so consecutive steps can be laid end to end without guessing their offsets, and it is
idealised like compute. Compute ops carry ``mc = 0`` and ``gmc = mc * pp + stage`` (the model chunk's
position in the whole model, as in Megatron's trace); ``mb_id`` is the micro-batch.

The meta YAML sits next to the trace: ``trace-X.parquet`` → ``meta-X.yaml`` (else ``<stem>.meta.yaml``).
"""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path
from typing import Any

import yaml

from failslow.errors import InputError
from failslow.topology import Layout

COLUMNS = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id", "mc", "gmc", "mb_id")


def meta_path(trace: Path) -> Path:
    """Where the meta YAML of `trace` goes."""
    name = trace.name
    for ext in (".csv.gz", ".csv", ".parquet"):
        if name.endswith(ext):
            name = name[: -len(ext)]
            break
    if name.startswith("trace-"):
        return trace.with_name("meta-" + name[len("trace-"):] + ".yaml")
    return trace.with_name(name + ".meta.yaml")


def check_trace_path(trace: Path) -> None:
    """Refuse a trace path whose format we cannot write.

    Raises:
        InputError: the extension is not .csv, .csv.gz or .parquet.
    """
    if not trace.name.endswith((".csv", ".csv.gz", ".parquet")):
        raise InputError(f"trace {trace}: extension must be .csv, .csv.gz or .parquet")


def collect_rows(run_dir: Path, layout: Layout, records: dict[int, list[dict[str, Any]]]) -> dict[str, list[Any]]:
    """Rows of the merged trace, as columns, sorted by rank, step, op type and start."""
    step_start: dict[int, float] = {}
    for recs in records.values():
        for r in recs:
            step_start[r["it"]] = min(step_start.get(r["it"], r["start"]), r["start"])
    rows: list[tuple[Any, ...]] = []
    for path in sorted((run_dir / "trace").glob("seg*-rank*.json")):
        d = json.loads(path.read_text())
        rank = int(d["rank"])
        c = layout.coords(rank)
        for step, op, t0, t1, seq, mc, gmc, mb in zip(d["step"], d["optype"], d["t0"], d["t1"], d["seq_id"],
                                                     d["mc"], d["gmc"], d["mb_id"], strict=True):
            if step not in step_start:
                continue  # an iteration cut short by a stop (restart) has no progress record
            rows.append((c.dp, c.pp, rank, step, op, t0 - step_start[step], t1 - t0, seq, mc, gmc, mb))
    rows.sort(key=lambda r: (r[2], r[3], r[4], r[5]))
    return {name: [r[i] for r in rows] for i, name in enumerate(COLUMNS)}


def write_trace(trace: Path, run_dir: Path, layout: Layout, records: dict[int, list[dict[str, Any]]],
                trial_name: str | None = None) -> Path:
    """Write the merged trace (format by extension) and its meta YAML; returns the meta path."""
    check_trace_path(trace)
    cols = collect_rows(run_dir, layout, records)
    trace.parent.mkdir(parents=True, exist_ok=True)
    if trace.name.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        types = {"dp_rank": pa.int16(), "stage": pa.int16(), "rank": pa.int32(), "step": pa.int64(),
                 "optype": pa.string(), "start_ts": pa.float64(), "duration": pa.float64(), "seq_id": pa.int32(),
                 "mc": pa.int16(), "gmc": pa.int32(), "mb_id": pa.int32()}
        table = pa.table({k: pa.array(cols[k], type=types[k]) for k in COLUMNS})
        pq.write_table(table, trace)
    else:
        opener = gzip.open if trace.name.endswith(".gz") else open
        with opener(trace, "wt", newline="") as f:  # type: ignore[operator]
            w = csv.writer(f)
            w.writerow(COLUMNS)
            for row in zip(*(cols[k] for k in COLUMNS), strict=True):
                w.writerow([f"{v:.6f}" if isinstance(v, float) else v for v in row])
    meta = meta_path(trace)
    name = trial_name or meta.stem.removeprefix("meta-").removesuffix(".meta")
    meta.write_text(yaml.safe_dump({
        "trial_name": name, "run_id": 0, "dp_size": layout.dp, "dsp_size": 1, "pp_size": layout.pp,
        "tp_size": layout.tp, "vpp_size": layout.vpp, "world_size": layout.world_size,
    }, sort_keys=False))
    return meta

"""Trace and metadata parsing: good input reads, bad input fails with a clear InputError."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from failslow.errors import InputError
from failslow.whatif import analyze, build_model, find_meta, read_meta, read_trace, trace_from_columns
from failslow.whatif.synth import SynthConfig, generate
from failslow.whatif.trace import JobMeta, parse_meta, write_trace


def _cols() -> dict:
    st = generate(SynthConfig(dp=2, pp=2, micro_batches=2, steps=2, seed=3))
    codes, names = st.columns["optype"]
    cols = {k: np.asarray(v).copy() for k, v in st.columns.items() if k != "optype"}
    cols["optype"] = np.array([names[c] for c in codes], dtype=object)
    return cols


def test_meta_parses_and_validates() -> None:
    m = parse_meta({"dp_size": 2, "pp_size": 4, "tp_size": 1, "dsp_size": 1, "world_size": 8, "trial_name": "ST"})
    assert (m.dp_size, m.pp_size, m.world_size, m.trial_name) == (2, 4, 8, "ST")
    with pytest.raises(InputError, match="world_size"):
        parse_meta({"dp_size": 2, "pp_size": 4, "world_size": 6})
    with pytest.raises(InputError, match="pp_size"):
        parse_meta({"dp_size": 2})
    with pytest.raises(InputError, match="positive integer"):
        parse_meta({"dp_size": 0, "pp_size": 2})
    with pytest.raises(InputError, match="mapping"):
        parse_meta(["dp_size"])  # type: ignore[arg-type]


def test_bad_yaml_and_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "meta.yaml"
    bad.write_text("dp_size: [1,\n")
    with pytest.raises(InputError, match="not valid YAML"):
        read_meta(bad)
    with pytest.raises(InputError, match="cannot read metadata"):
        read_meta(tmp_path / "nope.yaml")
    with pytest.raises(InputError, match="does not exist"):
        read_trace(tmp_path / "nope.parquet")
    junk = tmp_path / "trace.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(InputError, match="cannot read trace"):
        read_trace(junk)
    txt = tmp_path / "trace.txt"
    txt.write_text("x")
    with pytest.raises(InputError, match="unknown format"):
        read_trace(txt)


def test_find_meta_by_naming_convention(st_dir: Path, tmp_path: Path) -> None:
    assert find_meta(st_dir / "trace-ST.parquet") == st_dir / "meta-ST.yaml"
    assert find_meta(tmp_path / "run.parquet") is None
    (tmp_path / "run.yaml").write_text("dp_size: 1\npp_size: 1\n")
    assert find_meta(tmp_path / "run.csv.gz") == tmp_path / "run.yaml"


@pytest.mark.parametrize("fmt", ["parquet", "csv", "csv.gz"])
def test_round_trip_through_files(tmp_path: Path, fmt: str) -> None:
    st = generate(SynthConfig(dp=2, pp=2, micro_batches=4, steps=3, seed=1))
    path = tmp_path / f"trace.{fmt}"
    write_trace(path, st.columns)
    t = read_trace(path, st.meta)
    r1, r2 = analyze(t), analyze(st.trace())
    assert t.n_ops == st.trace().n_ops
    assert pytest.approx(r2.S, rel=1e-6) == r1.S


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c.pop("gmc"), "lacks column"),
        (lambda c: c["duration"].__setitem__(5, -1.0), "negative duration"),
        (lambda c: c["start_ts"].__setitem__(3, np.nan), "non-finite"),
        (lambda c: c["optype"].__setitem__(0, "warp-drive"), "unknown optype"),
        (lambda c: c["dp_rank"].__setitem__(0, 7), "dp_rank out of range"),
        (lambda c: c["stage"].__setitem__(0, -1), "stage out of range"),
        (lambda c: c["rank"].__setitem__(0, 99), "rank is not consistent"),
        (lambda c: c["seq_id"].__setitem__(0, -2), "seq_id"),
        (lambda c: c["mb_id"].__setitem__(slice(0, 3), 1.5), "integers"),
    ],
)
def test_bad_columns_are_refused(mutate, message: str) -> None:
    cols = _cols()
    if "mb_id" in message or message == "integers":
        cols["mb_id"] = cols["mb_id"].astype(float)
    mutate(cols)
    with pytest.raises(InputError, match=message):
        trace_from_columns(cols, JobMeta(dp_size=2, pp_size=2))


def _drop(cols: dict, idx: np.ndarray) -> dict:
    keep = np.ones(len(cols["start_ts"]), bool)
    keep[idx] = False
    return {k: v[keep] for k, v in cols.items()}


def test_inconsistent_traces_are_refused() -> None:
    cols = _cols()
    meta = JobMeta(dp_size=2, pp_size=2)
    # an op missing in one step of one DP rank
    with pytest.raises(InputError, match="missing at dp_rank"):
        build_model(trace_from_columns(_drop(cols, np.array([10])), meta))
    # an op recorded twice
    dup = {k: np.concatenate([v, v[:1]]) for k, v in cols.items()}
    with pytest.raises(InputError, match="recorded 2 times"):
        build_model(trace_from_columns(dup, meta))
    # a whole worker absent
    gone = np.flatnonzero((cols["dp_rank"] == 1) & (cols["stage"] == 1))
    with pytest.raises(InputError, match="no operations for worker"):
        trace_from_columns(_drop(cols, gone), meta)
    # every forward-recv of stage 1 gone: sends without receivers
    gone = np.flatnonzero((cols["optype"] == "forward-recv") & (cols["stage"] == 1))
    with pytest.raises(InputError, match="forward"):
        build_model(trace_from_columns(_drop(cols, gone), meta))
    # metadata claiming a different layout than the trace
    with pytest.raises(InputError, match="out of range"):
        trace_from_columns(cols, JobMeta(dp_size=1, pp_size=2))
    with pytest.raises(InputError, match="no operations"):
        trace_from_columns({k: v[:0] for k, v in cols.items()}, meta)

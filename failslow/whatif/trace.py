"""Operation traces of hybrid-parallel training jobs, as the what-if analysis reads them.

A trace holds one row per recorded operation of one worker (one DP rank x one PP stage) in one
training step, in the column schema of ByteDance's what-if study:

=========  =====================================================================================
column     meaning
=========  =====================================================================================
dp_rank    data-parallel rank of the worker
stage      pipeline stage (PP rank) of the worker
rank       global rank of the worker (one rank per (dp_rank, stage); TP peers are not recorded)
step       training step id (steps may be a non-contiguous sample)
optype     operation type, one of `OPTYPES`
start_ts   start, seconds from the step's start (a common reference for all workers of the step)
duration   seconds the operation took (communication: including the wait for its peers)
seq_id     order of the operations of one type within the step on one worker, from 0
mc         model chunk within the stage (virtual pipeline), -1 when not applicable
gmc        model chunk within the whole model (compute ops), -1 when not applicable
mb_id      micro-batch (compute ops), -1 when not applicable
=========  =====================================================================================

The metadata YAML (`meta-*.yaml`) names the parallel layout: `dp_size`, `pp_size`, `tp_size`,
`vpp_size`, optionally `dsp_size`/`cp_size` and `world_size`, `trial_name`.

Reading (`read_trace`, `read_meta`) is separate from parsing (`trace_from_columns`, `parse_meta`),
which is pure and validates everything it is given, raising `InputError` with a message that says
what is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from failslow.errors import InputError

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

COLUMNS: tuple[str, ...] = (
    "dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id", "mc", "gmc", "mb_id",
)
INT_COLUMNS: tuple[str, ...] = ("dp_rank", "stage", "rank", "step", "seq_id", "mc", "gmc", "mb_id")


class Kind(IntEnum):
    """How an operation takes part in the dependency model."""

    COMPUTE = 0  # runs alone on the worker's main (compute) stream
    P2P = 1  # pipeline send/recv between adjacent stages of one DP rank, on one of four PP streams
    DP_COLL = 2  # collective across the DP ranks of one stage, on the DP-communication stream
    MAIN_COLL = 3  # collective issued on the main stream (embedding/layernorm grads, grad-norm clip)


@dataclass(frozen=True)
class OpType:
    """One operation type: its name, role in the dependency model and decomposition group."""

    name: str
    kind: Kind
    group: str  # name under which S_t reports it (send and recv of one direction are one group)
    is_comm: bool  # idealised with the median transfer time (comm) or the mean duration (compute)


def _op(name: str, kind: Kind, group: str | None = None, is_comm: bool | None = None) -> OpType:
    return OpType(name, kind, group or name, kind != Kind.COMPUTE if is_comm is None else is_comm)


# Order matters only for stable codes; names are the contract with the trace producers.
OPTYPES: tuple[OpType, ...] = (
    _op("forward-compute", Kind.COMPUTE),
    _op("backward-compute", Kind.COMPUTE),
    _op("forward-send", Kind.P2P, "forward-pp-comm"),
    _op("forward-recv", Kind.P2P, "forward-pp-comm"),
    _op("backward-send", Kind.P2P, "backward-pp-comm"),
    _op("backward-recv", Kind.P2P, "backward-pp-comm"),
    _op("params-all-gather", Kind.DP_COLL),
    _op("grads-reduce-scatter", Kind.DP_COLL),
    _op("separate-grads-all-reduce", Kind.DP_COLL),
    _op("grads-all-reduce", Kind.DP_COLL),  # plain DDP gradient all-reduce (the testbed)
    _op("layernorm-grads-all-reduce", Kind.MAIN_COLL),
    _op("embedding-grads-all-reduce", Kind.MAIN_COLL),
    _op("optimizer-clip-main-grad", Kind.MAIN_COLL),
    _op("optimizer", Kind.COMPUTE),
    _op("gc", Kind.COMPUTE),
    # Not Megatron's: a worker's per-iteration CPU work outside the ops above (bookkeeping,
    # zero_grad, ...), recorded by CPU testbeds from the end of the previous iteration to the first
    # op, so it is simulated and idealised like compute and consecutive steps can be placed exactly.
    _op("step-overhead", Kind.COMPUTE),
)
OPTYPE_CODE: dict[str, int] = {t.name: i for i, t in enumerate(OPTYPES)}
FWD, BWD = OPTYPE_CODE["forward-compute"], OPTYPE_CODE["backward-compute"]
FSEND, FRECV = OPTYPE_CODE["forward-send"], OPTYPE_CODE["forward-recv"]
BSEND, BRECV = OPTYPE_CODE["backward-send"], OPTYPE_CODE["backward-recv"]
PARAMS_AG = OPTYPE_CODE["params-all-gather"]
GRADS_RS = OPTYPE_CODE["grads-reduce-scatter"]
SEP_AR = OPTYPE_CODE["separate-grads-all-reduce"]
LAYERNORM_AR = OPTYPE_CODE["layernorm-grads-all-reduce"]
EMBEDDING_AR = OPTYPE_CODE["embedding-grads-all-reduce"]
CLIP = OPTYPE_CODE["optimizer-clip-main-grad"]
OPTIMIZER = OPTYPE_CODE["optimizer"]
GC = OPTYPE_CODE["gc"]
# Category values that some producers keep in the dictionary without rows; ignored when unused.
IGNORED_OPTYPES = frozenset({"first-op"})


@dataclass(frozen=True)
class JobMeta:
    """The parallel layout of the traced job (the metadata YAML)."""

    dp_size: int
    pp_size: int
    tp_size: int = 1
    vpp_size: int = 1
    cp_size: int = 1
    trial_name: str = ""

    @property
    def world_size(self) -> int:
        """Number of GPUs (processes) of the job."""
        return self.dp_size * self.pp_size * self.tp_size * self.cp_size

    @property
    def n_workers(self) -> int:
        """Number of traced workers: one per (DP rank, PP stage)."""
        return self.dp_size * self.pp_size


@dataclass(frozen=True)
class Trace:
    """A validated operation trace in columnar form (one numpy array per column, one entry per op).

    `optype` holds codes into `OPTYPES`; `step_ids` the sorted distinct step ids, and `step_index`
    each row's position in it.
    """

    meta: JobMeta
    dp_rank: IntArray
    stage: IntArray
    rank: IntArray
    step: IntArray
    optype: IntArray
    start: FloatArray
    duration: FloatArray
    seq_id: IntArray
    mc: IntArray
    gmc: IntArray
    mb_id: IntArray
    step_ids: IntArray = field(repr=False)
    step_index: IntArray = field(repr=False)

    @property
    def n_ops(self) -> int:
        """Number of recorded operations."""
        return int(self.start.shape[0])

    @property
    def n_steps(self) -> int:
        """Number of distinct steps."""
        return int(self.step_ids.shape[0])

    def step_times(self) -> FloatArray:
        """Measured time of each step: last end minus first start over all its operations."""
        end = self.start + self.duration
        n = self.n_steps
        hi: FloatArray = np.full(n, -np.inf)
        lo = np.full(n, np.inf)
        np.maximum.at(hi, self.step_index, end)
        np.minimum.at(lo, self.step_index, self.start)
        out: FloatArray = hi - lo
        return out


def parse_meta(doc: Mapping[str, Any]) -> JobMeta:
    """Validate a metadata mapping (the parsed YAML) into a `JobMeta`."""
    if not isinstance(doc, Mapping):
        raise InputError("metadata must be a mapping with dp_size, pp_size, ...")

    def size(key: str, default: int | None, *aliases: str) -> int:
        for k in (key, *aliases):
            if k in doc and doc[k] is not None:
                v = doc[k]
                if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                    raise InputError(f"metadata {k}={v!r}: expected a positive integer")
                return int(v)
        if default is None:
            raise InputError(f"metadata lacks {key}")
        return default

    meta = JobMeta(
        dp_size=size("dp_size", None),
        pp_size=size("pp_size", None),
        tp_size=size("tp_size", 1),
        vpp_size=size("vpp_size", 1),
        cp_size=size("cp_size", 1, "dsp_size"),
        trial_name=str(doc.get("trial_name", doc.get("job", "")) or ""),
    )
    ws = doc.get("world_size")
    if ws is not None and ws != meta.world_size:
        raise InputError(
            f"metadata world_size={ws} but dp*pp*tp*cp = {meta.dp_size}*{meta.pp_size}*{meta.tp_size}"
            f"*{meta.cp_size} = {meta.world_size}")
    return meta


def read_meta(path: str | Path) -> JobMeta:
    """Read and validate a metadata YAML file."""
    import yaml  # only when a metadata file is actually read

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise InputError(f"cannot read metadata {p}: {exc.strerror or exc}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"metadata {p} is not valid YAML: {exc}") from exc
    return parse_meta(doc)


def find_meta(trace_path: str | Path) -> Path | None:
    """The metadata YAML that belongs to a trace file, by naming convention, if there is one.

    Tried in order, beside the trace: `<stem>.yaml`/`.yml`, `<stem>.meta.yaml`, `meta-<X>.yaml`
    for a trace named `trace-<X>.*`, and `meta.yaml`.
    """
    p = Path(trace_path)
    stem = p.name
    for suffix in (".gz", ".parquet", ".csv"):
        stem = stem.removesuffix(suffix)
    cands = [f"{stem}.yaml", f"{stem}.yml", f"{stem}.meta.yaml"]
    if stem.startswith("trace-"):
        cands.append("meta-" + stem[len("trace-"):] + ".yaml")
    cands.append("meta.yaml")
    for name in cands:
        q = p.parent / name
        if q.is_file():
            return q
    return None


def infer_meta(columns: Mapping[str, Any]) -> JobMeta:
    """A layout guessed from the trace itself (DP and PP sizes from the largest ranks seen)."""
    dp = int(np.max(columns["dp_rank"])) + 1 if len(columns["dp_rank"]) else 1
    pp = int(np.max(columns["stage"])) + 1 if len(columns["stage"]) else 1
    mc = np.asarray(columns["mc"])
    vpp = int(mc.max()) + 1 if mc.size and mc.max() >= 0 else 1
    return JobMeta(dp_size=max(dp, 1), pp_size=max(pp, 1), vpp_size=vpp)


def _int_column(name: str, values: Any) -> IntArray:
    arr = np.asarray(values)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)):
            raise InputError(f"column {name} has missing or non-finite values")
        if np.any(arr != np.round(arr)):
            raise InputError(f"column {name} must hold integers")
    elif arr.dtype.kind not in "iub":
        raise InputError(f"column {name} must be numeric, got {arr.dtype}")
    return arr.astype(np.int64)


def _optype_codes(values: Any) -> IntArray:
    """Map optype names (a sequence of str, or (codes, categories)) to codes into `OPTYPES`."""
    if isinstance(values, tuple) and len(values) == 2:
        codes, cats = values
        codes = np.asarray(codes)
        if codes.size and codes.min() < 0:
            raise InputError("column optype has missing values")
        used = np.unique(codes)
        table = np.full(len(cats), -1, dtype=np.int64)
        unknown = []
        for c in used.tolist():
            name = cats[c]
            if name in OPTYPE_CODE:
                table[c] = OPTYPE_CODE[name]
            else:
                unknown.append(name)
        if unknown:
            raise InputError(f"unknown optype(s) {sorted(map(str, unknown))}; known: {sorted(OPTYPE_CODE)}")
        return table[codes.astype(np.int64)]
    names = np.asarray(values, dtype=object)
    uniq, inv = np.unique(names.astype(str), return_inverse=True)
    return _optype_codes((inv, list(uniq)))


def trace_from_columns(columns: Mapping[str, Any], meta: JobMeta | None = None) -> Trace:
    """Validate columns (name -> array-like) into a `Trace`; pure, raises `InputError` when inconsistent.

    Args:
        columns: the `COLUMNS`; `optype` as a sequence of names or a `(codes, categories)` pair.
        meta: the job layout; inferred from the ranks seen when omitted.
    """
    missing = [c for c in COLUMNS if c not in columns]
    if missing:
        raise InputError(f"trace lacks column(s) {missing}; expected {list(COLUMNS)}")
    n = len(columns["start_ts"])
    if n == 0:
        raise InputError("trace has no operations")
    for c in COLUMNS:
        if c != "optype" and len(columns[c]) != n:
            raise InputError(f"column {c} has {len(columns[c])} rows, expected {n}")
    ints = {c: _int_column(c, columns[c]) for c in INT_COLUMNS}
    start = np.asarray(columns["start_ts"], dtype=np.float64)
    dur = np.asarray(columns["duration"], dtype=np.float64)
    if not (np.all(np.isfinite(start)) and np.all(np.isfinite(dur))):
        raise InputError("start_ts/duration have missing or non-finite values")
    if np.any(dur < 0):
        i = int(np.argmax(dur < 0))
        raise InputError(f"negative duration {dur[i]} (row {i})")
    optype = _optype_codes(columns["optype"])
    if len(optype) != n:
        raise InputError(f"column optype has {len(optype)} rows, expected {n}")
    if meta is None:
        meta = infer_meta(ints)
    dp, st = ints["dp_rank"], ints["stage"]
    if dp.min() < 0 or dp.max() >= meta.dp_size:
        raise InputError(f"dp_rank out of range [0, {meta.dp_size}) of the metadata: saw {dp.min()}..{dp.max()}")
    if st.min() < 0 or st.max() >= meta.pp_size:
        raise InputError(f"stage out of range [0, {meta.pp_size}) of the metadata: saw {st.min()}..{st.max()}")
    if ints["seq_id"].min() < 0:
        raise InputError("seq_id must be >= 0")
    worker = dp * meta.pp_size + st
    seen = np.zeros(meta.n_workers, dtype=bool)
    seen[worker] = True
    if not seen.all():
        absent = np.flatnonzero(~seen)[:5]
        raise InputError(f"trace has no operations for worker(s) (dp_rank, stage) "
                         f"{[(int(w // meta.pp_size), int(w % meta.pp_size)) for w in absent]} of the "
                         f"{meta.dp_size}x{meta.pp_size} layout")
    # rank must identify the worker one-to-one
    w_rank = np.full(meta.n_workers, -1, dtype=np.int64)
    w_rank[worker] = ints["rank"]
    if np.any(w_rank[worker] != ints["rank"]):
        raise InputError("column rank is not consistent with (dp_rank, stage): a worker has several ranks")
    if np.unique(w_rank).size != meta.n_workers:
        raise InputError("column rank is not consistent with (dp_rank, stage): workers share a rank")
    step_ids, step_index = np.unique(ints["step"], return_inverse=True)
    return Trace(meta=meta, dp_rank=dp, stage=st, rank=ints["rank"], step=ints["step"], optype=optype,
                 start=start, duration=dur, seq_id=ints["seq_id"], mc=ints["mc"], gmc=ints["gmc"],
                 mb_id=ints["mb_id"], step_ids=step_ids.astype(np.int64),
                 step_index=step_index.astype(np.int64).reshape(-1))


_ARROW_DTYPES = {"int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64, "uint8": np.uint8,
                 "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64, "halffloat": np.float16,
                 "float": np.float32, "double": np.float64}


def _arrow_numpy(arr: Any) -> npt.NDArray[Any]:
    """A null-free primitive Arrow array as numpy, read from its buffer.

    pyarrow's own `to_numpy` imports pandas, which costs more than the rest of a small analysis.
    """
    dt = _ARROW_DTYPES.get(str(arr.type))
    if dt is None:
        raise InputError(f"unsupported column type {arr.type}")
    buf = arr.buffers()[1]
    return np.frombuffer(buf, dtype=dt, count=len(arr) + arr.offset)[arr.offset:]


def _columns_from_arrow(table: Any) -> dict[str, Any]:
    import pyarrow as pa

    names = set(table.column_names)
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise InputError(f"trace lacks column(s) {missing}; expected {list(COLUMNS)}")
    out: dict[str, Any] = {}
    for c in COLUMNS:
        col = table.column(c)
        if col.null_count:
            raise InputError(f"column {c} has {col.null_count} missing value(s)")
        if c == "optype":
            arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
            if not pa.types.is_dictionary(arr.type):
                if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
                    raise InputError(f"column optype must hold strings, got {arr.type}")
                arr = arr.dictionary_encode()
            out[c] = (_arrow_numpy(arr.indices),
                      [str(x) for x in arr.dictionary.to_pylist()])
        else:
            t = col.type
            if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
                raise InputError(f"column {c} must be numeric, got {t}")
            out[c] = _arrow_numpy(col.chunk(0) if col.num_chunks == 1 else col.combine_chunks())
    return out


def read_trace(path: str | Path, meta: JobMeta | None = None) -> Trace:
    """Read a trace file: Parquet (`.parquet`) or CSV, optionally gzip-compressed (`.csv`, `.csv.gz`)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"trace {p} does not exist")
    name = p.name.lower()
    try:
        if name.endswith(".parquet"):
            import pyarrow.parquet as pq

            with pq.ParquetFile(p) as pf:  # not read_table: it imports pyarrow.dataset and pandas
                table = pf.read(columns=list(COLUMNS))
        elif name.endswith((".csv", ".csv.gz", ".gz")):
            import pyarrow.csv as pcsv

            table = pcsv.read_csv(p)
        else:
            raise InputError(f"trace {p}: unknown format (expected .parquet, .csv or .csv.gz)")
    except InputError:
        raise
    except Exception as exc:  # pyarrow raises many types (ArrowInvalid, OSError, KeyError ...)
        raise InputError(f"cannot read trace {p}: {exc}") from exc
    return trace_from_columns(_columns_from_arrow(table), meta)


def write_trace(path: str | Path, columns: Mapping[str, Sequence[Any] | np.ndarray]) -> None:
    """Write trace columns to Parquet or CSV(.gz) (by the file name), e.g. a synthetic trace."""
    import pyarrow as pa

    p = Path(path)
    arrays = {c: pa.array(np.asarray(columns[c])) for c in COLUMNS if c != "optype"}
    ot = columns["optype"]
    if isinstance(ot, tuple):  # (codes, names), as the synthetic generator returns it
        codes, names = ot
        arrays["optype"] = pa.DictionaryArray.from_arrays(pa.array(np.asarray(codes, dtype=np.int32)),
                                                          pa.array(list(names)))
    else:
        arrays["optype"] = pa.array(list(ot)).dictionary_encode()
    arrays = {c: arrays[c] for c in COLUMNS}
    table = pa.table(arrays)
    if p.name.endswith(".parquet"):
        import pyarrow.parquet as pq

        pq.write_table(table, p)
    else:
        import pyarrow.csv as pcsv

        table = table.set_column(COLUMNS.index("optype"), "optype", table.column("optype").cast(pa.string()))
        if p.name.endswith(".gz"):
            with pa.CompressedOutputStream(str(p), "gzip") as out:
                pcsv.write_csv(table, out)
        else:
            pcsv.write_csv(table, p)


def select_steps(trace: Trace, skip_first: int = 0, step_ids: Sequence[int] | None = None) -> Trace:
    """The trace without its first `skip_first` steps (warm-up), and only `step_ids` when given."""
    keep = trace.step_index >= skip_first
    if step_ids is not None:
        keep &= np.isin(trace.step, np.asarray(list(step_ids), dtype=np.int64))
    if keep.all():
        return trace
    if not keep.any():
        raise InputError(f"no steps left after skipping {skip_first} of {trace.n_steps} and selecting "
                         f"{None if step_ids is None else len(step_ids)} step ids")
    cols: dict[str, Any] = {c: getattr(trace, {"start_ts": "start"}.get(c, c))[keep] for c in COLUMNS
                            if c != "optype"}
    cols["optype"] = (trace.optype[keep], [t.name for t in OPTYPES])
    return trace_from_columns(cols, trace.meta)

"""What `failslow detect` reads and prints: numeric series from CSV text, the JSON of one result."""

from __future__ import annotations

import csv
import io
import itertools
import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from failslow.detect import SeriesResult
from failslow.errors import InputError

FloatArray = NDArray[np.float64]


def parse_series_csv(text: str, column: str | None = None, all_columns: bool = False) -> dict[str, FloatArray]:
    """Numeric series from CSV text with a header; empty cells (and ``nan``) are missing samples.

    Picks ``column`` if given, else ``value`` if present, else the only numeric column; with
    ``all_columns`` every numeric column. Raises :class:`InputError` with the reason otherwise.
    """
    rows = list(csv.reader(io.StringIO(text)))
    while rows and not any(cell.strip() for cell in rows[-1]):
        rows.pop()
    if not rows:
        raise InputError("empty input: expected a CSV header and at least one row")
    header = [h.strip() for h in rows[0]]
    if len(set(header)) != len(header):
        raise InputError(f"duplicate column names in header: {header}")
    body = rows[1:]
    if not body:
        raise InputError("no data rows after the header")
    for k, r in enumerate(body, start=2):
        if len(r) != len(header):
            raise InputError(f"line {k}: {len(r)} fields, header has {len(header)}")

    def numeric(j: int) -> FloatArray | str:
        out = np.empty(len(body))
        for k, r in enumerate(body):
            cell = r[j].strip()
            if not cell:
                out[k] = np.nan
                continue
            try:
                val = float(cell)
            except ValueError:
                return f"line {k + 2}: {cell!r} in column {header[j]!r} is not a number"
            if math.isinf(val):
                return f"line {k + 2}: infinite value in column {header[j]!r}"
            out[k] = val
        if np.isnan(out).all():
            return f"column {header[j]!r} has no values"
        return out

    if column is not None or (not all_columns and "value" in header):
        name = column if column is not None else "value"
        if name not in header:
            raise InputError(f"no column {name!r}; the header has {', '.join(header)}")
        got = numeric(header.index(name))
        if isinstance(got, str):
            raise InputError(got)
        return {name: got}
    found: dict[str, FloatArray] = {}
    reasons: list[str] = []
    for j, name in enumerate(header):
        got = numeric(j)
        if isinstance(got, str):
            reasons.append(got)
        else:
            found[name] = got
    if not found:
        raise InputError("no numeric column: " + "; ".join(reasons))
    if all_columns:
        return found
    if len(found) > 1:
        raise InputError(f"several numeric columns ({', '.join(found)}) and none named 'value': "
                         "pick one with --column or use --all-columns")
    return found


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def result_json(values: FloatArray, result: SeriesResult, method: str) -> dict[str, Any]:
    """The `failslow detect` JSON for one series: means are over whole segments between change points."""
    bounds = [0] + [c.index for c in result.change_points] + [values.shape[0]]
    means = []
    for a, b in itertools.pairwise(bounds):
        seg = values[a:b]
        seg = seg[~np.isnan(seg)]
        means.append(float(seg.mean()) if seg.size else math.nan)
    cps = []
    for k, c in enumerate(result.change_points):
        m0, m1 = means[k], means[k + 1]
        cps.append({"index": c.index, "probability": _finite(round(c.probability, 6)),
                    "mean_before": _finite(m0), "mean_after": _finite(m1),
                    "ratio": _finite(m1 / m0) if m0 != 0 else None})
    return {"method": method, "n": int(values.shape[0]), "change_points": cps}

"""Scoring change-point detectors on human-annotated series: F1 and covering with a margin, as in TCPDBench.

What it is for: judging generic change detection (trend vs change) on real series that several people
annotated, with the two metrics of van den Burg & Williams, "An Evaluation of Change Point Detection
Algorithms" (the Turing Change Point Benchmark):

* **F1 with a margin.** Every annotator's set ``T_k`` and the prediction ``X`` include index 0 (the start
  is a trivial change point). ``TP(T, X)`` is the set of ``tau`` in ``T`` matched to a prediction within
  ``margin`` samples, each prediction matched at most once (the nearest unused one). Precision
  ``P = |TP(T*, X)| / |X|`` with ``T*`` the union of all annotators' points; recall
  ``R = mean_k |TP(T_k, X)| / |T_k|``; ``F1 = 2PR / (P + R)``.
* **Covering.** Change points cut ``0..n-1`` into segments; an annotator's partition ``G`` is covered by
  the predicted one ``G'`` with ``C(G', G) = (1/n) sum_{A in G} |A| max_{A' in G'} J(A, A')`` (``J`` the
  Jaccard index of the two index sets); the score is the mean over annotators.

Reading files is kept apart from parsing (:func:`read_series_dir` does the I/O, :func:`parse_series` is
pure). The series format is compact JSON: ``{"name", "values": [... null = missing], "annotations":
{annotator: [indices]}}`` (see ``tests/data/tcpd/SOURCES.md``).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from failslow.errors import InputError

MARGIN = 5
"""Samples by which a predicted change may miss an annotated one and still count (TCPDBench's default)."""


@dataclass(frozen=True)
class AnnotatedSeries:
    """One real series with its annotators' change points.

    Attributes:
        name: Short name of the series.
        values: The samples (NaN = missing).
        annotations: Annotator id -> 0-based indices of the first sample of each new regime.
    """

    name: str
    values: NDArray[np.float64]
    annotations: dict[str, list[int]]

    @property
    def n(self) -> int:
        """Number of samples."""
        return int(self.values.shape[0])


def parse_series(text: str | bytes) -> AnnotatedSeries:
    """An :class:`AnnotatedSeries` from its compact JSON; raises :class:`InputError` on a malformed one."""
    try:
        doc = json.loads(text)
        name = str(doc["name"])
        vals = np.array([math.nan if v is None else float(v) for v in doc["values"]], dtype=np.float64)
        ann = {str(k): sorted(int(i) for i in v) for k, v in dict(doc["annotations"]).items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"not an annotated series: {exc}") from None
    if vals.size < 2:
        raise InputError(f"series {name!r} has fewer than 2 samples")
    if not ann:
        raise InputError(f"series {name!r} has no annotators")
    for k, idx in ann.items():
        if any(i < 0 or i >= vals.size for i in idx):
            raise InputError(f"series {name!r}: annotator {k} marks an index outside 0..{vals.size - 1}")
    return AnnotatedSeries(name=name, values=vals, annotations=ann)


def read_series_dir(path: str | Path, names: Iterable[str] | None = None) -> list[AnnotatedSeries]:
    """Read every ``*.json`` series in ``path`` (or only ``names``), sorted by name.

    Files that are not series (``published_default.json``) are skipped by their lack of ``values``.
    """
    root = Path(path)
    wanted = set(names) if names is not None else None
    out = []
    for f in sorted(root.glob("*.json")):
        if wanted is not None and f.stem not in wanted:
            continue
        text = f.read_text()
        if '"values"' not in text:
            continue
        out.append(parse_series(text))
    if wanted is not None and len(out) != len(wanted):
        missing = wanted - {s.name for s in out}
        raise InputError(f"no series file for {sorted(missing)} in {root}")
    return out


def true_positives(truth: Iterable[int], pred: Iterable[int], margin: int = MARGIN) -> set[int]:
    """The points of ``truth`` matched to a distinct prediction within ``margin`` samples.

    Each true point, in increasing order, takes the nearest unused prediction (the smaller index on a
    tie), so two annotated points close together need two predictions.
    """
    free = sorted(set(pred))
    hit: set[int] = set()
    for tau in sorted(set(truth)):
        best: int | None = None
        for x in free:
            d = abs(tau - x)
            if d <= margin and (best is None or d < abs(tau - best)):
                best = x
        if best is not None:
            hit.add(tau)
            free.remove(best)
    return hit


def f1_score(annotations: Mapping[str, Sequence[int]], predictions: Iterable[int],
             margin: int = MARGIN) -> float:
    """TCPDBench's F1 of ``predictions`` against every annotator (see module docstring)."""
    if not annotations:
        raise InputError("need at least one annotator")
    xs = set(predictions) | {0}
    tks = [set(v) | {0} for v in annotations.values()]
    tstar = set().union(*tks)
    precision = len(true_positives(tstar, xs, margin)) / len(xs)
    recall = float(np.mean([len(true_positives(tk, xs, margin)) / len(tk) for tk in tks]))
    if precision + recall == 0:
        return 0.0
    return 2.0 * precision * recall / (precision + recall)


def partition(cps: Iterable[int], n: int) -> list[tuple[int, int]]:
    """Segments ``[a, b)`` of ``0..n-1`` cut at the given change points (out-of-range ones ignored)."""
    cuts = sorted({c for c in cps if 0 < c < n})
    bounds = [0, *cuts, n]
    return list(itertools.pairwise(bounds))


def _cover_one(truth: list[tuple[int, int]], pred: list[tuple[int, int]], n: int) -> float:
    total = 0.0
    for a, b in truth:
        best = 0.0
        for c, d in pred:
            inter = min(b, d) - max(a, c)
            if inter > 0:
                best = max(best, inter / (max(b, d) - min(a, c)))
        total += (b - a) * best
    return total / n


def covering(annotations: Mapping[str, Sequence[int]], predictions: Iterable[int], n: int) -> float:
    """TCPDBench's covering of the annotators' partitions by the predicted one, averaged over annotators."""
    if not annotations:
        raise InputError("need at least one annotator")
    if n < 1:
        raise InputError("n must be positive")
    pred = partition(predictions, n)
    return float(np.mean([_cover_one(partition(v, n), pred, n) for v in annotations.values()]))


@dataclass
class CPDScore:
    """F1 and covering of one method on each series, and their means."""

    method: str
    f1: dict[str, float] = field(default_factory=dict)
    cover: dict[str, float] = field(default_factory=dict)
    n_cps: dict[str, int] = field(default_factory=dict)
    n_obs: dict[str, int] = field(default_factory=dict)

    @property
    def mean_f1(self) -> float:
        """Mean F1 over the series."""
        return float(np.mean(list(self.f1.values()))) if self.f1 else math.nan

    @property
    def mean_cover(self) -> float:
        """Mean covering over the series."""
        return float(np.mean(list(self.cover.values()))) if self.cover else math.nan


Detector = Callable[[NDArray[np.float64]], Sequence[int]]
"""A method under test: the whole series in, the 0-based starts of its new regimes out."""


def score(series: Sequence[AnnotatedSeries], method: str, detect: Detector, margin: int = MARGIN) -> CPDScore:
    """Run ``detect`` on every series and score it."""
    out = CPDScore(method)
    for s in series:
        cps = sorted({int(c) for c in detect(s.values)})
        out.f1[s.name] = f1_score(s.annotations, cps, margin)
        out.cover[s.name] = covering(s.annotations, cps, s.n)
        out.n_cps[s.name] = len(cps)
        out.n_obs[s.name] = s.n
    return out


def markdown_table(scores: Sequence[CPDScore]) -> str:
    """Mean F1 and covering per method, with the number of series and of change points reported."""
    lines = ["| method | series | F1 | cover | change points reported |", "|---|---:|---:|---:|---:|"]
    for s in scores:
        lines.append(f"| {s.method} | {len(s.f1)} | {s.mean_f1:.3f} | {s.mean_cover:.3f} | "
                     f"{sum(s.n_cps.values())} |")
    return "\n".join(lines)


def per_series_table(scores: Sequence[CPDScore]) -> str:
    """F1 / covering (change points reported) of each method on each series of the first score."""
    if not scores:
        return ""
    head = "| series | n | " + " | ".join(f"{s.method}" for s in scores) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(scores)]
    for name in scores[0].f1:
        cells = [f"{s.f1[name]:.3f} / {s.cover[name]:.3f} ({s.n_cps[name]})" if name in s.f1 else "-"
                 for s in scores]
        lines.append(f"| {name} | {scores[0].n_obs[name]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

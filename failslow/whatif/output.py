"""Outputs of a what-if result: Prometheus textfile (per-worker S_w) and a DP x PP heatmap PNG.

The textfile is what the exporter serves from its textfile directory, so the Grafana DP x PP
heatmap can show `failslow_whatif_worker_slowdown_ratio{job,dp_rank,pp_rank}`. It is written
atomically (temp file + rename) because the exporter may read it at any moment.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from failslow.catalogue import by_name
from failslow.errors import InputError
from failslow.whatif.analysis import WhatIfResult

WORKER_METRIC = "failslow_whatif_worker_slowdown_ratio"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_textfile(result: WhatIfResult, job: str) -> str:
    """Prometheus text exposition of S_w, one series per worker."""
    metric = by_name()[WORKER_METRIC]
    lines = [f"# HELP {metric.name} {metric.help}", f"# TYPE {metric.name} {metric.type}"]
    j = _escape(job)
    for d in range(result.dp):
        for p in range(result.pp):
            lines.append(f'{metric.name}{{job="{j}",dp_rank="{d}",pp_rank="{p}"}} {float(result.S_w[d, p]):.6g}')
    return "\n".join(lines) + "\n"


def _atomic_write(path: Path, data: bytes) -> None:
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_textfile(result: WhatIfResult, path: str | Path, job: str) -> None:
    """Write the per-worker slowdown textfile atomically."""
    _atomic_write(Path(path), render_textfile(result, job).encode())


def write_text(path: str | Path, text: str) -> None:
    """Write a text file atomically (JSON reports)."""
    _atomic_write(Path(path), text.encode())


def write_heatmap(result: WhatIfResult, path: str | Path, title: str | None = None) -> None:
    """Draw S_w as a DP (rows) x PP (columns) heatmap PNG; imports matplotlib only here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sw = result.S_w
    dp, pp = sw.shape
    fig_w = min(2.0 + 0.5 * pp, 24.0)
    fig_h = min(1.5 + 0.35 * dp, 24.0)
    fig, ax = plt.subplots(figsize=(fig_w, fig_h))
    try:
        vmin, vmax = min(1.0, float(sw.min())), max(float(sw.max()), 1.0 + 1e-3)
        im = ax.imshow(sw, cmap="Reds", aspect="auto", vmin=vmin, vmax=vmax, interpolation="nearest")
        ax.set_xlabel("PP rank (stage)")
        ax.set_ylabel("DP rank")
        ax.set_title(title or f"what-if S_w  (S = {result.S:.3f}, {result.root_cause.verdict})", fontsize=9)
        if dp * pp <= 256:
            for d in range(dp):
                for p in range(pp):
                    dark = (sw[d, p] - vmin) / (vmax - vmin) > 0.6  # white text on dark cells
                    ax.text(p, d, f"{sw[d, p]:.3f}", ha="center", va="center", fontsize=7,
                            color="white" if dark else "black")
        if pp <= 32:
            ax.set_xticks(range(pp))
        if dp <= 32:
            ax.set_yticks(range(dp))
        fig.colorbar(im, ax=ax, label="S_w")
        fig.tight_layout()
        buf_path = Path(path)
        try:
            fig.savefig(buf_path, dpi=100)
        except OSError as exc:
            raise InputError(f"cannot write heatmap {buf_path}: {exc.strerror or exc}") from exc
    finally:
        plt.close(fig)

"""docs/METRICS.md: generated from the catalogue, lists every exporter metric with its series count."""

from __future__ import annotations

import os
import re

from exporter.metrics_doc import DOC, Scale, render
from failslow.catalogue import CATALOGUE


def test_render_lists_every_catalogue_metric_with_counts() -> None:
    text = render()
    for m in CATALOGUE:
        assert f"| `{m.name}` |" in text
    # the per-node total is the sum of the exporter rows
    rows = re.findall(r"^\| `(failslow_[a-z_]+)` \|.*\| exporter \| [^|]+ \| (\d+) \|", text, flags=re.M)
    total = int(re.search(r"Total per node: (\d+) series", text).group(1))  # type: ignore[union-attr]
    assert total == sum(int(n) for _, n in rows)
    # scaling is linear in the node count
    big = render(Scale(gpus=20_000))
    t2 = int(re.search(r"about ([\d,]+) series for 10k", big).group(1).replace(",", ""))  # type: ignore[union-attr]
    t1 = int(re.search(r"about ([\d,]+) series for 10k", text).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert t2 > 1.9 * t1


def test_committed_metrics_doc_has_every_exporter_metric() -> None:
    if os.environ.get("FAILSLOW_REGEN_GOLDEN") == "1":
        DOC.write_text(render())
    committed = DOC.read_text()
    for m in CATALOGUE:
        if m.source == "exporter":
            assert f"| `{m.name}` |" in committed, f"{m.name}: run python -m exporter.metrics_doc"

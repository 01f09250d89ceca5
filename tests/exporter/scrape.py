"""Reading a scrape in tests: samples by family, one sample by labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def families(text: str) -> dict[str, list]:
    """Samples of every family in a Prometheus text exposition, by family name."""
    out: dict[str, list] = {}
    for f in text_string_to_metric_families(text):
        out.setdefault(f.name, []).extend(f.samples)
    return out


def value(samples: list, name: str | None = None, **labels: str) -> float:
    """The one sample with these labels (and name); fails unless exactly one matches."""
    hits = [s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())
            and (name is None or s.name == name)]
    assert len(hits) == 1, (labels, hits)
    return float(hits[0])

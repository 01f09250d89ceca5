"""Textfile collector: serves the ``*.prom`` files of a directory (e.g. what-if results).

Other tools (``failslow whatif --prom``) write Prometheus text-format files; the node agent serves
them next to its own series, as node_exporter's textfile collector does. Files are read on every
scrape; write them atomically (write a temporary file, then rename). A file that does not parse is
skipped, the others are still served, and the collector reports ``success 0`` for that scrape.
Families with the same name in several files are merged; a name declared with two types is an error.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from exporter.collector import PartialFailure
from exporter.settings import Settings


def parse_textfile(text: str) -> list[Metric]:
    """Parse Prometheus text format into metric families (pure).

    Raises:
        ValueError: the text is not valid exposition format.
    """
    return list(text_string_to_metric_families(text))


class TextfileCollector:
    """Serves every ``*.prom`` file of one directory."""

    def __init__(self, directory: Path) -> None:
        """Serve the files of ``directory`` (which may be created later)."""
        self.directory = Path(directory)

    def collect(self) -> Iterable[Metric]:
        """The merged families of all files; `PartialFailure` when some file could not be used."""
        if not self.directory.is_dir():
            raise FileNotFoundError(f"textfile directory {self.directory} does not exist")
        merged: dict[str, Metric] = {}
        errors: list[str] = []
        for path in sorted(self.directory.glob("*.prom")):
            try:
                fams = parse_textfile(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                errors.append(f"{path.name}: {exc}")
                continue
            for f in fams:
                have = merged.get(f.name)
                if have is None:
                    merged[f.name] = f
                elif have.type != f.type:
                    errors.append(f"{path.name}: {f.name} is a {f.type} here, a {have.type} elsewhere")
                else:
                    have.samples.extend(f.samples)
        out = list(merged.values())
        if errors:
            raise PartialFailure(out, "; ".join(errors))
        return out


def build(settings: Settings) -> TextfileCollector | None:
    """A textfile collector when ``textfile_dir`` is set, else none."""
    return TextfileCollector(settings.textfile_dir) if settings.textfile_dir is not None else None

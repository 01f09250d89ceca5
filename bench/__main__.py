"""Run benchmarks: `python -m bench` (all) or `python -m bench whatif detect`."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

from bench._report import write_section


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    areas = sorted(m.name[len("bench_"):] for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    chosen = argv or areas
    unknown = [a for a in chosen if a not in areas]
    if unknown:
        print(f"bench: unknown area(s) {unknown}; have {areas}", file=sys.stderr)
        return 2
    for area in chosen:
        mod = importlib.import_module(f"bench.bench_{area}")
        print(f"bench: {area} ...", flush=True)
        body = mod.run()
        write_section(area, mod.TITLE, body)
        print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

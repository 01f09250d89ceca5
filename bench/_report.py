"""Writes one area's section of docs/BENCHMARKS.md between markers, under a file lock."""

from __future__ import annotations

import fcntl
import os
import platform
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "BENCHMARKS.md"
HEADER = (
    "# Benchmarks\n\n"
    "Written by `make bench` (`python -m bench [AREA ...]`). Each section states the machine, the command\n"
    "and the peer it was compared with in the same run. Ratios from one run hold on these noisy 2-core\n"
    "machines; absolute times are indicative only. Tests never assert on these numbers.\n"
)


def machine() -> str:
    """One line describing the machine the figures were taken on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=DOC.parent.parent, check=False).stdout.strip()
    except OSError:
        rev = "?"
    return (f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}, "
            f"commit {rev or '?'}, {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}")


def write_section(area: str, title: str, body: str) -> None:
    """Replace (or append) the section for `area` in docs/BENCHMARKS.md."""
    DOC.parent.mkdir(parents=True, exist_ok=True)
    begin, end = f"<!-- BEGIN {area} -->", f"<!-- END {area} -->"
    block = f"{begin}\n## {title}\n\n_Machine: {machine()}_\n\n{body.strip()}\n{end}"
    with open(DOC.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = DOC.read_text() if DOC.exists() else HEADER
        pat = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
        text = pat.sub(lambda _m: block, text) if pat.search(text) else text.rstrip() + "\n\n" + block + "\n"
        DOC.write_text(text)

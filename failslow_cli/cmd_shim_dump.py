"""`failslow shim-dump`: print every record of every ring in the ring directory as JSON lines."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

from failslow.errors import InputError
from failslow.record import dump_ring, find_rings, read_header, ring_dir

_PID = re.compile(r"failslow-(\d+)")

HELP = "print the records of every failslow ring (shim and torch hook) as JSON lines"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `failslow shim-dump`."""
    p.add_argument("--dir", default=None,
                   help="ring directory (default: $FAILSLOW_SHM_DIR, else /dev/shm)")
    p.add_argument("--pid", type=int, action="append", default=None,
                   help="only the ring of this process (repeatable)")
    p.add_argument("--headers", action="store_true", help="print one JSON object per ring header instead")


def run(args: argparse.Namespace) -> int:
    """Dump the rings; exit 0, or 1 when some ring could not be decoded (reported on stderr)."""
    d = ring_dir(args.dir)
    if not d.is_dir():
        raise InputError(f"ring directory {d} does not exist")
    paths = find_rings(d)
    if args.pid:
        wanted = set(args.pid)
        paths = [p for p in paths if (m := _PID.match(p.name)) and int(m.group(1)) in wanted]
    status = 0
    out = sys.stdout
    for path in paths:
        try:
            if args.headers:
                hdr = read_header(path)
                out.write(json.dumps({"path": str(path), **dataclasses.asdict(hdr),
                                      "clock_name": hdr.clock_name}) + "\n")
                continue
            for rec in dump_ring(path):
                out.write(json.dumps(rec) + "\n")
        except InputError as exc:
            if Path(path).exists():  # a ring removed while we listed is not an error
                print(f"failslow shim-dump: skipping {path}: {exc}", file=sys.stderr)
                status = 1
    out.flush()
    return status

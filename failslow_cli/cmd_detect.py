"""`failslow detect`: change points of a series in a CSV file, or of a Megatron-LM training log (or stdin), as
JSON."""

from __future__ import annotations

import argparse
import gzip
import json
import sys

from failslow.errors import InputError

HELP = "find change points (fail-slows and recoveries) in a CSV series or a Megatron-LM log; prints JSON"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `failslow detect`."""
    p.add_argument("file", metavar="FILE|-",
                   help="CSV with a header, or a Megatron-LM training log (its 'elapsed time per iteration' lines; "
                        "read per sample when the global batch size changes); .gz read as such; '-' reads stdin")
    p.add_argument("--method", choices=["bocd-v", "bocd", "window"], default="bocd-v",
                   help="bocd-v: BOCD + verification (default); bocd: plain BOCD; window: sliding-window median")
    p.add_argument("--column", help="column to analyse (default: 'value', else the only numeric column)")
    p.add_argument("--all-columns", action="store_true", help="analyse every numeric column")


def run(args: argparse.Namespace) -> int:
    """Read, detect, print; bad input raises InputError (exit 2)."""
    from failslow.detect import detect_series
    from failslow.detect.work import looks_like_megatron_log, parse_megatron_log
    from failslow_cli.detect_io import parse_series_csv, result_json

    if args.column is not None and args.all_columns:
        raise InputError("--column and --all-columns are mutually exclusive")
    if args.file == "-":
        text = sys.stdin.read()
    else:
        try:
            opener = gzip.open if args.file.endswith(".gz") else open
            with opener(args.file, "rt", encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError, EOFError) as exc:
            raise InputError(f"cannot read {args.file}: {exc}") from exc
    if looks_like_megatron_log(text):
        if args.column is not None or args.all_columns:
            raise InputError("--column and --all-columns are for CSV input, not a training log")
        log = parse_megatron_log(text)
        name, values = log.series()
        res = result_json(values, detect_series(values, args.method), args.method)
        for cp in res["change_points"]:
            cp["iteration"] = int(log.steps[cp["index"]])
        doc = {"series": name, **res}
    else:
        series = parse_series_csv(text, args.column, args.all_columns)
        out = {name: result_json(v, detect_series(v, args.method), args.method) for name, v in series.items()}
        doc = {"series": out} if args.all_columns else next(iter(out.values()))
    json.dump(doc, sys.stdout, allow_nan=False)
    sys.stdout.write("\n")
    return 0

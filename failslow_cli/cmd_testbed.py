"""`failslow testbed <sub>`: the cluster-in-a-box (run, demo, cleanup, dp-scaling).

Each sub-subcommand is a module with the same HELP / add_arguments / run convention as the top-level
commands; `SUBCOMMANDS` is the one table. A module that is not there yet (dp-scaling belongs to
another area) is left out of the help.
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

HELP = "cluster in a box: real hybrid-parallel training on CPU with fault injection"

SUBCOMMANDS: dict[str, str] = {
    "run": "testbed.cli_run",
    "demo": "testbed.demo",
    "cleanup": "testbed.cli_cleanup",
    "control": "testbed.cli_control",
    "dp-scaling": "testbed.dparch.cli",
}


def _load(modname: str) -> ModuleType | None:
    try:
        return importlib.import_module(modname)
    except ModuleNotFoundError as exc:
        if exc.name is not None and modname.startswith(exc.name):
            return None
        raise


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register one subparser per available sub-subcommand."""
    subs = p.add_subparsers(dest="testbed_cmd", metavar="SUB", required=True)
    for name, modname in SUBCOMMANDS.items():
        mod = _load(modname)
        if mod is None:
            continue
        sp = subs.add_parser(name, help=getattr(mod, "HELP", None), description=getattr(mod, "HELP", None))
        mod.add_arguments(sp)
        sp.set_defaults(_testbed_mod=mod)


def run(args: argparse.Namespace) -> int:
    """Dispatch to the chosen sub-subcommand."""
    return int(args._testbed_mod.run(args) or 0)

"""Entry point of the `failslow` command.

Each subcommand lives in its own module that exposes::

    HELP: str                                   # one line for `failslow --help`
    def add_arguments(p: argparse.ArgumentParser) -> None
    def run(args: argparse.Namespace) -> int     # exit status

Modules are imported only when their subcommand runs, so `failslow detect` does not pay for
torch or the exporter. Subcommand names are stable contracts (see docs/DESIGN.md): add options,
never change meanings. `InputError` anywhere below becomes `failslow: <message>` and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from failslow.errors import InputError

# name -> module implementing it. Keep sorted by area; one line per subcommand.
COMMANDS: dict[str, str] = {
    # tracking
    "shim-dump": "failslow_cli.cmd_shim_dump",
    "period": "failslow_cli.cmd_period",
    "exporter": "failslow_cli.cmd_exporter",
    # detection
    "detect": "failslow_cli.cmd_detect",
    "detector": "failslow_cli.cmd_detector",
    # mitigation
    "remediator": "failslow_cli.cmd_remediator",
    "plan": "failslow_cli.cmd_plan",
    # analysis
    "whatif": "failslow_cli.cmd_whatif",
    "predict": "failslow_cli.cmd_predict",
    # testbed
    "testbed": "failslow_cli.cmd_testbed",
    # the whole loop
    "demo": "failslow_cli.cmd_demo",
}


def _available() -> dict[str, object]:
    found: dict[str, object] = {}
    for name, modname in COMMANDS.items():
        try:
            found[name] = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name != modname:
                raise
    return found


def _usage(mods: dict[str, object]) -> str:
    lines = ["usage: failslow <command> [options]", "", "commands:"]
    for name, mod in mods.items():
        lines.append(f"  {name:<12} {getattr(mod, 'HELP', '')}")
    lines.append("")
    lines.append("Run `failslow <command> --help` for a command's options.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to a subcommand; returns the process exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage(_available()))
        return 0 if args else 2
    name = args[0]
    modname = COMMANDS.get(name)
    mod = None
    if modname is not None:
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name != modname:
                raise
    if mod is None:
        print(f"failslow: unknown command {name!r}\n\n{_usage(_available())}", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog=f"failslow {name}", description=getattr(mod, "HELP", None))
    mod.add_arguments(parser)
    ns = parser.parse_args(args[1:])
    try:
        return int(mod.run(ns) or 0)
    except InputError as exc:
        print(f"failslow {name}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130

"""Framework adapters: one per file behind :class:`remediator.adapters.base.TrainingAdapter`.

Each module defines a class ``Adapter`` with a ``kind`` (its name in the config file) and a constructor
``Adapter(job, labels, options)`` that checks its options (raising ``ConfigError``). The registry below is
the one explicit list; :func:`build` makes the adapter a configured job asks for. Modules are imported only
when a job uses them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from remediator.adapters.base import ConfigError, TrainingAdapter

# kind -> module defining `Adapter`. Keep one line per adapter.
ADAPTERS: dict[str, str] = {
    "testbed": "remediator.adapters.testbed",
    "slurm": "remediator.adapters.slurm",
    "command": "remediator.adapters.command",
    "torchrun": "remediator.adapters.torchrun",
    "fake": "remediator.adapters.fake",
}


def adapter_class(kind: str) -> Any:
    """The adapter class registered as `kind`.

    Raises:
        ConfigError: unknown kind.
    """
    mod = ADAPTERS.get(kind)
    if mod is None:
        raise ConfigError(f"unknown adapter {kind!r} (known: {', '.join(sorted(ADAPTERS))})")
    return importlib.import_module(mod).Adapter


def build(kind: str, job: str, labels: Mapping[str, str], options: Mapping[str, Any]) -> TrainingAdapter:
    """A configured adapter for one job.

    Raises:
        ConfigError: unknown kind or bad options.
    """
    adapter: TrainingAdapter = adapter_class(kind)(job, labels, options)
    return adapter

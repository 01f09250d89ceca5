"""`make test` runs integration tests on three workers, except those marked `testbed`, which run one at a time
with nothing beside them: they time a training job's iterations, and a neighbour's load shifts what they
measure (beside other tests, two of them failed in a trial). A test module that starts a training job must
carry the marker; this finds the ones that start one and forgot it."""

from __future__ import annotations

import re
from pathlib import Path

INTEGRATION = Path(__file__).resolve().parent / "integration"

#: What starts a training job or touches the testbed's namespaces and cgroups: the testbed package, torch,
#: the closed loop, torchrun and the torch hook's job, the `failslow testbed ...` CLI.
STARTS_A_JOB = re.compile(r"^from testbed\b|^import torch\b|\brun_loop\(|torchrun|torchhook_job|\"testbed\",|"
                          r"--torch-hook", re.M)
MARKED = re.compile(r"^pytestmark = .*\bpytest\.mark\.testbed\b", re.M)


def unmarked(modules: dict[str, str]) -> list[str]:
    """The modules (name -> source) that start a training job without the module-wide `testbed` marker."""
    return sorted(name for name, src in modules.items() if STARTS_A_JOB.search(src) and not MARKED.search(src))


def test_every_integration_module_that_starts_a_training_job_is_marked_testbed() -> None:
    modules = {p.name: p.read_text() for p in sorted(INTEGRATION.glob("test_*.py"))}
    assert sum(bool(STARTS_A_JOB.search(s)) for s in modules.values()) >= 10  # the pattern finds them
    assert unmarked(modules) == []


def test_a_module_without_the_marker_is_found() -> None:
    src = (INTEGRATION / "test_testbed_run.py").read_text()
    stripped = src.replace(", pytest.mark.testbed]", "]")
    assert stripped != src
    assert unmarked({"run.py": stripped, "plain.py": "import pytest\npytestmark = pytest.mark.integration\n"}) \
        == ["run.py"]

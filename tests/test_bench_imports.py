"""The benches use the project's public API only: no private name of another package, imported or reached
through a module (``from x import _y``, ``import x as m; m._y``), and nothing from the tests. A bench that
needs a helper the API lacks gets it made public (with its docstring), so a refactor that keeps the public
API keeps the benches running."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[str] = []
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "bench":
                continue
            if node.module.split(".")[0] == "tests":
                out.append(f"{path.name}:{node.lineno}: imports from the tests ({node.module})")
            if any(p.startswith("_") and not p.startswith("__") for p in node.module.split(".")):
                out.append(f"{path.name}:{node.lineno}: private module {node.module}")
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.append(f"{path.name}:{node.lineno}: private name {node.module}.{alias.name}")
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tests":
                    out.append(f"{path.name}:{node.lineno}: imports the tests ({alias.name})")
                modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                and isinstance(node.value, ast.Name) and node.value.id in modules:
            out.append(f"{path.name}:{node.lineno}: private attribute {node.value.id}.{node.attr}")
    return out


def test_benches_use_public_names_only() -> None:
    files = sorted(BENCH.glob("*.py"))
    assert len(files) > 10
    offences = [o for f in files for o in _offences(f)]
    assert offences == []


def test_the_check_sees_what_it_forbids(tmp_path: Path) -> None:
    bad = tmp_path / "bench_bad.py"
    bad.write_text("import failslow.record.torchhook as th\nfrom failslow_cli.stack.alert_path import _x\n"
                   "from tests.integration.detector_stack import FakeJob\nfrom bench._report import write_section\n"
                   "th._hook\n")
    got = _offences(bad)
    assert len(got) == 3, got
    assert any("private name" in o for o in got) and any("private attribute th._hook" in o for o in got)
    assert any("tests" in o for o in got)

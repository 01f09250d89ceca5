"""`failslow testbed` bad input: clear one-line errors and exit status 2, before anything starts.

Most cases call the dispatcher in-process (same code path, no interpreter start-up per case); a
few run the installed `failslow` entry point as a subprocess.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from failslow_cli.main import main as failslow_main


def _run(cmd: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, "testbed", *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("extra, words", [
    (["--inject", "disk:node=1"], "unknown fault kind 'disk'"),
    (["--inject", "cpu:rank=1"], "lacks quota"),
    (["--inject", "cpu:rank=9,quota=0.3"], "rank=9 is out of range"),
    (["--inject", "link:node=4,rate=20mbit"], "node=4 is out of range"),
    (["--inject", "seqlen:dp=2,factor=1.5"], "dp=2 is out of range"),
    (["--ranks-per-node", "3"], "not a whole number of nodes"),
    (["--pp", "8"], "fewer than 8 pipeline stages"),
    (["--tp", "3"], "divisible by tp"),
    (["--micro-batches", "0"], "micro-batches must be >= 1"),
    (["--spare-nodes", "-1"], "spare nodes must be in 0..64"),
    (["--spare-nodes", "1", "--inject", "link:node=5,rate=20mbit"], "node=5 is out of range: the job has 5 nodes"),
    (["--spare-nodes", "1", "--placement", "0,1,2,5"], "placement nodes must be in 0..4"),
    (["--placement", "0,0,1,2"], "more than 1 ranks (ranks per node) on node(s) [0]"),
])
def test_bad_job_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str],
                         words: str) -> None:
    rc = failslow_main(["testbed", "run", "--dp", "2", "--pp", "2", "--iterations", "2",
                        "--report", str(tmp_path / "r.json"), *extra])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert words in err
    assert err.startswith("failslow testbed: ")
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("report, words", [
    ("/nonexistent-dir-failslow/r.json", "does not exist"),
    ("/proc/r.json", "not writable"),
    (".", "is a directory"),
])
def test_unwritable_report_exits_2(capsys: pytest.CaptureFixture[str], report: str, words: str) -> None:
    rc = failslow_main(["testbed", "run", "--dp", "2", "--pp", "2", "--iterations", "2", "--report", report])
    err = capsys.readouterr().err
    assert rc == 2 and words in err, err


def test_bad_trace_extension_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = failslow_main(["testbed", "run", "--dp", "1", "--pp", "1", "--iterations", "1", "--report",
                        str(tmp_path / "r.json"), "--trace", str(tmp_path / "t.xlsx")])
    assert rc == 2 and "extension must be" in capsys.readouterr().err


def test_argparse_errors_exit_2(failslow_cmd: list[str]) -> None:
    p = _run(failslow_cmd, "run", "--dp", "2")  # --iterations/--report missing
    assert p.returncode == 2 and "required" in p.stderr
    for argv in (["testbed", "nosuchsub"], ["testbed"]):
        with pytest.raises(SystemExit) as exc:
            failslow_main(argv)
        assert exc.value.code == 2


def test_help_lists_subcommands(failslow_cmd: list[str]) -> None:
    p = _run(failslow_cmd, "--help")
    assert p.returncode == 0
    for sub in ("run", "demo", "cleanup"):
        assert sub in p.stdout


def test_control_refuses_a_directory_without_a_job(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = failslow_main(["testbed", "control", "--run-dir", str(tmp_path), "status"])
    assert rc == 2 and "not a running testbed" in capsys.readouterr().err


@pytest.mark.parametrize("args, words", [
    (["validate-compute"], "validate-compute needs a value"),
    (["validate-compute", "1,x"], "comma-separated integers"),
    (["validate-links", "0,1", "--suspects", "a"], "comma-separated integers"),
])
def test_control_validate_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str],
                                    words: str) -> None:
    (tmp_path / "requests").mkdir()
    rc = failslow_main(["testbed", "control", "--run-dir", str(tmp_path), *args])
    assert rc == 2 and words in capsys.readouterr().err

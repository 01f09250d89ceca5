"""`failslow testbed dp-scaling`: input checks and the link/all-reduce fits (the real run: tests/integration)."""

from __future__ import annotations

import argparse
import subprocess

import pytest

from failslow.errors import InputError
from testbed.dparch import cli
from testbed.dparch.run import fit_allreduce, fit_link


def test_dp_scaling_bad_input_exits_2(failslow_cmd: list[str]) -> None:
    r = subprocess.run([*failslow_cmd, "testbed", "dp-scaling", "--arch", "mesh"], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 2
    assert "unknown architecture" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--workers", "0"], "worker counts"),
    (["--workers", "1-x"], "bad --workers"),
    (["--rate", "fast"], "bad rate"),
    (["--warmup", "0"], "--warmup"),
    (["--cpu-total", "0"], "--cpu-total"),
])
def test_dp_scaling_validates_before_touching_the_machine(args: list[str], message: str) -> None:
    # In-process (the dispatcher turns InputError into exit 2, tested above): no namespace is created.
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    with pytest.raises(InputError, match=message):
        cli.run(p.parse_args(args))


def test_link_fits_recover_known_parameters() -> None:
    bw, alpha = 20e6, 0.003
    # Round trips: tiny request leg (0.4 ms) + α + s/B for the reply.
    cal = {str(s): [0.0004 if s == 4 else 0.0002 + alpha + s / bw] * 3 for s in (4, 80_000, 160_000, 640_000)}
    fit = fit_link(cal, 25e6)
    assert fit["efficiency"] == pytest.approx(0.8)
    assert fit["latency_s"] == pytest.approx(alpha)
    ar = {str(s): [s / bw + 2 * alpha] for s in (100_000, 200_000, 800_000)}
    fit = fit_allreduce(ar, 25e6)
    assert fit["efficiency"] == pytest.approx(0.8)
    assert fit["latency_s"] == pytest.approx(alpha)

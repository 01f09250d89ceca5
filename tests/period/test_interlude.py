"""Calls of another pattern between iterations (a validation's pings): where the iteration comes back
(`failslow.period.interlude`), and the tracker going on with its period across them."""

from __future__ import annotations

import numpy as np
import pytest

from failslow.period import PeriodTracker
from failslow.period import synth as ps
from failslow.period.interlude import marker_every, resumption

K = np.array([[1, 0], [2, 0], [3, 0], [4, 0]], dtype=np.int64)  # one iteration of 4 calls
X = np.array([[9, 1], [9, 2]], dtype=np.int64)  # calls the iteration never makes


def _keys(*parts: np.ndarray) -> np.ndarray:
    return np.concatenate(parts)


def test_an_interlude_between_two_iterations() -> None:
    keys = _keys(K, np.tile(X, (5, 1)), K, K, K)
    assert resumption(keys, 4) == (14, 0)  # the iteration after the 10 foreign calls; nothing of it before


def test_an_interlude_inside_an_iteration() -> None:
    keys = _keys(K, K[:2], np.tile(X, (3, 1)), K[2:], K, K)
    # the interrupted iteration's first two calls came before it, its last two after
    assert resumption(keys, 4) == (14, 2)


def test_the_marker_every_p_calls_since_a_change_confirms_p() -> None:
    send, recv, allreduce = [7, 0], [8, 0], [1, 0]
    new = np.array([send, recv, allreduce] * 5, dtype=np.int64)  # one micro-batch: 3 calls, the all-reduce last
    m = np.array(allreduce, dtype=np.int64)
    assert marker_every(new, m, 3, repeats=4, lead=9)
    assert not marker_every(new, m, 3, repeats=6, lead=9)  # 5 iterations are not 6
    assert not marker_every(new, m, 1, repeats=4, lead=9)  # a fraction: the all-reduce in one block of three
    assert not marker_every(new, m, 6, repeats=2, lead=9)  # a multiple: twice in every block
    assert not marker_every(new, None, 3, repeats=4, lead=9)  # no once-per-iteration collective before
    # the stretch may start with the rest of an old iteration (the old grid out of phase), up to one old period
    tail = np.array([send, recv, send, recv, recv], dtype=np.int64)
    assert marker_every(np.concatenate((tail, new)), m, 3, repeats=4, lead=9)
    assert not marker_every(np.concatenate((tail, new)), m, 3, repeats=4, lead=5)
    # nor may the marker stop: the last calls hold it
    assert not marker_every(np.concatenate((new, np.array([send, recv] * 3))), m, 3, repeats=4, lead=9)


def test_no_answer_until_two_whole_iterations_followed() -> None:
    assert resumption(_keys(K, X, K, K[:3]), 4) is None
    assert resumption(_keys(K, X, K, K), 4) == (6, 0)


def test_no_interlude_when_the_iteration_went_on_or_only_its_own_calls_came_between() -> None:
    assert resumption(_keys(K, K, K, K), 4) is None  # an alarm from timing: the calls are the same
    assert resumption(_keys(K, K[2:], K, K), 4) is None  # calls lost: the rest of an iteration, then more
    assert resumption(_keys(K, K[1:2], K[1:2], K, K), 4) is None  # a call of its own twice: not foreign


def _with_interlude(at_call: int, n: int, span_s: float, seed: int = 2) -> tuple[ps.SynthTrace, dict[str, np.ndarray]]:
    """Stage 1 of a PP2 job with a DP all-reduce (13 calls per iteration), with `n` foreign pings spread
    over `span_s` inserted before call `at_call` (everything after it later by the span)."""
    tr = ps.generate([ps.pp_1f1b(1, 2, 6, dp_allreduce=True)], [80], seed=seed, jitter=0.02)
    t0 = tr.t_start[at_call - 1] + tr.duration[at_call - 1] + 1e-3
    ping_t = t0 + np.linspace(0.0, span_s, n)
    shift = span_s + 2e-3
    t = np.concatenate((tr.t_start[:at_call], ping_t, tr.t_start[at_call:] + shift))
    cols = {"t": t, "dur": np.concatenate((tr.duration[:at_call], np.full(n, 1e-4), tr.duration[at_call:])),
            "op": np.concatenate((tr.op[:at_call], np.where(np.arange(n) % 2, ps.SEND, ps.RECV), tr.op[at_call:])),
            "comm": np.concatenate((tr.comm[:at_call], np.full(n, 10), tr.comm[at_call:])),
            "nbytes": np.concatenate((tr.nbytes[:at_call], np.full(n, 4096), tr.nbytes[at_call:]))}
    return tr, cols


@pytest.mark.parametrize("inside", [0, 5])
@pytest.mark.parametrize("chunk", [7, 40, 400])
def test_the_tracker_keeps_its_period_across_an_interlude(inside: int, chunk: int) -> None:
    """600 pings in 0.5 s at an iteration boundary (``inside`` 0) or after 5 calls of an iteration: the
    period stays shown, every iteration is reported once, and the pause lands in one of them."""
    p = 13
    at = 40 * p + inside
    tr, c = _with_interlude(at, 600, 0.5)
    tk = PeriodTracker(buffer=8192, window=20)
    got: list[float] = []
    shown: list[bool] = []
    sync = ~np.isin(c["op"], (ps.SEND, ps.RECV))
    for i in range(0, len(c["t"]), chunk):
        s = slice(i, i + chunk)
        v = tk.update(c["t"][s], c["op"][s], c["comm"][s], c["nbytes"][s], t_end=c["t"][s] + c["dur"][s],
                      sync=sync[s])
        got.extend(v.iteration_s.tolist())
        shown.append(v.period == p and v.confidence >= 0.5)
    first = shown.index(True)
    assert all(shown[first:]), (shown.index(False, first), tk.period)
    d = np.asarray(got)
    truth = float(np.median(tr.iteration_s))
    assert 80 - 4 <= len(d) <= 80, len(d)
    # one iteration holds the pause; all others are one true iteration long
    long = np.flatnonzero(d > 1.5 * truth)
    assert len(long) == 1 and d[long[0]] == pytest.approx(truth + 0.5, rel=0.1), np.round(d[long], 3)
    assert np.all(np.abs(np.delete(d, long) / truth - 1) < 0.15)

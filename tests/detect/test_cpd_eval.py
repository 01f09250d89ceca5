"""TCPDBench's F1 and covering, and the default detector on annotated real series (tests/data/tcpd)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from failslow.detect import detect_series
from failslow.detect.cpd_eval import (
    covering,
    f1_score,
    parse_series,
    partition,
    read_series_dir,
    score,
    true_positives,
)
from failslow.errors import InputError

DATA = Path(__file__).resolve().parents[1] / "data" / "tcpd"
PUBLISHED = json.loads((DATA / "published_default.json").read_text())


def test_true_positives_match_each_prediction_once_within_the_margin() -> None:
    # Two annotated points 3 apart need two predictions; a prediction 6 away is outside the margin of 5.
    assert true_positives({10, 13}, {11}, margin=5) == {10}
    assert true_positives({10, 13}, {11, 14}, margin=5) == {10, 13}
    assert true_positives({10}, {16}, margin=5) == set()
    assert true_positives({10}, {15}, margin=5) == {10}


def test_f1_and_cover_by_hand() -> None:
    ann = {"a": [50], "b": []}
    # Predicting the annotated point: precision 2/2 (0 and 50 are both in the union), recall (1 + 1) / 2.
    assert f1_score(ann, [50]) == pytest.approx(1.0)
    # Predicting nothing: P = 1/1, R = (1/2 + 1) / 2 = 0.75, F1 = 2 * 0.75 / 1.75.
    assert f1_score(ann, []) == pytest.approx(1.5 / 1.75)
    # One annotator cut at 50 of 100, the other none; predicting nothing covers the first with
    # (50 * 0.5 + 50 * 0.5) / 100 = 0.5 and the second fully.
    assert covering(ann, [], 100) == pytest.approx(0.75)
    assert covering(ann, [50], 100) == pytest.approx((1.0 + 0.5) / 2)
    assert partition([50, 0, 100, 120], 100) == [(0, 50), (50, 100)]


def test_metrics_reproduce_the_published_scores_of_no_change() -> None:
    # TCPDBench publishes, per series, the scores of the method that reports nothing ("zero"): our metric
    # code must give the same numbers on every stored series.
    series = read_series_dir(DATA)
    assert len(series) >= 15
    zero = score(series, "zero", lambda x: [])
    checked = 0
    for s in series:
        assert zero.f1[s.name] == pytest.approx(PUBLISHED["f1"][s.name]["zero"], abs=1e-9)
        cov = PUBLISHED["cover"][s.name]["zero"]
        if cov is not None:
            assert zero.cover[s.name] == pytest.approx(cov, abs=1e-9)
            checked += 1
    assert checked >= 15


def test_default_detector_beats_published_bocpd_on_the_annotated_series() -> None:
    """`failslow detect`'s defaults on the stored TCPD series: F1 and covering above published default BOCPD
    on the same series and above the issue's whole-benchmark BOCPD figures (0.657, 0.591)."""
    series = read_series_dir(DATA)
    ours = score(series, "bocd-v", lambda x: [c.index for c in detect_series(x, "bocd-v").change_points])
    common = [s.name for s in series if PUBLISHED["f1"][s.name]["bocpd"] is not None
              and PUBLISHED["cover"][s.name]["bocpd"] is not None]
    assert len(common) >= 15
    pub_f1 = float(np.mean([PUBLISHED["f1"][n]["bocpd"] for n in common]))
    pub_cover = float(np.mean([PUBLISHED["cover"][n]["bocpd"] for n in common]))
    our_f1 = float(np.mean([ours.f1[n] for n in common]))
    our_cover = float(np.mean([ours.cover[n] for n in common]))
    assert our_f1 > pub_f1 and our_cover > pub_cover, (our_f1, pub_f1, our_cover, pub_cover)
    assert ours.mean_f1 > 0.657 and ours.mean_cover > 0.591
    # The smoothly growing series that used to get hundreds of change points get none.
    assert ours.n_cps["us_population"] == 0 and ours.n_cps["global_co2"] == 0


@pytest.mark.parametrize("text", ["{", '{"name": "x", "values": [1, 2]}',
                                  '{"name": "x", "values": [1], "annotations": {"a": []}}',
                                  '{"name": "x", "values": [1, 2, 3], "annotations": {"a": [7]}}',
                                  '{"name": "x", "values": [1, 2, 3], "annotations": {}}'])
def test_malformed_series_is_input_error(text: str) -> None:
    with pytest.raises(InputError):
        parse_series(text)


def test_missing_samples_parse_as_nan() -> None:
    s = parse_series('{"name": "x", "values": [1, null, 3], "annotations": {"a": [1]}}')
    assert np.isnan(s.values[1]) and s.n == 3

"""Change-point detection for fail-slows: the protocol, the methods, the event rule and the offline API.

``base`` (the protocol and its verdicts), ``events`` (the fail-slow event rule per series), ``jobs`` (the
per-job event rule on top of a job's series), ``bocd`` (the BOCD core),
``history``/``trend``/``bocdv`` (BOCD+V and plain BOCD), ``window`` (the sliding-window baseline),
``registry`` (methods by name, ``detect_series``). Scoring: ``evaluate`` on labelled ``synthetic`` jobs,
``cpd_eval`` on annotated real series. See docs/detector.md.
"""

from failslow.detect.base import BatchDetector, BatchVerdict, ChangePoint, Stream, Verdict
from failslow.detect.bocd import BOCD, BOCDConfig
from failslow.detect.bocdv import PlainBOCD, VerifiedBOCD, plain_changes, verified_changes
from failslow.detect.events import RECOVER_SHARE, SETTLE, EventTracker
from failslow.detect.jobs import JobChange, JobEvent, job_events_step
from failslow.detect.registry import (
    METHODS,
    OFFLINE,
    SeriesResult,
    detect_matrix,
    detect_series,
    keep_series,
    make_detector,
    select_state,
)
from failslow.detect.trend import VerifyConfig
from failslow.detect.window import WindowMedian, window_changes

__all__ = [
    "BOCD", "METHODS", "OFFLINE", "RECOVER_SHARE", "SETTLE", "BOCDConfig", "BatchDetector", "BatchVerdict",
    "ChangePoint", "EventTracker", "JobChange", "JobEvent", "PlainBOCD", "SeriesResult", "Stream", "Verdict",
    "VerifiedBOCD", "VerifyConfig", "WindowMedian", "detect_matrix", "detect_series", "job_events_step",
    "keep_series", "make_detector", "plain_changes", "select_state", "verified_changes", "window_changes",
]

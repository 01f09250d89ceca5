"""The command adapter against real commands (scripts written here) and a real HTTP server (http.server)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from failslow.record import process_alive
from failslow_cli.stack.processes import free_port
from remediator.adapters import build
from remediator.adapters.base import ActionRequest, AdapterError, ConfigError, TrainingAdapter
from remediator.adapters.command import Adapter, as_text, outcome_from_answer, parse_answer, parse_info

JOB = "pt-7"
LABELS = {"namespace": "ml", "alertname": "FailSlowDetected"}


def script(tmp_path: Path, name: str, body: str, *, shell: bool = False) -> str:
    """Write an executable script (Python by default, else /bin/sh) and return its path."""
    path = tmp_path / name
    head = "#!/bin/sh\n" if shell else f"#!{sys.executable}\nimport json, os, sys, time\n"
    path.write_text(head + body)
    path.chmod(0o755)
    return str(path)


# A target that records how it was called (argv and FAILSLOW_* environment) and prints what $ANSWER holds.
RECORDER = """
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:],
                        "env": {k: v for k, v in os.environ.items() if k.startswith("FAILSLOW_")}}) + "\\n")
print("working on it")  # a log line before the answer: the adapter reads the last line
print(os.environ.get("ANSWER", ""))
"""


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def request(strategy: str = "rebalance", params: dict[str, Any] | None = None, aid: str = "act-1",
            reason: str = "rank 3 slow; do not; rm -rf /") -> ActionRequest:
    return ActionRequest(aid, JOB, strategy, params if params is not None else {"counts": [3, 4, 5], "from": [4, 4, 4]},
                         reason, LABELS)


# ---------------------------------------------------------------------------------------------- commands
def test_command_gets_rendered_argv_and_env_and_its_json_answer_becomes_the_outcome(tmp_path: Path) -> None:
    rec = tmp_path / "calls.jsonl"
    target = script(tmp_path, "launcherctl", RECORDER)
    answer = {"pause_s": 0.5, "iterations_lost": 0, "result": {"from_iteration": 12}, "detail": "split applied"}
    ad = Adapter(JOB, LABELS, {
        "env": {"RECORD": str(rec), "ANSWER": json.dumps(answer)},
        "rebalance": {"command": [target, "set", "--job={job}", "--ns={namespace}", "--counts={counts}",
                                  "--from={from}", "--id={action}", "{reason}", "{params_json}", "{strategy}"]},
    })
    assert isinstance(ad, TrainingAdapter) and ad.capabilities() == {"rebalance"}
    out = ad.execute(request())
    assert out.ok and out.detail == "split applied"
    assert out.result == {"from_iteration": 12} and out.pause_s == 0.5 and out.iterations_lost == 0
    (call,) = records(rec)
    # no shell: the reason with ";" and spaces is one argument, and nothing ran it
    assert call["argv"] == ["set", "--job=pt-7", "--ns=ml", "--counts=3,4,5", "--from=4,4,4", "--id=act-1",
                            "rank 3 slow; do not; rm -rf /", '{"counts": [3, 4, 5], "from": [4, 4, 4]}', "rebalance"]
    assert call["env"] == {"FAILSLOW_ACTION_ID": "act-1", "FAILSLOW_JOB": "pt-7", "FAILSLOW_STRATEGY": "rebalance",
                           "FAILSLOW_PARAMS": '{"counts": [3, 4, 5], "from": [4, 4, 4]}',
                           "FAILSLOW_REASON": "rank 3 slow; do not; rm -rf /"}


def test_every_strategy_gets_its_params_as_fields(tmp_path: Path) -> None:
    rec = tmp_path / "calls.jsonl"
    target = script(tmp_path, "t", RECORDER)
    ad = Adapter(JOB, LABELS, {
        "env": {"RECORD": str(rec)},
        "validate": {"command": [target, "{ranks}", "{nodes}"]},
        "topology": {"command": [target, "{placement}"]},
        "restart": {"command": [target, "{exclude_nodes}", "{exclude_ranks}"]},
    })
    assert ad.capabilities() == {"validate", "topology", "restart"}
    ad.execute(request("validate", {"ranks": [3, 5], "nodes": ["n1"]}))
    ad.execute(request("topology", {"placement": [0, 0, 1, 2]}))
    ad.execute(request("restart", {"exclude_nodes": ["n1", "n2"]}))  # exclude_ranks left out: empty
    assert [r["argv"] for r in records(rec)] == [["3,5", "n1"], ["0,0,1,2"], ["n1,n2", ""]]


def test_validate_answer_goes_into_the_result(tmp_path: Path) -> None:
    target = script(tmp_path, "gemm-check",
                    'print(json.dumps({"confirmed": True, "ranks": [3], "nodes": ["n1"], "pause_s": 4}))\n')
    ad = Adapter(JOB, LABELS, {"validate": {"command": [target, "{ranks}"]}})
    out = ad.execute(request("validate", {"ranks": [3, 4], "nodes": ["n1"]}))
    assert out.ok and out.result == {"confirmed": True, "ranks": [3], "nodes": ["n1"]} and out.pause_s == 4.0


def test_plain_output_is_a_plain_success_and_ok_false_is_a_failed_outcome(tmp_path: Path) -> None:
    plain = script(tmp_path, "plain.sh", "echo restarted job \"$FAILSLOW_JOB\"\n", shell=True)
    refused = script(tmp_path, "refused", 'print(json.dumps({"ok": False, "detail": "job is checkpointing"}))\n')
    ad = Adapter(JOB, LABELS, {"restart": {"command": [plain]}, "topology": {"command": [refused]}})
    out = ad.execute(request("restart", {"exclude_nodes": ["n1"]}))
    assert out.ok and "exit 0" in out.detail and out.result == {} and out.pause_s is None
    out = ad.execute(request("topology", {"placement": [0, 1]}))
    assert not out.ok and out.detail == "job is checkpointing"


def test_ill_typed_answer_fields_are_ignored_and_named(tmp_path: Path) -> None:
    target = script(tmp_path, "t", 'print(json.dumps({"pause_s": "soon", "iterations_lost": 2.5, "result": [1]}))\n')
    out = Adapter(JOB, LABELS, {"rebalance": {"command": [target]}}).execute(request())
    assert out.ok and out.pause_s is None and out.iterations_lost is None and out.result == {}
    assert "pause_s" in out.detail and "iterations_lost" in out.detail and "result" in out.detail


def test_non_zero_exit_is_a_permanent_error_with_the_stderr_tail(tmp_path: Path) -> None:
    target = script(tmp_path, "t", 'print("log line")\nprint("error: job pt-7 not found", file=sys.stderr)\n'
                                   "sys.exit(2)\n")
    ad = Adapter(JOB, LABELS, {"restart": {"command": [target]}})
    with pytest.raises(AdapterError, match="exit 2: error: job pt-7 not found") as exc:
        ad.execute(request("restart", {"exclude_nodes": ["n1"]}))
    assert exc.value.transient is False


def test_timeout_is_transient_and_kills_what_the_command_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    target = script(tmp_path, "hang.sh", f"sleep 60 &\necho $! > {pid_file}\nwait\n", shell=True)
    ad = Adapter(JOB, LABELS, {"timeout_s": 60, "restart": {"command": [target], "timeout_s": 1}})
    t0 = time.monotonic()
    with pytest.raises(AdapterError, match="did not finish within 1 s") as exc:
        ad.execute(request("restart", {"exclude_nodes": ["n1"]}))
    assert exc.value.transient is True and time.monotonic() - t0 < 20
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while process_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(child), "the command's child outlived the timeout"


def test_a_strategy_not_configured_is_not_attempted(tmp_path: Path) -> None:
    ad = Adapter(JOB, LABELS, {"rebalance": {"command": [script(tmp_path, "t", "")]}})
    with pytest.raises(AdapterError, match="no restart call"):
        ad.execute(request("restart", {"exclude_nodes": ["n1"]}))


def test_info_from_a_command(tmp_path: Path) -> None:
    doc = {"layout": {"dp": 2, "pp": 2, "tp": 1, "ranks_per_node": 2}, "placement": [0, 0, 1, 1],
           "nodes": ["n0", "n1"], "spare_nodes": ["n9"], "microbatches": [4, 4], "pod": "pt-7-0",
           "costs": {"restart": 300, "rebalance": 1.5}}
    target = script(tmp_path, "describe", f"assert sys.argv[1:] == ['pt-7', 'ml']\nprint({json.dumps(doc)!r})\n")
    info = Adapter(JOB, LABELS, {"info": {"command": [target, "{job}", "{namespace}"]}}).info()
    assert info.layout == {"dp": 2, "pp": 2, "tp": 1, "ranks_per_node": 2} and info.placement == [0, 0, 1, 1]
    assert info.nodes == ["n0", "n1"] and info.spare_nodes == ["n9"] and info.microbatches == [4, 4]
    assert info.extra == {"pod": "pt-7-0"} and info.costs == {"restart": 300.0, "rebalance": 1.5}


def test_info_errors_and_absence(tmp_path: Path) -> None:
    bad = script(tmp_path, "bad", 'print(json.dumps({"placement": ["n0"]}))\n')
    with pytest.raises(AdapterError, match="placement"):
        Adapter(JOB, LABELS, {"info": {"command": [bad]}}).info()
    silent = script(tmp_path, "silent", "")
    with pytest.raises(AdapterError, match="no JSON object"):
        Adapter(JOB, LABELS, {"info": {"command": [silent]}}).info()
    failing = script(tmp_path, "failing", "sys.exit(1)\n")
    with pytest.raises(AdapterError, match="exit 1"):
        Adapter(JOB, LABELS, {"info": {"command": [failing]}}).info()
    unknown = Adapter(JOB, LABELS, {"rebalance": {"command": [silent]}}).info()
    assert unknown.layout is None and unknown.nodes == [] and unknown.microbatches is None
    assert unknown.spare_nodes is None  # not said: unknown, not "none free"
    none_free = script(tmp_path, "none_free", 'print(json.dumps({"nodes": ["n0"], "spare_nodes": []}))\n')
    assert Adapter(JOB, LABELS, {"info": {"command": [none_free]}}).info().spare_nodes == []


def test_recover_asks_about_the_action_and_never_runs_it_again(tmp_path: Path) -> None:
    rec = tmp_path / "calls.jsonl"
    done = tmp_path / "done.json"
    done.write_text(json.dumps({"act-1": {"ok": True, "detail": "restarted", "pause_s": 40, "iterations_lost": 7}}))
    action = script(tmp_path, "restart", RECORDER)
    ask = script(tmp_path, "ask", f"""
answers = json.load(open({str(done)!r}))
if sys.argv[1] not in answers:
    print("no request " + sys.argv[1], file=sys.stderr)
    sys.exit(3)
print(json.dumps(answers[sys.argv[1]]))
""")
    ad = Adapter(JOB, LABELS, {"env": {"RECORD": str(rec)},
                               "restart": {"command": [action], "recover": {"command": [ask, "{action}"]}},
                               "rebalance": {"command": [action]}})
    out = ad.recover(request("restart", {"exclude_nodes": ["n1"]}, aid="act-1"))
    assert out is not None and out.ok and out.detail == "restarted" and out.pause_s == 40 and out.iterations_lost == 7
    assert ad.recover(request("restart", {"exclude_nodes": ["n1"]}, aid="act-2")) is None  # exit 3: unknown
    assert ad.recover(request("rebalance", aid="act-1")) is None  # no recover call configured
    assert records(rec) == []


def test_recover_failure_is_an_error_not_an_answer(tmp_path: Path) -> None:
    broken = script(tmp_path, "broken", 'print("cannot reach the launcher", file=sys.stderr)\nsys.exit(1)\n')
    ad = Adapter(JOB, LABELS, {"restart": {"command": [broken], "recover": {"command": [broken]}}})
    with pytest.raises(AdapterError, match="cannot reach the launcher"):
        ad.recover(request("restart", {"exclude_nodes": []}))


# ---------------------------------------------------------------------------------------------- HTTP
@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Launcher:
    """A real HTTP server standing in for an in-house launcher: answers per (method, path), records calls."""

    url: str
    routes: dict[tuple[str, str], tuple[int, Any, float]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def route(self, method: str, path: str, status: int, answer: Any = "", delay_s: float = 0.0) -> None:
        self.routes[(method, path)] = (status, answer, delay_s)


@pytest.fixture
def launcher() -> Iterator[Launcher]:
    state = Launcher("")

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            state.seen.append(Seen(self.command, self.path, dict(self.headers.items()),
                                   json.loads(raw) if raw else None))
            status, answer, delay = state.routes.get((self.command, self.path), (404, "no such route", 0.0))
            if delay:
                time.sleep(delay)
            data = (answer if isinstance(answer, str) else json.dumps(answer)).encode()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a client that timed out
                self.send_response(status)
                if status in (301, 302, 307):
                    self.send_header("Location", "/login")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any

        def log_message(self, *_a: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def test_http_call_renders_url_headers_and_a_typed_json_body(launcher: Launcher, tmp_path: Path) -> None:
    token = tmp_path / "launcher.token"
    token.write_text("s3cret\n")
    launcher.route("POST", "/jobs/ml/a%2Fb%3Fc/restart", 202,
                   {"pause_s": 12.5, "iterations_lost": 30, "result": {"requeued_as": "pt-7-r2"}})
    labels = {"namespace": "ml"}
    ad = Adapter("a/b?c", labels, {"restart": {"http": {
        "url": launcher.url + "/jobs/{namespace}/{job}/restart",
        "headers": {"X-Job": "{job}", "X-Why": "failslow {action}"},
        "bearer_token_file": str(token),
        "body": {"request_id": "{action}", "exclude": "{exclude_nodes}", "ranks": "{exclude_ranks}",
                 "text": "nodes {exclude_nodes}", "all": "{params_json}", "job": "{job}", "fixed": [1, True, None]},
    }}})
    req = ActionRequest("act-9", "a/b?c", "restart", {"exclude_nodes": ["n1", "n2"], "exclude_ranks": [6, 7]},
                        "slow", labels)
    out = ad.execute(req)
    assert out.ok and out.pause_s == 12.5 and out.iterations_lost == 30 and out.result == {"requeued_as": "pt-7-r2"}
    (seen,) = launcher.seen
    assert seen.method == "POST" and seen.path == "/jobs/ml/a%2Fb%3Fc/restart"  # the job name cannot reshape it
    assert seen.headers["Authorization"] == "Bearer s3cret" and seen.headers["Idempotency-Key"] == "act-9"
    assert seen.headers["X-Job"] == "a/b?c" and seen.headers["X-Why"] == "failslow act-9"
    assert seen.headers["Content-Type"] == "application/json"
    assert seen.body == {"request_id": "act-9", "exclude": ["n1", "n2"], "ranks": [6, 7], "text": "nodes n1,n2",
                         "all": {"exclude_nodes": ["n1", "n2"], "exclude_ranks": [6, 7]}, "job": "a/b?c",
                         "fixed": [1, True, None]}


def test_http_default_body_and_method(launcher: Launcher) -> None:
    launcher.route("POST", "/rebalance", 200, "")
    ad = Adapter(JOB, LABELS, {"rebalance": {"http": {"url": launcher.url + "/rebalance"}}})
    out = ad.execute(request())
    assert out.ok and "HTTP 200" in out.detail
    assert launcher.seen[0].body == {"job": JOB, "labels": LABELS, "action": "act-1", "strategy": "rebalance",
                                     "params": {"counts": [3, 4, 5], "from": [4, 4, 4]},
                                     "reason": "rank 3 slow; do not; rm -rf /"}


@pytest.mark.parametrize("status, transient, words", [
    (500, True, "HTTP 500: database locked"),
    (503, True, "HTTP 503"),
    (429, True, "HTTP 429"),
    (404, False, "HTTP 404: database locked"),
    (409, False, "HTTP 409"),
    (302, False, "redirect to /login not followed"),
])
def test_http_errors_are_transient_or_permanent(launcher: Launcher, status: int, transient: bool,
                                                words: str) -> None:
    launcher.route("POST", "/restart", status, "database locked")
    ad = Adapter(JOB, LABELS, {"restart": {"http": {"url": launcher.url + "/restart"}}})
    with pytest.raises(AdapterError, match=words) as exc:
        ad.execute(request("restart", {"exclude_nodes": ["n1"]}))
    assert exc.value.transient is transient


def test_http_timeout_and_refused_connection_are_transient(launcher: Launcher) -> None:
    launcher.route("POST", "/slow", 200, "{}", delay_s=3.0)
    ad = Adapter(JOB, LABELS, {"restart": {"http": {"url": launcher.url + "/slow"}, "timeout_s": 0.5}})
    with pytest.raises(AdapterError, match=r"no answer within 0\.5 s") as exc:
        ad.execute(request("restart", {"exclude_nodes": ["n1"]}))
    assert exc.value.transient is True
    port = free_port()  # a port nothing listens on any more
    ad = Adapter(JOB, LABELS, {"restart": {"http": {"url": f"http://127.0.0.1:{port}/restart"}}})
    with pytest.raises(AdapterError, match="ConnectionError") as exc:
        ad.execute(request("restart", {"exclude_nodes": ["n1"]}))
    assert exc.value.transient is True


def test_http_info_and_recover(launcher: Launcher) -> None:
    launcher.route("GET", "/jobs/pt-7", 200, {"layout": {"dp": 2, "pp": 1, "tp": None}, "microbatches": [8, 8]})
    launcher.route("GET", "/requests/act-1", 200, {"ok": False, "detail": "restart failed: no spare"})
    ad = Adapter(JOB, LABELS, {
        "info": {"http": {"url": launcher.url + "/jobs/{job}"}},
        "restart": {"http": {"url": launcher.url + "/restart"},
                    "recover": {"http": {"url": launcher.url + "/requests/{action}"}}},
    })
    info = ad.info()
    assert info.layout == {"dp": 2, "pp": 1, "tp": None} and info.microbatches == [8, 8]
    out = ad.recover(request("restart", {"exclude_nodes": ["n1"]}, aid="act-1"))
    assert out is not None and not out.ok and out.detail == "restart failed: no spare"
    assert ad.recover(request("restart", {"exclude_nodes": ["n1"]}, aid="act-2")) is None  # 404: unknown
    assert [(s.method, s.path) for s in launcher.seen] == [("GET", "/jobs/pt-7"), ("GET", "/requests/act-1"),
                                                           ("GET", "/requests/act-2")]
    assert all(s.body is None for s in launcher.seen)


# ---------------------------------------------------------------------------------------------- config
def test_the_registry_builds_it(tmp_path: Path) -> None:
    ad = build("command", JOB, LABELS, {"restart": {"command": [script(tmp_path, "t", "")]}})
    assert ad.kind == "command" and ad.capabilities() == {"restart"}


def test_commands_are_found_on_path(tmp_path: Path) -> None:
    ad = Adapter(JOB, LABELS, {"validate": {"command": ["true"]}})
    assert ad.execute(request("validate", {"ranks": [1]})).ok
    script(tmp_path, "mylauncher", 'print("{}")\n')
    with pytest.raises(ConfigError, match="no executable 'mylauncher' on PATH"):
        Adapter(JOB, LABELS, {"validate": {"command": ["mylauncher"]}})
    ad = Adapter(JOB, LABELS, {"env": {"PATH": f"{tmp_path}:{os.environ['PATH']}"},
                               "validate": {"command": ["mylauncher"]}})
    assert ad.execute(request("validate", {"ranks": [1]})).ok


@pytest.mark.parametrize("options, words", [
    ({}, "nothing configured"),
    ({"reboot": {"command": ["true"]}}, "unknown options"),
    ({"restart": ["true"]}, "restart must be a mapping"),
    ({"restart": {"command": ["true"], "http": {"url": "http://x"}}}, "restart: give exactly one"),
    ({"restart": {"timeout_s": 3}}, "restart: give exactly one"),
    ({"restart": {"command": ["true"], "retries": 3}}, r"restart: unknown keys \['retries'\]"),
    ({"restart": {"command": "kubectl delete pod"}}, "non-empty list of strings"),
    ({"restart": {"command": []}}, "non-empty list of strings"),
    ({"restart": {"command": ["/nonexistent/launcherctl"]}}, "no executable '/nonexistent/launcherctl'"),
    ({"restart": {"command": ["true", "{bogus}"]}}, r"restart.command\[1\].*no value for \{bogus\}"),
    ({"restart": {"command": ["true", "{counts}"]}}, r"restart.command\[1\].*\{counts\}"),
    ({"rebalance": {"command": ["true", "{exclude_nodes}"]}}, r"rebalance.command\[1\].*\{exclude_nodes\}"),
    ({"info": {"command": ["true", "{action}"]}}, r"info.command\[1\].*\{action\}"),
    ({"restart": {"command": ["true", "{job.__class__}"]}}, "only plain fields"),
    ({"restart": {"command": ["true", "{job!r}"]}}, "only plain fields"),
    ({"restart": {"command": ["true", "{job"]}}, "template"),
    ({"restart": {"command": ["true"], "recover": {"command": ["true", "{nope}"]}}},
     r"restart.recover.command\[1\]"),
    ({"restart": {"command": ["true"], "recover": {"shell": "x"}}}, "restart.recover: unknown keys"),
    ({"restart": {"command": ["true"], "timeout_s": 0}}, "timeout_s must be > 0"),
    ({"timeout_s": True, "restart": {"command": ["true"]}}, "boolean"),
    ({"env": {"A": 1}, "restart": {"command": ["true"]}}, "env must map strings to strings"),
    ({"restart": {"http": "http://x"}}, "restart.http must be a mapping"),
    ({"restart": {"http": {"url": "ftp://x"}}}, r"restart.http.url must be a string starting with http"),
    ({"restart": {"http": {"url": "http://x/{jobb}"}}}, r"restart.http.url.*\{jobb\}"),
    ({"restart": {"http": {"url": "http://x", "method": "FETCH"}}}, "method must be one of"),
    ({"restart": {"http": {"url": "http://x", "method": "GET", "body": {}}}}, "GET request carries no body"),
    ({"restart": {"http": {"url": "http://x", "headers": {"X Y": "1"}}}}, "not a header name"),
    ({"restart": {"http": {"url": "http://x", "headers": {"X-A": "{who}"}}}}, r"restart.http.headers.X-A"),
    ({"restart": {"http": {"url": "http://x", "body": {"a": ["{who}"]}}}}, r"restart.http.body.a\[0\]"),
    ({"restart": {"http": {"url": "http://x", "body": {"a": {1, 2}}}}}, "not a JSON value"),
    ({"restart": {"http": {"url": "http://x", "bearer_token_file": "/nonexistent/t"}}}, "bearer_token_file"),
    ({"restart": {"http": {"url": "http://x", "ca_file": "/nonexistent/ca.pem"}}}, "ca_file"),
    ({"restart": {"http": {"url": "http://x", "verify": False}}}, r"restart.http: unknown keys \['verify'\]"),
])
def test_bad_options_are_refused_with_where(options: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        Adapter(JOB, LABELS, options)


def test_labels_are_fields_and_missing_ones_are_refused_at_load() -> None:
    ad = Adapter(JOB, {"namespace": "ml"}, {"restart": {"command": ["true", "{namespace}"]}})
    assert ad.capabilities() == {"restart"}
    with pytest.raises(ConfigError, match=r"no value for \{namespace\}"):
        Adapter(JOB, {}, {"restart": {"command": ["true", "{namespace}"]}})


# ---------------------------------------------------------------------------------------------- pure parts
def test_parse_answer() -> None:
    assert parse_answer('{"a": 1}') == {"a": 1}
    assert parse_answer('starting\n\n{"a": 1}\n') == {"a": 1}
    assert parse_answer('{\n "a": 1\n}') == {"a": 1}
    assert parse_answer("done") is None and parse_answer("") is None and parse_answer("[1, 2]") is None


def test_as_text_and_outcomes() -> None:
    assert as_text([3, 4]) == "3,4" and as_text(None) == "" and as_text(True) == "true"
    assert as_text({"b": 1, "a": [2]}) == '{"a": [2], "b": 1}' and as_text(2.5) == "2.5"
    out = outcome_from_answer({"confirmed": "yes", "ranks": [1, "2"]}, "validate", "d")
    assert out.ok and out.result == {} and "confirmed" in out.detail and "ranks" in out.detail
    out = outcome_from_answer({"confirmed": False, "nodes": []}, "validate", "d")
    assert out.result == {"confirmed": False, "nodes": []} and out.detail == "d"
    assert outcome_from_answer({"confirmed": True}, "restart", "d").result == {}  # validate's only
    info = parse_info({"extra": {"a": 1}, "b": 2})
    assert info.extra == {"a": 1, "b": 2} and info.placement is None
    with pytest.raises(AdapterError, match="layout"):
        parse_info({"layout": {"dp": "2"}})
    assert parse_info({}).costs == {} and parse_info({"costs": {"validate": 0}}).costs == {"validate": 0.0}
    for bad in ({"reboot": 5}, {"restart": -1}, {"restart": "5"}, {"restart": True}, {"restart": float("nan")},
                {"restart": float("inf")}, [300]):
        with pytest.raises(AdapterError, match="costs must map strategies"):
            parse_info({"costs": bad})

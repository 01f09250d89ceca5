"""The command adapter: acts on any training job through operator commands or HTTP calls that the config names.

For everything that has no adapter of its own (a Kubernetes operator, an in-house launcher, a script): for
each strategy the config gives either a **command** (an argv template, run without a shell) or an **HTTP
call** (method, URL template, headers, JSON body template). The strategies configured are the adapter's
capabilities; nothing else is ever attempted.

```yaml
jobs:
  - match: "pt-.*"
    adapter: command
    options:
      timeout_s: 120                       # default limit of every call (300)
      env: {KUBECONFIG: /etc/failslow/kubeconfig}   # more environment for the commands
      info:                                # optional: the job's shape as JSON (see below)
        command: ["launcherctl", "describe", "{job}", "--json"]
      rebalance:
        command: ["launcherctl", "set-microbatches", "{job}", "--counts={counts}", "--request-id={action}"]
        timeout_s: 30                      # this call's own limit
        recover:                           # optional: what became of an action after a remediator crash
          command: ["launcherctl", "request", "{action}", "--json"]
      restart:
        http:
          url: "https://launcher.example/jobs/{namespace}/{job}/restart"
          method: POST                     # default POST; GET for info and recover
          headers: {X-Requested-By: failslow}
          bearer_token_file: /etc/failslow/launcher.token   # read at every call (rotation works)
          ca_file: /etc/failslow/launcher-ca.pem            # optional CA bundle for https
          body: {"request_id": "{action}", "exclude": "{exclude_nodes}", "why": "failslow: {reason}"}
        recover:
          http: {url: "https://launcher.example/requests/{action}"}
```

Template fields:

* ``{job}`` and every label of the job's alert (``{namespace}`` above);
* ``{action}`` — the action id: pass it, so that the target can be idempotent and ``recover`` can ask about
  it — plus ``{strategy}``, ``{reason}`` and ``{params_json}`` (the whole params object as JSON);
* the strategy's params: validate ``{ranks}`` ``{nodes}``; rebalance ``{counts}`` ``{from}``; topology
  ``{placement}``; restart ``{exclude_nodes}`` ``{exclude_ranks}``. Lists are comma-joined (``3,4,5``),
  a param the planner left out is empty.

``info`` templates know only ``{job}`` and the labels. A field a call cannot have is refused when the config
loads (``ConfigError`` naming where), not when the job is already slow. Values put into a URL are
percent-encoded. In a JSON body, a string that is exactly one field (``"{counts}"``) becomes the field's
JSON value (``[3, 4, 5]``; the params object for ``{params_json}``); elsewhere fields are text. Without a
``body``, a POST/PUT/PATCH sends ``{"action", "job", "strategy", "params", "reason", "labels"}``; strategy
calls carry the action id as ``Idempotency-Key`` header too.

Commands run with stdin from /dev/null, in their own process group (killed whole on timeout), with the
remediator's environment, ``env``, and ``FAILSLOW_ACTION_ID``, ``FAILSLOW_JOB``, ``FAILSLOW_STRATEGY``,
``FAILSLOW_PARAMS`` (JSON) and ``FAILSLOW_REASON``.

Answers:

* exit 0 / HTTP 2xx: done. The output (stdout or the response body, the whole of it or its last line) may be
  a JSON object with ``ok`` (default true), ``detail``, ``result`` (object), ``pause_s``,
  ``iterations_lost`` and, for validate, ``confirmed``, ``ranks`` and ``nodes`` (which go into the
  outcome's ``result``, where the planner reads them). Ill-typed fields are ignored and named in the
  detail: the action did happen, and failing it would make the remediator believe otherwise.
* a non-zero exit, HTTP 3xx (redirects are not followed: a POST turned into a GET would "succeed") or 4xx:
  a permanent :class:`AdapterError` with the tail of stderr / the body;
* a timeout, HTTP 5xx, 408 or 429, a refused or dropped connection: a transient one.

``info`` answers a JSON object with any of ``layout`` (``{"dp", "pp", "tp", "ranks_per_node"}``),
``placement`` (node index per rank), ``nodes``, ``spare_nodes``, ``microbatches``, ``costs`` (strategy ->
seconds: what the launcher expects each action to cost the job, e.g. its last restart's pause; the planner
uses it until it measured the strategy itself) and ``extra``; other keys go to ``extra``. Without ``info``
every field is unknown. A strategy's ``recover`` call is asked about one action id after a remediator crash
and answers its outcome as above (exit 0 / 2xx, ``ok`` default true); exit 3 or HTTP 404 means "never heard
of it" (the outcome is unknown: :meth:`Adapter.recover` returns None). It is never a retry: the adapter does
not run the action again.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote, urlsplit

import requests

from remediator.adapters.base import (
    STRATEGY_NAMES,
    ActionOutcome,
    ActionRequest,
    AdapterError,
    ConfigError,
    JobInfo,
    option,
    render,
    strategy_costs,
)

OPTIONS = frozenset({"timeout_s", "env", "info", *STRATEGY_NAMES})
CALL_KEYS = frozenset({"command", "http", "timeout_s"})
HTTP_KEYS = frozenset({"url", "method", "headers", "body", "bearer_token_file", "ca_file"})
METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
# Parameters each strategy's templates may name (base.py lists what the planner sends; rebalance also
# carries the split it replaces as "from").
PARAM_FIELDS: dict[str, tuple[str, ...]] = {
    "validate": ("ranks", "nodes"),
    "rebalance": ("counts", "from"),
    "topology": ("placement",),
    "restart": ("exclude_nodes", "exclude_ranks"),
}
ACTION_FIELDS = ("action", "strategy", "reason", "params_json")
UNKNOWN_EXIT = 3  # a recover command's "no such action"
TRANSIENT_STATUS = frozenset({408, 429})  # "not now" answers among the 4xx
TAIL = 400  # characters of stderr / a response body quoted in an error
DEFAULT_TIMEOUT_S = 300.0
_ONE_FIELD = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_]*)\}$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_NO_BODY = object()


@dataclass(frozen=True)
class HttpSpec:
    """One configured HTTP call (templates unrendered)."""

    url: str
    method: str
    headers: dict[str, str]
    body: Any
    bearer_token_file: Path | None
    ca_file: str | None


@dataclass(frozen=True)
class Call:
    """One configured call: a command or an HTTP request, and its time limit.

    Attributes:
        where: Its place in the options (``rebalance``, ``restart.recover``), for messages.
        timeout_s: Limit of one call.
        command: The argv template, or None.
        http: The HTTP call, or None.
        idempotency_key: Whether the action id goes into an ``Idempotency-Key`` header (strategy calls).
    """

    where: str
    timeout_s: float
    command: tuple[str, ...] | None = None
    http: HttpSpec | None = None
    idempotency_key: bool = False


@dataclass(frozen=True)
class Reply:
    """What a call answered: ``code`` is the exit status or the HTTP status; ``what`` names the call."""

    code: int
    out: str
    err: str
    what: str
    ok: bool
    unknown: bool = False


@dataclass
class _Fields:
    """The template values of one call: as text (argv, URL, headers) and as JSON values (bodies)."""

    labels: dict[str, str]
    raw: dict[str, Any] = field(default_factory=dict)

    def text(self) -> dict[str, str]:
        return {k: as_text(v) for k, v in self.raw.items()}


def as_text(value: Any) -> str:
    """A template value as text: lists comma-joined, None empty, booleans lower case, objects as JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(as_text(v) for v in value)
    if isinstance(value, Mapping):
        return json.dumps(value, sort_keys=True)
    return str(value)


def tail(text: str, limit: int = TAIL) -> str:
    """The last `limit` characters of `text` on one line (what an error message quotes)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else "…" + text[-limit:]


def parse_answer(text: str) -> dict[str, Any] | None:
    """The JSON object a command printed or a server answered: the whole text, else its last non-empty line
    (commands often log before they print their result); None when neither is a JSON object."""
    text = text.strip()
    if not text:
        return None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for candidate in (text, lines[-1]):
        try:
            doc = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(doc, dict):
            return doc
    return None


def _number(doc: Mapping[str, Any], key: str, ignored: list[str]) -> float | None:
    v = doc.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
        ignored.append(f"{key} (not a number >= 0)")
        return None
    return float(v)


def outcome_from_answer(answer: Mapping[str, Any] | None, strategy: str, default_detail: str) -> ActionOutcome:
    """The :class:`ActionOutcome` a target's JSON answer describes (None: no JSON, a plain success).

    Ill-typed fields are left out and named in the detail instead of failing the action, which did happen.
    """
    if answer is None:
        return ActionOutcome(True, default_detail)
    ignored: list[str] = []
    ok = answer.get("ok", True)
    if not isinstance(ok, bool):
        ignored.append("ok (not a boolean)")
        ok = True
    detail = answer.get("detail", default_detail)
    if not isinstance(detail, str):
        ignored.append("detail (not a string)")
        detail = default_detail
    result: dict[str, Any] = {}
    if isinstance(answer.get("result"), dict):
        result.update(answer["result"])
    elif answer.get("result") is not None:
        ignored.append("result (not an object)")
    pause = _number(answer, "pause_s", ignored)
    lost_f = _number(answer, "iterations_lost", ignored)
    lost = None
    if lost_f is not None:
        if lost_f.is_integer():
            lost = int(lost_f)
        else:
            ignored.append("iterations_lost (not an integer)")
    if strategy == "validate":
        if "confirmed" in answer:
            if isinstance(answer["confirmed"], bool):
                result["confirmed"] = answer["confirmed"]
            else:
                ignored.append("confirmed (not a boolean)")
        for key, kind in (("ranks", int), ("nodes", str)):
            v = answer.get(key)
            if v is None:
                continue
            if isinstance(v, list) and all(isinstance(x, kind) and not isinstance(x, bool) for x in v):
                result[key] = list(v)
            else:
                ignored.append(f"{key} (not a list of {kind.__name__})")
    if ignored:
        detail = f"{detail} (ignored answer fields: {', '.join(ignored)})"
    return ActionOutcome(ok, detail, result, pause_s=pause, iterations_lost=lost)


def parse_info(doc: Mapping[str, Any]) -> JobInfo:
    """The :class:`JobInfo` an ``info`` answer describes; keys it does not know go to ``extra``.

    Raises:
        AdapterError: a known field of the wrong type (the planner would plan on nonsense).
    """
    def int_list(key: str) -> list[int] | None:
        v = doc.get(key)
        if v is None:
            return None
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise AdapterError(f"info: {key} must be a list of integers, got {v!r}")
        return list(v)

    def str_list(key: str) -> list[str]:
        v = doc.get(key)
        if v is None:
            return []
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise AdapterError(f"info: {key} must be a list of strings, got {v!r}")
        return list(v)

    layout = doc.get("layout")
    if layout is not None:
        if not isinstance(layout, dict) or not all(
                isinstance(k, str) and (v is None or (isinstance(v, int) and not isinstance(v, bool)))
                for k, v in layout.items()):
            raise AdapterError(f"info: layout must map names to integers or null, got {layout!r}")
        layout = dict(layout)
    extra = doc.get("extra") or {}
    if not isinstance(extra, dict):
        raise AdapterError(f"info: extra must be an object, got {extra!r}")
    costs = strategy_costs(doc.get("costs") or {})
    if costs is None:
        raise AdapterError(f"info: costs must map strategies ({', '.join(STRATEGY_NAMES)}) to seconds >= 0, "
                           f"got {doc.get('costs')!r}")
    known = {"layout", "placement", "nodes", "spare_nodes", "microbatches", "costs", "extra"}
    extra = {**{k: v for k, v in doc.items() if k not in known}, **extra}
    return JobInfo(layout=layout, placement=int_list("placement"), nodes=str_list("nodes"),
                   spare_nodes=str_list("spare_nodes") if "spare_nodes" in doc else None,
                   microbatches=int_list("microbatches"), costs=costs, extra=extra)


def _str_map(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigError(f"command adapter: {where} must map strings to strings")
    return dict(value)


def _timeout(doc: Mapping[str, Any], where: str, default: float) -> float:
    try:
        value = float(option(doc, "timeout_s", (int, float), default))
    except ConfigError as exc:
        raise ConfigError(f"command adapter: {where}: {exc}") from None
    if value <= 0:
        raise ConfigError(f"command adapter: {where}: timeout_s must be > 0, got {value}")
    return value


def _public_url(url: str) -> str:
    """`url` without its query and user info: what error messages may show (a query may hold a secret)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}{':' + str(parts.port) if parts.port else ''}{parts.path}"


class Adapter:
    """:class:`remediator.adapters.base.TrainingAdapter` that runs the commands or HTTP calls its config names."""

    kind: ClassVar[str] = "command"

    def __init__(self, job: str, labels: Mapping[str, str], options: Mapping[str, Any]) -> None:
        """Check every option and template now, so that a bad config fails when it loads.

        Raises:
            ConfigError: an unknown or ill-typed option, a call with neither or both of command and http,
                a template naming a field its call cannot have, a command or file that does not exist.
        """
        unknown = set(options) - OPTIONS
        if unknown:
            raise ConfigError(f"command adapter: unknown options {sorted(unknown)} (known: {sorted(OPTIONS)})")
        self.job = job
        self.labels = {str(k): str(v) for k, v in labels.items()}
        self.timeout_s = _timeout(options, "options", DEFAULT_TIMEOUT_S)
        self.env = _str_map(options.get("env", {}), "env")
        self.info_call: Call | None = None
        if "info" in options:
            self.info_call = self._call(options["info"], "info", (), "GET")
        self.calls: dict[str, Call] = {}
        self.recovers: dict[str, Call] = {}
        for strategy in STRATEGY_NAMES:
            if strategy not in options:
                continue
            doc = options[strategy]
            if not isinstance(doc, dict):
                raise ConfigError(f"command adapter: {strategy} must be a mapping with command or http")
            unknown = set(doc) - CALL_KEYS - {"recover"}
            if unknown:
                raise ConfigError(f"command adapter: {strategy}: unknown keys {sorted(unknown)} "
                                  f"(known: {sorted(CALL_KEYS | {'recover'})})")
            names = ACTION_FIELDS + PARAM_FIELDS[strategy]
            self.calls[strategy] = self._call({k: v for k, v in doc.items() if k != "recover"}, strategy, names,
                                              "POST", idempotency_key=True)
            if "recover" in doc:
                self.recovers[strategy] = self._call(doc["recover"], f"{strategy}.recover", names, "GET")
        if not self.calls and self.info_call is None:
            raise ConfigError(f"command adapter: nothing configured: give info or one of {list(STRATEGY_NAMES)}")

    # ------------------------------------------------------------------ config
    def _check(self, template: str, where: str, names: tuple[str, ...]) -> None:
        """Render `template` with stand-in values: refuses fields the call will not have."""
        try:
            render(template, self.job, self.labels, **dict.fromkeys(names, "x"))
        except ConfigError as exc:
            raise ConfigError(f"command adapter: {where}: {exc}") from None

    def _check_body(self, body: Any, where: str, names: tuple[str, ...]) -> None:
        if isinstance(body, str):
            self._check(body, where, names)
        elif isinstance(body, list):
            for i, v in enumerate(body):
                self._check_body(v, f"{where}[{i}]", names)
        elif isinstance(body, dict):
            for k, v in body.items():
                if not isinstance(k, str):
                    raise ConfigError(f"command adapter: {where}: keys must be strings, got {k!r}")
                self._check_body(v, f"{where}.{k}", names)
        elif body is not None and not isinstance(body, bool | int | float):
            raise ConfigError(f"command adapter: {where}: not a JSON value: {body!r}")

    def _call(self, doc: Any, where: str, names: tuple[str, ...], default_method: str, *,
              idempotency_key: bool = False) -> Call:
        """Parse one call (a mapping with exactly one of command and http, and maybe timeout_s)."""
        if not isinstance(doc, dict):
            raise ConfigError(f"command adapter: {where} must be a mapping with command or http")
        unknown = set(doc) - CALL_KEYS
        if unknown:
            raise ConfigError(f"command adapter: {where}: unknown keys {sorted(unknown)} (known: {sorted(CALL_KEYS)})")
        if ("command" in doc) == ("http" in doc):
            raise ConfigError(f"command adapter: {where}: give exactly one of command and http")
        timeout_s = _timeout(doc, where, self.timeout_s)
        if "command" in doc:
            argv = doc["command"]
            if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
                raise ConfigError(f"command adapter: {where}.command must be a non-empty list of strings "
                                  "(an argv: no shell parses it)")
            for i, arg in enumerate(argv):
                self._check(arg, f"{where}.command[{i}]", names)
            self._check_executable(argv[0], f"{where}.command[0]")
            return Call(where, timeout_s, command=tuple(argv), idempotency_key=idempotency_key)
        return Call(where, timeout_s, http=self._http(doc["http"], f"{where}.http", names, default_method),
                    idempotency_key=idempotency_key)

    def _check_executable(self, program: str, where: str) -> None:
        if "{" in program:
            return  # named by a template: only known per call
        path = (self.env.get("PATH") or os.environ.get("PATH")) if os.sep not in program else None
        found = shutil.which(program, path=path) if os.sep not in program else (
            program if Path(program).is_file() and os.access(program, os.X_OK) else None)
        if found is None:
            raise ConfigError(f"command adapter: {where}: no executable {program!r}"
                              + ("" if os.sep in program else " on PATH"))

    def _http(self, doc: Any, where: str, names: tuple[str, ...], default_method: str) -> HttpSpec:
        if not isinstance(doc, dict):
            raise ConfigError(f"command adapter: {where} must be a mapping with url (and method, headers, body)")
        unknown = set(doc) - HTTP_KEYS
        if unknown:
            raise ConfigError(f"command adapter: {where}: unknown keys {sorted(unknown)} (known: {sorted(HTTP_KEYS)})")
        url = doc.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"command adapter: {where}.url must be a string starting with http:// or https://")
        self._check(url, f"{where}.url", names)
        method = doc.get("method", default_method)
        if not isinstance(method, str) or method.upper() not in METHODS:
            raise ConfigError(f"command adapter: {where}.method must be one of {sorted(METHODS)}, got {method!r}")
        method = method.upper()
        headers = _str_map(doc.get("headers", {}), f"{where}.headers")
        for name, value in headers.items():
            if not _HEADER_NAME.match(name):
                raise ConfigError(f"command adapter: {where}.headers: {name!r} is not a header name")
            self._check(value, f"{where}.headers.{name}", names)
        body = doc.get("body", _NO_BODY)
        if body is not _NO_BODY:
            if method in ("GET", "DELETE"):
                raise ConfigError(f"command adapter: {where}.body: a {method} request carries no body")
            self._check_body(body, f"{where}.body", names)
        token_file = None
        if "bearer_token_file" in doc:
            tf = doc["bearer_token_file"]
            if not isinstance(tf, str) or not Path(tf).is_file():
                raise ConfigError(f"command adapter: {where}.bearer_token_file: no file {tf!r}")
            token_file = Path(tf)
        ca_file = doc.get("ca_file")
        if ca_file is not None and (not isinstance(ca_file, str) or not Path(ca_file).is_file()):
            raise ConfigError(f"command adapter: {where}.ca_file: no file {ca_file!r}")
        return HttpSpec(url, method, headers, body, token_file, ca_file)

    # ------------------------------------------------------------------ the contract
    def capabilities(self) -> frozenset[str]:
        """The strategies the config gives a call for."""
        return frozenset(self.calls)

    def info(self) -> JobInfo:
        """What the ``info`` call answers (every field unknown without one).

        Raises:
            AdapterError: the call failed or its answer is not a JobInfo object.
        """
        if self.info_call is None:
            return JobInfo()
        reply = self._invoke(self.info_call, None)
        if not reply.ok:
            raise AdapterError(self._failure(self.info_call, reply))
        doc = parse_answer(reply.out)
        if doc is None:
            raise AdapterError(f"info: {reply.what} answered no JSON object: {tail(reply.out) or '(nothing)'}")
        return parse_info(doc)

    def execute(self, request: ActionRequest) -> ActionOutcome:
        """Run the strategy's call once and return the outcome it answered.

        Raises:
            AdapterError: no call for the strategy, or the call failed (transient: timeout, 5xx, connection).
        """
        call = self.calls.get(request.strategy)
        if call is None:
            raise AdapterError(f"the command adapter of job {self.job} has no {request.strategy} call "
                               f"(configured: {sorted(self.calls) or 'none'})")
        reply = self._invoke(call, request)
        if not reply.ok:
            raise AdapterError(self._failure(call, reply))
        return outcome_from_answer(parse_answer(reply.out), request.strategy,
                                   f"{request.strategy}: {reply.what}")

    def recover(self, request: ActionRequest) -> ActionOutcome | None:
        """Ask the strategy's ``recover`` call what became of the action (None: no such call, or it never
        heard of the action); never runs the action itself.

        Raises:
            AdapterError: the recover call failed.
        """
        call = self.recovers.get(request.strategy)
        if call is None:
            return None
        reply = self._invoke(call, request, unknown_code=UNKNOWN_EXIT if call.command else 404)
        if reply.unknown:
            return None
        if not reply.ok:
            raise AdapterError(self._failure(call, reply))
        return outcome_from_answer(parse_answer(reply.out), request.strategy,
                                   f"{request.strategy} {request.id}: {reply.what} (asked after a restart)")

    # ------------------------------------------------------------------ calls
    def _fields(self, request: ActionRequest | None) -> _Fields:
        labels = {**self.labels, **{str(k): str(v) for k, v in (request.labels if request else {}).items()}}
        f = _Fields(labels)
        if request is not None:
            params = dict(request.params)
            f.raw = {name: params.get(name) for name in PARAM_FIELDS.get(request.strategy, ())}
            f.raw.update(action=request.id, strategy=request.strategy, reason=request.reason, params_json=params)
        return f

    def _invoke(self, call: Call, request: ActionRequest | None, unknown_code: int | None = None) -> Reply:
        fields = self._fields(request)
        if call.http is not None:
            return self._run_http(call, call.http, fields, request, unknown_code)
        return self._run_command(call, call.command or (), fields, request, unknown_code)

    def _render(self, template: str, fields: _Fields, where: str, quote_values: bool = False) -> str:
        text = fields.text()
        labels, job = fields.labels, self.job
        if quote_values:  # values go into a URL: a job name with "/" or "?" must not change its shape
            text = {k: quote(v, safe=",") for k, v in text.items()}
            labels = {k: quote(v, safe=",") for k, v in labels.items()}
            job = quote(job, safe=",")
        try:
            return render(template, job, labels, **text)
        except ConfigError as exc:  # a label the alert of this action lacks
            raise AdapterError(f"{where}: {exc}") from None

    def _render_body(self, body: Any, fields: _Fields, where: str) -> Any:
        if isinstance(body, str):
            m = _ONE_FIELD.match(body)
            if m:
                name = m.group(1)
                if name == "job":
                    return self.job
                if name in fields.raw:
                    return fields.raw[name]
                if name in fields.labels:
                    return fields.labels[name]
            return self._render(body, fields, where)
        if isinstance(body, list):
            return [self._render_body(v, fields, where) for v in body]
        if isinstance(body, dict):
            return {k: self._render_body(v, fields, where) for k, v in body.items()}
        return body

    def _env(self, request: ActionRequest | None) -> dict[str, str]:
        env = {**os.environ, **self.env, "FAILSLOW_JOB": self.job}
        if request is not None:
            env.update(FAILSLOW_ACTION_ID=request.id, FAILSLOW_STRATEGY=request.strategy,
                       FAILSLOW_PARAMS=json.dumps(dict(request.params), sort_keys=True),
                       FAILSLOW_REASON=request.reason)
        return env

    def _run_command(self, call: Call, template: tuple[str, ...], fields: _Fields, request: ActionRequest | None,
                     unknown_code: int | None) -> Reply:
        argv = [self._render(a, fields, f"{call.where}.command[{i}]") for i, a in enumerate(template)]
        what = f"command {Path(argv[0]).name}"
        try:
            # Own session: a timeout kills the command and whatever it started (kubectl, ssh, sleep).
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=self._env(request), start_new_session=True)
        except OSError as exc:
            raise AdapterError(f"{call.where}: cannot run {argv[0]}: {exc.strerror or exc}") from None
        try:
            out, err = proc.communicate(timeout=call.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise AdapterError(f"{call.where}: {what} did not finish within {call.timeout_s:g} s (killed); "
                               "it may have acted: the target should dedupe on the action id",
                               transient=True) from None
        code = proc.returncode
        return Reply(code, out.decode(errors="replace"), err.decode(errors="replace"), f"{what} exit {code}",
                     ok=code == 0, unknown=unknown_code is not None and code == unknown_code)

    def _run_http(self, call: Call, spec: HttpSpec, fields: _Fields, request: ActionRequest | None,
                  unknown_code: int | None) -> Reply:
        url = self._render(spec.url, fields, f"{call.where}.url", quote_values=True)
        headers = {k: self._render(v, fields, f"{call.where}.headers.{k}") for k, v in spec.headers.items()}
        if any("\r" in v or "\n" in v for v in headers.values()):
            raise AdapterError(f"{call.where}.headers: a value rendered with a line break")
        if spec.bearer_token_file is not None and "Authorization" not in headers:
            try:
                headers["Authorization"] = f"Bearer {spec.bearer_token_file.read_text().strip()}"
            except OSError as exc:
                raise AdapterError(f"{call.where}: token file {spec.bearer_token_file}: {exc.strerror}") from None
        if call.idempotency_key and request is not None:
            headers.setdefault("Idempotency-Key", request.id)
        body: Any = _NO_BODY
        if spec.body is not _NO_BODY:
            body = self._render_body(spec.body, fields, f"{call.where}.body")
        elif spec.method in ("POST", "PUT", "PATCH"):
            body = {"job": self.job, "labels": fields.labels}
            if request is not None:
                body.update(action=request.id, strategy=request.strategy, params=dict(request.params),
                            reason=request.reason)
        what = f"{spec.method} {_public_url(url)}"
        try:
            r = requests.request(spec.method, url, headers=headers, timeout=call.timeout_s,
                                 json=None if body is _NO_BODY else body, allow_redirects=False,
                                 verify=spec.ca_file or True)
        except requests.exceptions.SSLError as exc:
            raise AdapterError(f"{call.where}: {what}: TLS: {exc}") from None
        except (requests.exceptions.InvalidURL, requests.exceptions.InvalidHeader,
                requests.exceptions.MissingSchema) as exc:
            raise AdapterError(f"{call.where}: {what}: {exc}") from None
        except requests.exceptions.Timeout:
            raise AdapterError(f"{call.where}: {what}: no answer within {call.timeout_s:g} s; it may have acted: "
                               "the target should dedupe on the action id", transient=True) from None
        except requests.exceptions.RequestException as exc:  # refused, reset, DNS: the target is away
            raise AdapterError(f"{call.where}: {what}: {type(exc).__name__}: {exc}", transient=True) from None
        status = r.status_code
        if status >= 500 or status in TRANSIENT_STATUS:
            raise AdapterError(f"{call.where}: {what}: HTTP {status}: {tail(r.text) or r.reason}", transient=True)
        said = r.text
        if 300 <= status < 400:
            said = f"redirect to {r.headers.get('Location', '?')} not followed (a POST would become a GET)"
        return Reply(status, r.text, said, f"{what} HTTP {status}", ok=200 <= status < 300,
                     unknown=unknown_code is not None and status == unknown_code)

    def _failure(self, call: Call, reply: Reply) -> str:
        said = tail(reply.err) or tail(reply.out) or "(no output)"
        return f"{call.where}: {reply.what}: {said}"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command's process group and reap it; pipes a stray grandchild holds are closed."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:  # something left the group and kept our pipes open
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait(timeout=5)

"""`failslow remediator`: run the remediator service, or talk to a running one from a shell.

    failslow remediator [--config FILE]                 # the service (same as `python -m remediator`)
    failslow remediator events [--state open] [--json]  # GET /events
    failslow remediator actions [--job J] [--json]      # GET /actions
    failslow remediator approve ID | reject ID          # POST /actions/ID/approve|reject
    failslow remediator audit [--job J] [--limit N]     # GET /audit
    failslow remediator remediate JOB [--action A]      # POST /remediate

The client commands find the service at ``--url`` (default ``$FAILSLOW_REMEDIATOR_URL`` or
http://127.0.0.1:8000) and send the token from ``--token-file`` (default ``$FAILSLOW_REMEDIATOR_TOKEN_FILE``).
Exit 0 on success, 1 when the service refused (its answer is printed), 2 on bad input or no service.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from failslow.errors import InputError

HELP = "the remediator: Alertmanager webhook + ski-rental planner + adapters; or events/actions/approve ID"

CLIENT_COMMANDS = ("events", "actions", "approve", "reject", "audit", "remediate")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options override the FAILSLOW_REMEDIATOR_* environment."""
    p.add_argument("command", nargs="?", choices=CLIENT_COMMANDS,
                   help="talk to a running remediator instead of running one")
    p.add_argument("target", nargs="?", help="approve/reject: the action id; remediate: the job")
    s = p.add_argument_group("service")
    s.add_argument("--config", help="YAML config: jobs -> adapters, policy, costs (FAILSLOW_REMEDIATOR_CONFIG)")
    s.add_argument("--host", help="address to bind (FAILSLOW_REMEDIATOR_HOST, default 127.0.0.1)")
    s.add_argument("--port", type=int, help="port (FAILSLOW_REMEDIATOR_PORT, default 8000)")
    s.add_argument("--redis-url", help="Redis URL (FAILSLOW_REMEDIATOR_REDIS_URL)")
    s.add_argument("--prometheus-url", help="Prometheus base URL (FAILSLOW_REMEDIATOR_PROMETHEUS_URL)")
    s.add_argument("--mode", choices=("dry-run", "auto"), help="FAILSLOW_REMEDIATOR_MODE (default dry-run)")
    p.add_argument("--token-file", help="bearer token file (FAILSLOW_REMEDIATOR_TOKEN_FILE)")
    c = p.add_argument_group("client")
    c.add_argument("--url", default=None, help="remediator base URL (FAILSLOW_REMEDIATOR_URL, default "
                                               "http://127.0.0.1:8000)")
    c.add_argument("--state", help="events: open|closed; actions: an action state")
    c.add_argument("--job", help="only this job's actions / audit entries")
    c.add_argument("--limit", type=int, default=50)
    c.add_argument("--json", action="store_true", help="print the JSON answer instead of a table")
    c.add_argument("--action", default="auto", help="remediate: auto|validate|rebalance|topology|restart")
    c.add_argument("--dry-run", dest="dry_run", action="store_true", default=None, help="remediate: plan only")
    c.add_argument("--act", dest="dry_run", action="store_false", help="remediate: act even in dry-run mode")
    c.add_argument("--approve", action="store_true", help="remediate: count this request as the approval")
    c.add_argument("--reason", default="", help="remediate: why (goes to the audit)")
    c.add_argument("--timeout", type=float, default=30.0)


def run(args: argparse.Namespace) -> int:
    """Run the service, or one client command."""
    if args.command is None:
        return _serve(args)
    return _client(args)


def _serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from remediator.__main__ import main
    from remediator.settings import Settings

    over = {k: v for k, v in {"config": args.config, "host": args.host, "port": args.port,
                              "redis_url": args.redis_url, "prometheus_url": args.prometheus_url,
                              "mode": args.mode, "token_file": args.token_file}.items() if v is not None}
    try:
        settings = Settings(**over)
    except ValidationError as exc:
        raise InputError(str(exc).replace("\n", " ")) from exc
    return main(settings)


def _token(args: argparse.Namespace) -> str:
    path = args.token_file or os.environ.get("FAILSLOW_REMEDIATOR_TOKEN_FILE")
    if not path:
        raise InputError("no token: pass --token-file or set FAILSLOW_REMEDIATOR_TOKEN_FILE")
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise InputError(f"token file {path}: {exc.strerror}") from None


def _client(args: argparse.Namespace) -> int:
    import requests

    base = (args.url or os.environ.get("FAILSLOW_REMEDIATOR_URL") or "http://127.0.0.1:8000").rstrip("/")
    headers = {"Authorization": f"Bearer {_token(args)}"}
    cmd = args.command
    if cmd in ("approve", "reject", "remediate") and not args.target:
        raise InputError(f"{cmd} needs {'a job' if cmd == 'remediate' else 'an action id'}")
    try:
        if cmd == "events":
            r = requests.get(f"{base}/events", params=_params(state=args.state, job=args.job, limit=args.limit),
                             headers=headers, timeout=args.timeout)
        elif cmd == "actions":
            r = requests.get(f"{base}/actions", params=_params(state=args.state, job=args.job, limit=args.limit),
                             headers=headers, timeout=args.timeout)
        elif cmd == "audit":
            r = requests.get(f"{base}/audit", params=_params(job=args.job, limit=args.limit), headers=headers,
                             timeout=args.timeout)
        elif cmd in ("approve", "reject"):
            r = requests.post(f"{base}/actions/{args.target}/{cmd}", headers=headers, timeout=args.timeout)
        else:
            body: dict[str, Any] = {"job": args.target, "action": args.action, "reason": args.reason,
                                    "approve": args.approve}
            if args.dry_run is not None:
                body["dry_run"] = args.dry_run
            r = requests.post(f"{base}/remediate", json=body, headers=headers, timeout=args.timeout)
    except requests.RequestException as exc:
        raise InputError(f"no remediator at {base}: {exc}") from None
    try:
        doc = r.json()
    except ValueError:
        doc = {"detail": r.text}
    if r.status_code >= 400:
        print(json.dumps(doc, indent=1), file=sys.stderr)
        print(f"failslow remediator {cmd}: HTTP {r.status_code}", file=sys.stderr)
        return 1
    if args.json or cmd in ("approve", "reject", "remediate"):
        print(json.dumps(doc, indent=1))
    else:
        print(_table(cmd, doc))
    return 0


def _params(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def _t(ts: Any) -> str:
    return "-" if not ts else time.strftime("%H:%M:%S", time.localtime(float(ts)))


def _table(cmd: str, doc: list[dict[str, Any]]) -> str:
    """A compact table for people."""
    rows: list[list[str]] = []
    if cmd == "events":
        head = ["id", "job", "state", "onset", "level", "pace/healthy", "suspects", "plan"]
        for e in doc:
            sus = ",".join(f"{s['kind']}:{s['rank'] if s.get('rank') is not None else s.get('node', '')}"
                           for s in e.get("suspects") or [])
            ph = "-" if e.get("pace_s") is None else f"{e['pace_s']:.3f}/{(e.get('healthy_s') or 0):.3f}"
            plan = (e.get("last_decision") or {}).get("strategy", "-")
            rows.append([e["id"], e["job"], e["state"], _t(e.get("onset")), f"S{e.get('level') or 1}", ph,
                         sus or "-", plan])
    elif cmd == "actions":
        head = ["id", "job", "strategy", "state", "created", "predicted", "measured", "effect"]
        for a in doc:
            pr, me = a.get("predicted") or {}, a.get("measured") or {}
            eff = me.get("effective")
            rows.append([a["id"], a["job"], a["strategy"], a["state"] + (" (dry)" if a.get("dry_run") else ""),
                         _t(a.get("created_at")), "-" if pr.get("pace_s") is None else f"{pr['pace_s']:.3f}s",
                         "-" if me.get("pace_after_s") is None else f"{me['pace_after_s']:.3f}s",
                         "-" if eff is None else ("effective" if eff else "ineffective")])
    else:
        head = ["time", "kind", "job", "event", "action", "what"]
        for e in doc:
            d = e.get("data") or {}
            what = d.get("reason") or d.get("what") or d.get("state") or d.get("verdict") or ""
            if e.get("kind") == "decision":
                what = f"{d.get('strategy')}: {d.get('reason', '')}"
            if e.get("kind") == "delivery":
                what = f"{d.get('status')}: {','.join(d.get('outcomes') or [])}"
            rows.append([_t(e.get("ts")), e.get("kind", ""), e.get("job", ""), e.get("event", ""),
                         e.get("action", ""), str(what)[:100]])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)

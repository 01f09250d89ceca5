"""The status page: events, their suspects, the plan, each action with its cost and measured effect, and the
approvals waiting for a person. Server-rendered HTML from plain documents (pure; no JavaScript), refreshed by
the browser every few seconds. Approve and reject are plain form posts.
"""

from __future__ import annotations

import time
from html import escape
from typing import Any

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d1d1f;background:#fafafa}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse;width:100%;background:#fff}th,td{border:1px solid #ddd;padding:.3em .5em;
text-align:left;vertical-align:top}th{background:#f0f0f3}.muted{color:#777}.ok{color:#1a7f37}.bad{color:#c62828}
.pill{display:inline-block;padding:0 .5em;border-radius:1em;background:#e8e8ee;margin:0 .2em .2em 0}
.state-running,.state-pending_approval{background:#fff3cd}.state-succeeded{background:#e6f4ea}
.state-failed,.state-rejected{background:#fde7e9}form{display:inline}button{margin-right:.3em}
td:first-child,.pill,.id{white-space:nowrap}td{font-variant-numeric:tabular-nums}
.approve{background:#1a7f37;color:#fff;border:0;padding:.3em .8em;border-radius:.3em}
.reject{background:#c62828;color:#fff;border:0;padding:.3em .8em;border-radius:.3em}
"""


def _t(ts: Any) -> str:
    if not ts:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(ts))) + " UTC"


def _s(x: Any, unit: str = "\u00a0s", digits: int = 3) -> str:
    return "-" if x is None else f"{float(x):.{digits}f}{unit}"


def _health(ok: bool | None) -> str:
    if ok is None:
        return '<b class="muted">not asked yet</b>'
    return f'<b class="{"ok" if ok else "bad"}">{"up" if ok else "down"}</b>'


def _suspects(ev: dict[str, Any]) -> str:
    out = []
    for s in ev.get("suspects") or []:
        where = f"rank {s['rank']}" if s.get("rank") is not None else ""
        if s.get("node"):
            where = f"{where} on {s['node']}" if where else f"node {s['node']}"
        out.append(f'<span class="pill">{escape(s.get("kind", ""))} {escape(where)}</span>')
    return "".join(out) or '<span class="muted">none named</span>'


def _params(a: dict[str, Any]) -> str:
    p = a.get("params") or {}
    keep = {k: v for k, v in p.items() if k in ("counts", "from", "exclude_nodes", "exclude_ranks", "placement",
                                                 "ranks", "nodes", "restore")}
    return escape(", ".join(f"{k}={v}" for k, v in keep.items()))


def _buttons(a: dict[str, Any]) -> str:
    aid = escape(a["id"])
    return (f'<form method="post" action="/actions/{aid}/approve"><button class="approve" type="submit">Approve'
            f'</button></form><form method="post" action="/actions/{aid}/reject"><button class="reject" '
            f'type="submit">Reject</button></form>')


def render_login(message: str = "") -> str:
    """The page shown when reads need the token and the browser has not given it."""
    msg = f'<p class="bad">{escape(message)}</p>' if message else ""
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport "
            f'content="width=device-width, initial-scale=1"><title>failslow remediator</title><style>{STYLE}</style>'
            f"</head><body><h1>failslow remediator</h1>{msg}<p>This remediator needs its token to show its state."
            f'</p><form method="post" action="/login"><label>Token <input type="password" name="token" '
            f'autofocus></label> <button type="submit">Sign in</button></form></body></html>')


def render_status(*, mode: str, replica: str, events: list[dict[str, Any]], actions: list[dict[str, Any]],
                  audit: list[dict[str, Any]], health: dict[str, Any], now: float, can_act: bool,
                  refresh_s: int = 10) -> str:
    """The whole status page."""
    open_ev = [e for e in events if e.get("state") == "open"]
    closed_ev = [e for e in events if e.get("state") != "open"][:20]
    pending = [a for a in actions if a.get("state") == "pending_approval"]
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><meta http-equiv=refresh content={refresh_s}>"
             f'<meta name=viewport content="width=device-width, initial-scale=1">'
             f"<title>failslow remediator</title><style>{STYLE}</style></head><body>",
             "<h1>failslow remediator</h1>",
             f'<p>mode <b>{escape(mode)}</b>{" (plans and audits, acts on nothing)" if mode != "auto" else ""} · '
             f'replica {escape(replica)} · Redis {_health(health.get("redis"))} · Prometheus '
             f'{_health(health.get("prometheus"))} · {len(open_ev)} open event(s) · {_t(now)}</p>']
    parts.append(f"<h2>Pending approvals ({len(pending)})</h2>")
    if pending:
        parts.append("<table><tr><th>action</th><th>job</th><th>strategy</th><th>parameters</th>"
                     "<th>pace now → predicted</th><th>cost</th><th>requested by</th><th>created</th><th>why</th>"
                     "<th></th></tr>")
        for a in pending:
            pr = a.get("predicted") or {}
            parts.append(f'<tr id="{escape(a["id"])}" class="state-pending_approval"><td class=id>{escape(a["id"])}</td>'
                         f'<td>{escape(a["job"])}</td><td>{escape(a["strategy"])}</td><td>{_params(a)}</td>'
                         f'<td>{_s(pr.get("pace_before_s"))} → {_s(pr.get("pace_s"))}</td>'
                         f'<td>{_s(pr.get("cost_s"), digits=1)} (est.)</td>'
                         f'<td>{escape(str(a.get("requested_by", "")))}</td><td>{_t(a.get("created_at"))}</td>'
                         f'<td>{escape(a.get("reason", ""))}</td><td>{_buttons(a) if can_act else ""}</td></tr>')
        parts.append("</table>")
    else:
        parts.append('<p class="muted">none</p>')
    parts.append(f"<h2>Open events ({len(open_ev)})</h2>")
    parts.append(_events_table(open_ev, plan=True))
    parts.append(f"<h2>Actions ({len(actions)})</h2>")
    if actions:
        parts.append("<table><tr><th>action</th><th>event</th><th>job</th><th>strategy</th><th>state</th><th>created</th>"
                     "<th>parameters</th><th>pace before → predicted → measured</th><th>effect</th><th>cost</th>"
                     "<th>duration</th><th>outcome</th></tr>")
        for a in actions:
            pr, me = a.get("predicted") or {}, a.get("measured") or {}
            eff = me.get("effective")
            eff_s = "-" if eff is None else ('<span class="ok">effective</span>' if eff
                                             else '<span class="bad">ineffective</span>')
            state = a.get("state", "")
            if a.get("dry_run"):
                state += " (dry run)"
            out = (a.get("outcome") or {}).get("detail", "")
            parts.append(f'<tr id="{escape(a["id"])}" class="state-{escape(a.get("state", ""))}">'
                         f'<td class=id>{escape(a["id"])}</td><td class=id>{escape(a.get("event_id", ""))}</td>'
                         f'<td>{escape(a["job"])}</td><td>{escape(a["strategy"])}</td><td>{escape(state)}</td>'
                         f'<td>{_t(a.get("created_at"))}</td><td>{_params(a)}</td>'
                         f'<td>{_s(pr.get("pace_before_s"))} → {_s(pr.get("pace_s"))} → '
                         f'{_s(me.get("pace_after_s"))}</td><td>{eff_s}</td>'
                         f'<td>{_s(me.get("cost_s"), digits=1) if me.get("cost_s") is not None else _s(pr.get("cost_s"), digits=1) + " (est.)"}</td>'
                         f'<td>{_s(me.get("duration_s"), digits=1)}</td><td>{escape(str(out))}</td></tr>')
        parts.append("</table>")
    else:
        parts.append('<p class="muted">none yet</p>')
    parts.append(f"<h2>Closed events ({len(closed_ev)})</h2>")
    parts.append(_events_table(closed_ev, plan=False))
    parts.append("<h2>Audit (newest first)</h2>")
    if audit:
        parts.append("<table><tr><th>time</th><th>kind</th><th>job</th><th>event</th><th>action</th><th>what</th></tr>")
        for e in audit:
            d = e.get("data") or {}
            what = d.get("reason") or d.get("what") or d.get("state") or d.get("verdict") or \
                (d.get("outcomes") and f"{d.get('status')}: {', '.join(d['outcomes'])}") or ""
            if e.get("kind") == "decision":
                what = f"{d.get('strategy')}: {d.get('reason', '')}"
            parts.append(f'<tr><td>{_t(e.get("ts"))}</td><td>{escape(e.get("kind", ""))}</td>'
                         f'<td>{escape(e.get("job", ""))}</td><td class=id>{escape(e.get("event", ""))}</td>'
                         f'<td class=id>{escape(e.get("action", ""))}</td><td>{escape(str(what))}</td></tr>')
        parts.append("</table>")
    else:
        parts.append('<p class="muted">none</p>')
    parts.append("</body></html>")
    return "".join(parts)


def _events_table(events: list[dict[str, Any]], plan: bool) -> str:
    if not events:
        return '<p class="muted">none</p>'
    head = ("<table><tr><th>event</th><th>job</th><th>opened</th><th>onset</th><th>suspects</th>"
            "<th>pace / healthy</th><th>slowdown lost</th><th>action cost</th><th>level</th>")
    head += "<th>plan now</th></tr>" if plan else "<th>closed</th></tr>"
    rows = [head]
    for e in events:
        ratio = f" ({e['ratio']:.2f}×)" if e.get("ratio") else ""
        last = e.get("last_decision") or {}
        strategy = str(last.get("strategy", "-"))
        tail = (f"<td><b>{'no action now:' if strategy == 'ignore' else escape(strategy)}</b> "
                f"{escape(str(last.get('reason', '')))}</td>" if plan else f"<td>{_t(e.get('closed_at'))}: {escape(str(e.get('close_reason') or ''))}</td>")
        firing = "" if e.get("firing") else ' <span class="muted">(alert resolved)</span>'
        rows.append(f'<tr id="{escape(e["id"])}"><td class=id>{escape(e["id"])}</td><td>{escape(e["job"])}{firing}</td>'
                    f'<td>{_t(e.get("opened_at"))}</td><td>{_t(e.get("onset"))}</td><td>{_suspects(e)}</td>'
                    f'<td>{_s(e.get("pace_s"))} / {_s(e.get("healthy_s"))}{ratio}</td>'
                    f'<td>{_s(e.get("lost_s"), digits=1)}</td><td>{_s(e.get("spent_s"), digits=1)}</td>'
                    f'<td title="S1 ignore · S2 rebalance · S3 topology · S4 restart (highest reached)">'
                    f'S{int(e.get("level") or 1)}</td>{tail}</tr>')
    rows.append("</table>")
    return "".join(rows)

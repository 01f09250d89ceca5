"""The remediator's status page in a real browser: a real headless Chromium signs in through the login form,
reads the page of a real event (Redis, a real Prometheus, the remediator process in auto mode acting through
the fake adapter), checks what its screenshot shows, and approves a pending restart with the page's button.

The browser is driven over its DevTools protocol (tests/integration/cdp_browser.py says why): key and mouse
events for typing and clicking, the serialised DOM (what ``--dump-dom`` prints) for reading, and
``Page.captureScreenshot`` for the picture.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from PIL import Image

from failslow_cli.stack.processes import Remediator, free_port, redis_server, start_remediator, stop_process
from remediator.app import COOKIE
from tests.integration.cdp_browser import Chromium, Page, group_alive, read_page
from tests.integration.polling import wait_for
from tests.integration.remediator_stack import (
    JobSeries,
    body,
    fake_cluster_prometheus,
    wait_for_series,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOKEN = "page-test-token-4f1c"
JOB = "llm1"
WIDTH, HEIGHT = 1400, 2000
# dp1's first stage (rank 1, node n1) computes 3x slower: 1.35 s an iteration against 0.55 s healthy
SLOW = {(0, 0): 0.10, (0, 1): 0.10, (1, 0): 0.30, (1, 1): 0.10}
SUSPECT = {"fp": "fp-page-1", "status": "firing", "labels": {"kind": "compute", "rank": "1", "node": "n1"}}
BACKGROUND = (0xFA, 0xFA, 0xFA)  # body{background:#fafafa}
PENDING = (0xFF, 0xF3, 0xCD)  # .state-pending_approval
SUCCEEDED = (0xE6, 0xF4, 0xEA)  # .state-succeeded
APPROVE = (0x1A, 0x7F, 0x37)  # .approve button
REJECT = (0xC6, 0x28, 0x28)  # .reject button


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _png(data: bytes) -> Image.Image:
    """The screenshot as RGB, after checking it is a valid PNG of the window's size."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    Image.open(io.BytesIO(data)).verify()  # checksums and structure
    img = Image.open(io.BytesIO(data))
    assert img.format == "PNG" and img.size == (WIDTH, HEIGHT), (img.format, img.size)
    return img.convert("RGB")


def _count(img: Image.Image, colour: tuple[int, int, int], box: tuple[float, float, float, float] | None = None) -> int:
    """Pixels of exactly `colour` (in `box` = left, top, width, height when given)."""
    if box is not None:
        x, y, w, h = box
        img = img.crop((int(x), int(y), int(x + w), int(y + h)))
    return sum(n for n, c in img.getcolors(maxcolors=1 << 24) or [] if c == colour)


def _area(box: tuple[float, float, float, float]) -> int:
    return int(box[2]) * int(box[3])


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Remediator, Any, Path]]:
    """Redis, the fake cluster's Prometheus with one slowed job, and the remediator process in auto mode."""
    with redis_server(tmp_path / "redis", free_port(), persist=True) as r, \
            fake_cluster_prometheus(tmp_path / "prom") as (prom_url, cluster):
        cluster.set(JOB, JobSeries(dict(SLOW), [4, 4], onset_ts=time.time() - 300, healthy_s=0.55))
        wait_for_series(prom_url, JOB)
        record = tmp_path / "executed.jsonl"
        config = {
            # the fake job: two DP replicas, rank r on node n<r> as in the fake cluster's series
            "jobs": [{"match": JOB, "adapter": "fake", "options": {
                "record": str(record), "capabilities": ["rebalance", "restart"], "nodes": ["n0", "n1"]}}],
            # restart waits for a person; a short cooldown so the rebalance is judged within the test;
            # a restart priced out of the planner's reach so only the person's request asks for one
            "policy": {"approval": ["restart"], "cooldown_s": 3},
            "costs": {"rebalance": 2.0, "restart": 3600.0},
        }
        rem = start_remediator(tmp_path / "remediator", free_port(), redis_url=r.url, prometheus_url=prom_url,
                               token=TOKEN, config=config, mode="auto", replica="page",
                               env={"FAILSLOW_REMEDIATOR_TICK_S": "0.5"})
        try:
            yield rem, cluster, record
        finally:
            stop_process(rem.proc)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Chromium]:
    b = Chromium.start(tmp_path / "browser", WIDTH, HEIGHT)
    try:
        yield b
    finally:
        b.close()
        assert group_alive(b.proc.pid) == [], "chromium processes left running"


def _load(b: Chromium, url: str) -> tuple[Page, int]:
    """Navigate, and return the page read off the DOM with the HTTP status of the document."""
    b.navigate(url)
    return read_page(b.dom()), _doc_status(b)


def _doc_status(b: Chromium) -> int:
    """The HTTP status the browser got for the document it shows."""
    return int(b.evaluate("performance.getEntriesByType('navigation')[0].responseStatus"))


def test_status_page_in_a_real_browser(stack: tuple[Remediator, Any, Path], browser: Chromium,
                                       tmp_path: Path) -> None:
    rem, cluster, record = stack
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    b = browser

    # 1. without the token: the login form, and nothing of the remediator's state
    login, status = _load(b, rem.url + "/")
    assert status == 401 and login.title == "failslow remediator"
    assert "needs its token" in " ".join(login.paragraphs)
    (form,) = login.forms
    assert form["method"] == "post" and form["action"] == "/login"
    assert [(i.get("type"), i.get("name")) for i in form["inputs"]] == [("password", "token")]
    assert [x.get("_text") for x in form["buttons"]] == ["Sign in"]
    assert not login.sections and b.evaluate("document.activeElement.name") == "token"  # autofocus

    # a wrong token first: refused, still the form, no cookie
    b.click("input[name=token]")
    b.type_text("not-the-token")
    b.events.clear()
    b.click("button[type=submit]")
    b.wait_event("Page.loadEventFired")
    wrong = read_page(b.dom())
    assert "wrong token" in " ".join(wrong.paragraphs) and wrong.forms[0]["action"] == "/login"
    assert _doc_status(b) == 401
    assert not [c for c in b.call("Network.getCookies", urls=[rem.url])["cookies"] if c["name"] == COOKIE]

    # sign in for real: focus the field with a click, type the token, click "Sign in"
    b.click("input[name=token]")
    b.type_text(TOKEN)
    b.events.clear()
    b.click("button[type=submit]")
    b.wait_event("Page.loadEventFired")
    posted = [e["params"] for e in b.events if e["method"] == "Network.requestWillBeSent"]
    sent = [p for p in posted if p["request"]["url"].endswith("/login")]
    back = [p for p in posted if p["request"]["url"] == rem.url + "/" and p.get("redirectResponse")]
    assert sent and sent[0]["request"]["method"] == "POST"
    assert back and back[0]["redirectResponse"]["status"] == 303  # POST /login -> 303 -> GET /
    assert b.evaluate("location.pathname") == "/"
    cookies = [c for c in b.call("Network.getCookies", urls=[rem.url])["cookies"] if c["name"] == COOKIE]
    assert len(cookies) == 1 and cookies[0]["httpOnly"] and cookies[0]["sameSite"] == "Strict"
    assert cookies[0]["session"]  # gone with the browser
    assert COOKIE not in b.evaluate("document.cookie")  # HttpOnly: page scripts cannot read it
    empty = read_page(b.dom())
    assert _doc_status(b) == 200
    assert empty.section("Pending approvals (0)")[1] == [] and empty.notes["Pending approvals (0)"] == "none"
    assert empty.notes["Open events (0)"] == "none" and empty.notes["Actions (0)"] == "none yet"
    base_png = b.screenshot(tmp_path / "status-page-empty.png")
    marks["signed in"] = time.monotonic() - t0

    # 2. a real FailSlowDetected notification; the planner rebalances; the "job" applies the new split
    r = requests.post(rem.url + "/api/v1/alerts", data=body(JOB, [SUSPECT]), headers=rem.headers(), timeout=10)
    assert r.status_code == 200 and r.json()["outcome"] == "accepted", r.text
    (event_id,) = r.json()["events"]
    reb = wait_for(lambda: [x for x in _records(record) if x["strategy"] == "rebalance"], 30,
                   "the planner's rebalance", every=0.1)[0]
    counts = reb["params"]["counts"]
    assert counts == [6, 2], reb
    cluster.set(JOB, JobSeries(dict(SLOW), counts, onset_ts=time.time() - 300, healthy_s=0.55))

    def judged() -> dict[str, Any] | None:  # after the cooldown the planner measures the pace it left behind
        a: dict[str, Any] = rem.get(f"/actions/{reb['id']}")
        return a if (a.get("measured") or {}).get("effective") is not None else None

    rebalance = wait_for(judged, 30, "the rebalance's judgement", every=0.1)
    marks["rebalanced and judged"] = time.monotonic() - t0
    assert rebalance["state"] == "succeeded" and rebalance["measured"]["effective"] is True, rebalance
    assert rebalance["predicted"]["pace_before_s"] == pytest.approx(1.35, abs=0.01)
    assert rebalance["predicted"]["pace_s"] == pytest.approx(0.75, abs=0.02)
    assert rebalance["measured"]["pace_after_s"] == pytest.approx(0.75, abs=0.01)

    # a person asks for a restart: it waits for approval
    r = requests.post(rem.url + "/remediate", json={"job": JOB, "action": "restart", "reason": "n1 throttles"},
                      headers=rem.headers(), timeout=10)
    assert r.status_code == 202, r.text
    restart = r.json()["action"]
    assert restart["state"] == "pending_approval" and restart["event_id"] == event_id
    # the planner's next pass sees the pending restart (its plan is shown on the page)
    wait_for(lambda: "restart in flight" in (rem.get(f"/events/{event_id}").get("last_decision") or {}).get(
        "reason", ""), 10, "the planner to see the pending restart", every=0.1)

    # the page as the signed-in browser renders it
    page, status = _load(b, rem.url + "/")
    assert status == 200
    ev = rem.get(f"/events/{event_id}")
    head = " ".join(page.paragraphs)
    for bit in ("mode auto", "replica page", "Redis up", "Prometheus up", "1 open event(s)"):
        assert bit in head, (bit, head)

    _h, pending = page.section("Pending approvals (1)")
    assert len(pending) == 1
    p = pending[0]
    assert p.cls == "state-pending_approval"
    # the restart leaves n1 behind and puts the job's own split back (the rebalance had changed it)
    assert p.cells[:4] == [restart["id"], JOB, "restart",
                           f"counts=[4, 4], exclude_nodes=['n1'], exclude_ranks=[1], from={counts}"], p.cells
    assert p.cells[4] == f"{restart['predicted']['pace_before_s']:.3f} s → {restart['predicted']['pace_s']:.3f} s"
    assert p.cells[4].startswith("0.75") and p.cells[5] == "3600.0 s (est.)" and p.cells[6] == "manual"
    assert p.cells[8] == "n1 throttles"
    assert p.forms == [("post", f"/actions/{restart['id']}/approve", "Approve"),
                       ("post", f"/actions/{restart['id']}/reject", "Reject")]

    _h, events = page.section("Open events (1)")
    (e,) = events
    assert e.cells[0] == event_id and e.cells[1] == JOB
    assert e.cells[4] == "compute rank 1 on n1"  # the suspect: kind, rank, node
    assert e.cells[5].startswith("0.750 s / 0.550 s (1.36×)"), e.cells[5]
    assert float(e.cells[6].removesuffix(" s")) > 100  # slowdown accrued since the onset 300 s ago
    assert e.cells[8] == "S4"  # a restart is on the table
    plan = ev["last_decision"]
    assert e.cells[9] == f"no action now: {plan['reason']}" == "no action now: restart in flight (pending_approval)"

    _h, actions = page.section("Actions (2)")
    rows = {a.cells[0]: a for a in actions}
    rb = rows[rebalance["id"]]
    assert rb.cls == "state-succeeded" and rb.cells[1] == rebalance["event_id"]
    assert rb.cells[2:5] == [JOB, "rebalance", "succeeded"]
    assert rb.cells[6] == "counts=[6, 2], from=[4, 4]"
    pr, me = rebalance["predicted"], rebalance["measured"]
    assert rb.cells[7] == f"{pr['pace_before_s']:.3f} s → {pr['pace_s']:.3f} s → {me['pace_after_s']:.3f} s"
    assert rb.cells[7].startswith("1.350 s → 0.75") and rb.cells[7].endswith("→ 0.750 s")
    assert rb.cells[8] == "effective" and rb.cells[9] == "0.0 s" and rb.cells[11] == "fake rebalance"
    rs = rows[restart["id"]]
    assert rs.cls == "state-pending_approval" and rs.cells[4] == "pending_approval"

    _h, audit = page.section("Audit")
    decisions = [a.cells[5] for a in audit if a.cells[1] == "decision" and a.cells[3] == event_id]
    assert f"rebalance: {rebalance['reason']}" in decisions, decisions  # the plan that was acted on
    assert any(a.cells[1] == "judgement" and a.cells[4] == rebalance["id"] for a in audit)

    # 3. the screenshot: a valid PNG of the window's size that shows the state in its colours
    shot = tmp_path / "status-page.png"
    img = _png(b.screenshot(shot))
    base = _png(base_png)
    print(f"\nstatus page screenshot: {shot}\nempty page screenshot: {tmp_path / 'status-page-empty.png'}")
    ink = WIDTH * HEIGHT - _count(img, BACKGROUND)
    base_ink = WIDTH * HEIGHT - _count(base, BACKGROUND)
    assert base_ink > 2000, "the empty page shows nothing at all"
    assert ink > 8 * base_ink, (ink, base_ink)  # tables of white cells and coloured rows, not a blank page
    # the coloured rows and buttons are where the DOM puts them, filled with their CSS colours (less borders
    # and text)
    shares = {}
    for name, colour, sel in (("pending row", PENDING, "tr.state-pending_approval"),
                              ("succeeded row", SUCCEEDED, "tr.state-succeeded"),
                              ("approve button", APPROVE, "button.approve"), ("reject button", REJECT, "button.reject")):
        box = b.box(sel)
        assert box[1] + box[3] < HEIGHT, (sel, box)  # on screen
        shares[name] = _count(img, colour, box) / _area(box)
    print(f"screenshot: non-background pixels {ink} (empty page {base_ink}); colour share of "
          + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))
    assert shares["pending row"] > 0.6 and shares["succeeded row"] > 0.6, shares
    assert shares["approve button"] > 0.5 and shares["reject button"] > 0.5, shares
    assert _count(base, PENDING) == 0 and _count(base, SUCCEEDED) == 0
    marks["page read"] = time.monotonic() - t0

    # 4. approve with the page's button: a real form post with the cookie, 303 back to the page
    b.events.clear()
    b.click(f"form[action='/actions/{restart['id']}/approve'] button")
    b.wait_event("Page.loadEventFired")
    posted = [e["params"] for e in b.events if e["method"] == "Network.requestWillBeSent"]
    assert any(p["request"]["method"] == "POST" and p["request"]["url"].endswith(f"/{restart['id']}/approve")
               for p in posted)
    assert b.evaluate("location.pathname") == "/"

    def succeeded() -> Page | None:
        pg, _s = _load(b, rem.url + "/")
        rows = {a.cells[0]: a for a in pg.section("Actions (2)")[1]}
        return pg if rows[restart["id"]].cells[4] == "succeeded" else None

    done = wait_for(succeeded, 15, "the approved restart shown succeeded", every=0.1)
    assert done.section("Pending approvals (0)")[1] == [] and done.notes["Pending approvals (0)"] == "none"
    row = {a.cells[0]: a for a in done.section("Actions (2)")[1]}[restart["id"]]
    assert row.cls == "state-succeeded" and row.cells[11] == "fake restart"
    after = rem.get(f"/actions/{restart['id']}")
    assert after["approval"]["approved"] and after["approval"]["by"] == "status page"
    assert [x["id"] for x in _records(record) if x["strategy"] == "restart"] == [restart["id"]]  # once
    final = tmp_path / "status-page-approved.png"
    approved = _png(b.screenshot(final))
    assert _count(approved, PENDING) == 0  # nothing waits any more
    assert _count(approved, SUCCEEDED) > 1.5 * _count(img, SUCCEEDED)  # two green rows where there was one
    marks["approved"] = time.monotonic() - t0

    # signed out (the session cookie gone, as when the browser closes): the login form again, no state
    b.call("Network.clearBrowserCookies")
    out, status = _load(b, rem.url + "/")
    assert status == 401 and out.forms[0]["action"] == "/login" and not out.sections
    assert event_id not in b.dom() and restart["id"] not in b.dom()
    print("timings (s since the stack was up): " + ", ".join(f"{k} {v:.1f}" for k, v in marks.items()))

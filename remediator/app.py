"""The remediator's HTTP face: thin routes over :class:`remediator.service.Remediator`.

| route | what |
|---|---|
| ``POST /api/v1/alerts`` | Alertmanager webhook (payload version 4); 200 stored (or a repeat), 401, 413, 422, 503 |
| ``POST /remediate`` | a person's request (JSON); 202 with the plan and the action, 409 one in flight, 422 |
| ``GET /events``, ``/events/{id}`` | events (open and closed), one with its actions |
| ``GET /actions``, ``/actions/{id}`` | actions; ``POST /actions/{id}/approve`` and ``/reject`` |
| ``GET /audit`` | the audit stream, newest first |
| ``GET /healthz``, ``/metrics`` | liveness (503 while Redis is away) and Prometheus metrics |
| ``GET /`` | the status page (``POST /login`` sets the token cookie when reads are closed) |

Every POST needs the bearer token (or, from the status page, the token cookie); reads need it too unless
``open_reads`` is set. Status codes follow what Alertmanager makes of them: 2xx done, 4xx never retried
(so only for input that can never be valid), 5xx retried (only transient faults: Redis away).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from failslow.plan.policy import ACTION_STATES
from remediator.page import render_login, render_status
from remediator.payload import Notification, RemediateRequest
from remediator.service import Remediator, RequestRefused
from remediator.settings import Settings
from remediator.store import Unavailable

COOKIE = "failslow_remediator_token"
ALERTS_PATH = "/api/v1/alerts"

log = logging.getLogger("failslow.remediator")


class TokenFile:
    """The bearer token, read from its file and re-read when the file changes (rotation without restart)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._mtime: float | None = None
        self._token = ""
        self.current()
        if not self._token:
            raise ValueError(f"token file {self.path} is empty")

    def current(self) -> str:
        """The token as the file holds it now.

        Raises:
            ValueError: the file cannot be read when first loaded.
        """
        try:
            st = os.stat(self.path)
        except OSError as exc:
            if not self._token:
                raise ValueError(f"token file {self.path}: {exc.strerror}") from None
            return self._token  # keep the last good token while the file is being replaced
        if st.st_mtime != self._mtime:
            text = self.path.read_text().strip()
            if text:
                self._token, self._mtime = text, st.st_mtime
        return self._token

    def check(self, supplied: str | None) -> bool:
        """Constant-time comparison with the current token."""
        return bool(supplied) and hmac.compare_digest(str(supplied).encode(), self.current().encode())


class _TooLarge(Exception):
    pass


async def _body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _supplied(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return request.cookies.get(COOKIE)


def _is_form(request: Request) -> bool:
    return request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded")


def _unauthorized() -> JSONResponse:
    return JSONResponse({"detail": "missing or wrong bearer token"}, status_code=401,
                        headers={"WWW-Authenticate": "Bearer"})


def _unavailable(exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": f"state store unavailable, retry: {exc}"}, status_code=503,
                        headers={"Retry-After": "5"})


def create_app(svc: Remediator, settings: Settings, token: TokenFile, *, run_planner: bool = True) -> WebhookFirst:
    """The application around one remediator (the planner loop runs for the app's lifetime)."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(svc.run()) if run_planner else None
        try:
            yield
        finally:
            await svc.stop()
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await svc.store.close()

    app = FastAPI(title="failslow remediator", lifespan=lifespan, docs_url="/docs", redoc_url=None)

    def can_read(request: Request) -> bool:
        return settings.open_reads or token.check(_supplied(request))

    @app.post(ALERTS_PATH)
    async def alerts(request: Request) -> Response:
        if not token.check(_supplied(request)):
            svc.metrics.deliveries.labels("unauthorized").inc()
            return _unauthorized()
        try:
            raw = await _body(request, settings.max_body_bytes)
        except _TooLarge:
            svc.metrics.deliveries.labels("malformed").inc()
            return JSONResponse({"detail": f"body larger than {settings.max_body_bytes} bytes"}, status_code=413)
        try:
            note = Notification.model_validate_json(raw)
        except ValidationError as exc:
            svc.metrics.deliveries.labels("malformed").inc()
            return JSONResponse({"detail": _errors(exc)}, status_code=422)
        try:
            return JSONResponse(await svc.ingest(note))
        except Unavailable as exc:
            return _unavailable(exc)

    @app.post("/remediate")
    async def remediate(request: Request) -> Response:
        if not token.check(_supplied(request)):
            return _unauthorized()
        try:
            raw = await _body(request, settings.max_body_bytes)
        except _TooLarge:
            return JSONResponse({"detail": f"body larger than {settings.max_body_bytes} bytes"}, status_code=413)
        try:
            req = RemediateRequest.model_validate_json(raw)
        except ValidationError as exc:
            return JSONResponse({"detail": _errors(exc)}, status_code=422)
        key = request.headers.get("idempotency-key")
        if key is not None and not 1 <= len(key) <= 200:
            return JSONResponse({"detail": "Idempotency-Key must be 1-200 characters"}, status_code=400)
        try:
            return JSONResponse(await svc.remediate(req, key), status_code=202)
        except RequestRefused as exc:
            return JSONResponse(exc.body, status_code=exc.status)
        except Unavailable as exc:
            return _unavailable(exc)

    async def _decide(request: Request, action_id: str, approve: bool) -> Response:
        if not token.check(_supplied(request)):
            return _unauthorized()
        by = "status page" if _is_form(request) else "api"
        try:
            action = await (svc.approve(action_id, by) if approve else svc.reject(action_id, by))
        except RequestRefused as exc:
            if _is_form(request):
                return RedirectResponse("/", status_code=303)
            return JSONResponse(exc.body, status_code=exc.status)
        except Unavailable as exc:
            return _unavailable(exc)
        if _is_form(request):
            return RedirectResponse("/", status_code=303)
        return JSONResponse(action)

    @app.post("/actions/{action_id}/approve")
    async def approve(request: Request, action_id: str) -> Response:
        return await _decide(request, action_id, True)

    @app.post("/actions/{action_id}/reject")
    async def reject(request: Request, action_id: str) -> Response:
        return await _decide(request, action_id, False)

    @app.get("/events")
    async def events(request: Request, state: str | None = None, job: str | None = None, limit: int = 100) -> Response:
        if not can_read(request):
            return _unauthorized()
        if state not in (None, "open", "closed") or not 1 <= limit <= 10_000:
            return JSONResponse({"detail": "state is open or closed; limit 1..10000"}, status_code=400)
        try:
            docs = await svc.store.list_docs("event", limit if state is None and job is None else 10_000)
        except Unavailable as exc:
            return _unavailable(exc)
        out = [d for d in docs if (state is None or d.get("state") == state) and (job is None or d.get("job") == job)]
        return JSONResponse([_event_summary(d) for d in out[:limit]])

    @app.get("/events/{event_id}")
    async def event(request: Request, event_id: str) -> Response:
        if not can_read(request):
            return _unauthorized()
        try:
            doc = await svc.store.get_event(event_id)
            if doc is None:
                return JSONResponse({"detail": f"no event {event_id}"}, status_code=404)
            acts = await svc.store.get_actions(doc.get("actions") or [])
        except Unavailable as exc:
            return _unavailable(exc)
        return JSONResponse({**_event_summary(doc), "alerts": doc.get("alerts"), "action_docs": acts})

    @app.get("/actions")
    async def actions(request: Request, job: str | None = None, state: str | None = None, limit: int = 100) -> Response:
        if not can_read(request):
            return _unauthorized()
        if (state is not None and state not in ACTION_STATES) or not 1 <= limit <= 10_000:
            return JSONResponse({"detail": f"state is one of {', '.join(ACTION_STATES)}; limit 1..10000"},
                                status_code=400)
        try:
            docs = await svc.store.list_docs("action", limit if state is None and job is None else 10_000)
        except Unavailable as exc:
            return _unavailable(exc)
        out = [d for d in docs if (state is None or d.get("state") == state) and (job is None or d.get("job") == job)]
        return JSONResponse(out[:limit])

    @app.get("/actions/{action_id}")
    async def action(request: Request, action_id: str) -> Response:
        if not can_read(request):
            return _unauthorized()
        try:
            doc = await svc.store.get_action(action_id)
        except Unavailable as exc:
            return _unavailable(exc)
        if doc is None:
            return JSONResponse({"detail": f"no action {action_id}"}, status_code=404)
        return JSONResponse(doc)

    @app.get("/audit")
    async def audit(request: Request, job: str | None = None, limit: int = 200, before: str | None = None) -> Response:
        if not can_read(request):
            return _unauthorized()
        if not 1 <= limit <= 10_000:
            return JSONResponse({"detail": "limit 1..10000"}, status_code=400)
        try:
            return JSONResponse(await svc.store.read_audit(limit, job, before))
        except Unavailable as exc:
            return _unavailable(exc)

    @app.get("/healthz")
    async def healthz() -> Response:
        body: dict[str, Any] = {"mode": settings.mode, "replica": svc.store.replica}
        try:
            await svc.store.ping()
            svc.metrics.redis_up.set(1)
            body["redis"] = True
        except Unavailable as exc:
            svc.metrics.redis_up.set(0)
            return JSONResponse({**body, "redis": False, "detail": str(exc)}, status_code=503)
        return JSONResponse(body)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(svc.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", response_class=HTMLResponse)
    async def status_page(request: Request) -> Response:
        if not can_read(request):
            return HTMLResponse(render_login(), status_code=401)
        health = {"prometheus": svc.prom_ok}
        try:
            evs = await svc.store.list_docs("event", 100)
            acts = await svc.store.list_docs("action", 100)
            aud = await svc.store.read_audit(40)
            health["redis"] = True
        except Unavailable:
            evs, acts, aud, health["redis"] = [], [], [], False
        html = render_status(mode=settings.mode, replica=svc.store.replica, events=evs, actions=acts, audit=aud,
                             health=health, now=svc.clock(), can_act=token.check(_supplied(request)))
        return HTMLResponse(html)

    @app.post("/login")
    async def login(request: Request) -> Response:
        try:
            raw = await _body(request, 4096)
        except _TooLarge:
            return JSONResponse({"detail": "body too large"}, status_code=413)
        supplied = urllib.parse.parse_qs(raw.decode(errors="replace")).get("token", [""])[0]
        if not token.check(supplied):
            return HTMLResponse(render_login("wrong token"), status_code=401)
        resp = RedirectResponse("/", status_code=303)
        resp.set_cookie(COOKIE, supplied, httponly=True, samesite="strict")
        return resp

    return WebhookFirst(app, alerts)


class WebhookFirst:
    """The ASGI application: ``POST /api/v1/alerts`` straight to its handler, everything else to FastAPI.

    The webhook is the hot path (every repeat of every firing group, from each Alertmanager of an HA pair);
    FastAPI's routing, dependency solving and middleware around the same handler cost 0.23 ms of CPU a request
    (a bare FastAPI echo against a bare ASGI one, 0.55 against 0.32 ms). The handler is the route FastAPI also
    serves (and documents); other methods and paths, and lifespan, are FastAPI's.

    Attributes:
        api: The FastAPI application (its routes, ``/docs``, the lifespan that runs the planner).
    """

    def __init__(self, api: FastAPI, alerts: Callable[[Request], Awaitable[Response]]) -> None:
        self.api = api
        self._alerts = alerts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != ALERTS_PATH:
            await self.api(scope, receive, send)
            return
        try:
            response = await self._alerts(Request(scope, receive))
        except Exception:
            log.exception("webhook delivery failed")
            response = JSONResponse({"detail": "internal error"}, status_code=500)
        await response(scope, receive, send)


def _errors(exc: ValidationError) -> list[dict[str, Any]]:
    """Validation errors as JSON (without the input, which may be huge, nor exception objects)."""
    return [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in exc.errors(include_url=False, include_input=False)[:20]]


def _event_summary(d: dict[str, Any]) -> dict[str, Any]:
    keep = ("id", "job", "state", "onset", "suspects", "level", "firing", "opened_at", "resolved_at", "closed_at",
            "close_reason", "pace_s", "healthy_s", "ratio", "lost_s", "spent_s", "actions", "last_decision",
            "manual", "adapter", "info", "validated", "labels", "overhead_s", "healthy_stage_s", "healthy_step_s",
            "compute_window_s", "compute_changed_ranks", "pace_suspects", "settling")
    return {k: d.get(k) for k in keep}

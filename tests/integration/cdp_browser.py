"""A real headless Chromium driven over its DevTools protocol, for testing the remediator's status page.

Why the protocol and not ``--dump-dom`` / ``--screenshot`` runs: signing in is a form post that sets an
HttpOnly *session* cookie, which a browser keeps only for its lifetime, so every one-shot Chromium run starts
signed out and cannot post a form. One Chromium process, started with ``--remote-debugging-port=0``, keeps
the cookie in memory; the test types the token into the login form and clicks the buttons with real input
events, and reads the DOM (what ``--dump-dom`` prints: the serialised document) and screenshots through
the same protocol. No new dependency: the WebSocket client below is the RFC 6455 subset the protocol needs
(one connection, text frames, client masking, ping/pong, continuation frames).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import requests

CHROMIUM = "/usr/bin/chromium"
# As root, on a closed network: no sandbox, no GPU, and nothing that phones home (refused connections stall it).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--force-device-scale-factor=1", "--mute-audio"]
_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class WebSocket:
    """A blocking WebSocket client connection (text messages only)."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        if not url.startswith("ws://"):
            raise ValueError(f"only ws:// URLs: {url}")
        hostport, _, path = url[5:].partition("/")
        host, _, port = hostport.partition(":")
        self.sock = socket.create_connection((host, int(port or 80)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        # No Origin header: Chromium refuses DevTools connections from origins it was not told to allow.
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError(f"handshake with {url}: connection closed: {buf!r}")
            buf += chunk
        head, _, self._buf = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        if not lines[0].startswith("HTTP/1.1 101"):
            raise ConnectionError(f"handshake with {url}: {lines[0]}")
        headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
        want = base64.b64encode(hashlib.sha1((key + _GUID).encode()).digest()).decode()
        if headers.get("sec-websocket-accept") != want:
            raise ConnectionError(f"handshake with {url}: bad Sec-WebSocket-Accept")

    def _frame(self) -> tuple[int, int, bytes]:
        """(first byte, opcode, payload) of the next frame. Bytes are taken off the buffer only once the frame
        is whole, so a socket timeout while waiting leaves the stream intact."""
        while True:
            whole = _parse_frame(self._buf)
            if whole is not None:
                b0, data, used = whole
                self._buf = self._buf[used:]
                return b0, b0 & 0x0F, data
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("websocket closed by the peer")
            self._buf += chunk

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack("!Q", n)
        mask = os.urandom(4)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def send(self, text: str) -> None:
        """Send one text message."""
        self._send_frame(0x1, text.encode())

    def recv(self) -> str:
        """The next text message (answers pings, joins continuation frames)."""
        parts: list[bytes] = []
        while True:
            b0, opcode, data = self._frame()
            if opcode == 0x9:
                self._send_frame(0xA, data)
                continue
            if opcode == 0x8:
                raise ConnectionError("websocket closed by the peer")
            if opcode in (0x0, 0x1, 0x2):
                parts.append(data)
                if b0 & 0x80:
                    return b"".join(parts).decode()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._send_frame(0x8, b"")
        self.sock.close()


def _parse_frame(buf: bytes) -> tuple[int, bytes, int] | None:
    """(first byte, unmasked payload, bytes used) of the frame at the start of `buf`; None while incomplete."""
    if len(buf) < 2:
        return None
    n, at = buf[1] & 0x7F, 2
    if n == 126:
        if len(buf) < 4:
            return None
        n, at = struct.unpack("!H", buf[2:4])[0], 4
    elif n == 127:
        if len(buf) < 10:
            return None
        n, at = struct.unpack("!Q", buf[2:10])[0], 10
    mask = b""
    if buf[1] & 0x80:
        if len(buf) < at + 4:
            return None
        mask, at = buf[at:at + 4], at + 4
    if len(buf) < at + n:
        return None
    data = buf[at:at + n]
    if mask:
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
    return buf[0], data, at + n


class CDPError(RuntimeError):
    """The browser answered a command with an error."""


@dataclass
class Chromium:
    """One headless Chromium process and a DevTools session on its first page."""

    proc: subprocess.Popen[bytes]
    profile: Path
    log: Path
    ws: WebSocket
    events: list[dict[str, Any]] = field(default_factory=list)
    _next: int = 0

    @classmethod
    def start(cls, workdir: Path, width: int, height: int, timeout: float = 30.0) -> Chromium:
        """Start Chromium with a new empty profile in `workdir`, in its own process group; connect to its page."""
        if not Path(CHROMIUM).is_file():
            raise RuntimeError(f"{CHROMIUM} is missing: apt-get install chromium")
        profile = workdir / "chromium-profile"
        profile.mkdir(parents=True)
        log = workdir / "chromium.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                                     f"--window-size={width},{height}", "about:blank"],
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            port_file = profile / "DevToolsActivePort"
            deadline = time.monotonic() + timeout
            while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"chromium did not open its DevTools port (exit {proc.poll()}):\n"
                                       f"{log.read_text()[-3000:]}")
                time.sleep(0.05)
            port = int(port_file.read_text().split()[0])
            pages = [t for t in requests.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
                     if t.get("type") == "page"]
            if not pages:
                raise RuntimeError("chromium has no page target")
            browser = cls(proc, profile, log, WebSocket(pages[0]["webSocketDebuggerUrl"], timeout))
            browser.call("Page.enable")
            browser.call("Network.enable")
            browser.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                         mobile=False)
            return browser
        except BaseException:
            kill_group(proc)
            raise

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Run one protocol command and return its result; events that arrive meanwhile are kept."""
        self._next += 1
        mid = self._next
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise CDPError(f"{method}: {msg['error']}")
                return dict(msg.get("result") or {})
            if "method" in msg:
                self.events.append(msg)

    def wait_event(self, method: str, timeout: float = 20.0) -> dict[str, Any]:
        """The first kept or coming event named `method` (taken out of `events`; the others stay)."""
        deadline = time.monotonic() + timeout
        while True:
            for i, ev in enumerate(self.events):
                if ev["method"] == method:
                    return self.events.pop(i)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout} s")
            self.ws.sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                msg = json.loads(self.ws.recv())
            except TimeoutError:
                continue
            finally:
                self.ws.sock.settimeout(30.0)
            if "method" in msg:
                self.events.append(msg)

    def navigate(self, url: str) -> None:
        """Load `url` and wait for its load event."""
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (for reading state, never for acting)."""
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in res:
            raise CDPError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def dom(self) -> str:
        """The serialised document, as ``chromium --dump-dom`` prints it.

        Read in one call: the status page refreshes itself (every 10 s), and a document replaced between
        ``DOM.getDocument`` and ``DOM.getOuterHTML`` leaves the second a node that is gone. A document the
        refresh has just committed has no element yet: it is read once it has loaded.
        """
        for _ in range(3):
            html = self.evaluate("document.documentElement && document.documentElement.outerHTML")
            if html:
                return str(html)
            self.wait_event("Page.loadEventFired")  # a refresh committed a document not parsed yet
        raise CDPError("the page kept replacing its document before it was parsed")

    def box(self, selector: str) -> tuple[float, float, float, float]:
        """(left, top, width, height) of the first element matching `selector`, in page pixels."""
        root = self.call("DOM.getDocument", depth=0)["root"]
        node = self.call("DOM.querySelector", nodeId=root["nodeId"], selector=selector)["nodeId"]
        if not node:
            raise LookupError(f"no element matches {selector!r}")
        quad = self.call("DOM.getBoxModel", nodeId=node)["model"]["border"]
        xs, ys = quad[0::2], quad[1::2]
        return min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)

    def click(self, selector: str) -> None:
        """A real left click (mouse moved, pressed, released) at the centre of the element."""
        x, y, w, h = self.box(selector)
        cx, cy = x + w / 2, y + h / 2
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=cx, y=cy)
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=cx, y=cy, button="left", clickCount=1)

    def type_text(self, text: str) -> None:
        """Type `text` into the focused element, one key event per character."""
        for ch in text:
            self.call("Input.dispatchKeyEvent", type="keyDown", text=ch, unmodifiedText=ch, key=ch)
            self.call("Input.dispatchKeyEvent", type="keyUp", key=ch)

    def screenshot(self, path: Path) -> bytes:
        """A PNG of the viewport, written to `path`."""
        png = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        path.write_bytes(png)
        return png

    def close(self) -> None:
        """Close the browser and kill its process group (renderers, zygotes) whatever state it is in."""
        with contextlib.suppress(Exception):
            self.call("Browser.close")
        with contextlib.suppress(OSError):
            self.ws.sock.close()
        kill_group(self.proc)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group `proc` leads, SIGKILL what is left after 5 s; reap `proc`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    deadline = time.monotonic() + 5
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def group_alive(pgid: int) -> list[int]:
    """PIDs of the processes of group `pgid` that still run (zombies waiting for init to reap them do not)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(d.name))
    return out


# ------------------------------------------------------------------ reading the page


@dataclass
class Row:
    """One table row: its class, its cells' text, and the forms in it as (method, action, button text)."""

    cls: str
    cells: list[str]
    forms: list[tuple[str, str, str]]
    header: bool


@dataclass
class Page:
    """What a person sees: the title, the paragraphs, and each section's (h2) table rows or muted note."""

    title: str = ""
    h1: str = ""
    paragraphs: list[str] = field(default_factory=list)
    sections: dict[str, list[Row]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    forms: list[dict[str, Any]] = field(default_factory=list)

    def section(self, prefix: str) -> tuple[str, list[Row]]:
        """(full heading, data rows) of the section whose heading starts with `prefix`."""
        for head, rows in self.sections.items():
            if head.startswith(prefix):
                return head, [r for r in rows if not r.header]
        raise LookupError(f"no section {prefix!r}: {list(self.sections)}")


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()
        self.stack: list[str] = []
        self.text: list[str] | None = None
        self.h2 = ""
        self.row: Row | None = None
        self.cell: list[str] | None = None
        self.form: dict[str, Any] | None = None
        self.p_class = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag in ("title", "h1", "h2", "p"):
            self.text = []
            self.p_class = a.get("class", "")
        elif tag == "tr":
            self.row = Row(a.get("class", ""), [], [], False)
        elif tag in ("td", "th") and self.row is not None:
            self.cell = []
            self.row.header = self.row.header or tag == "th"
        elif tag == "form":
            self.form = {"method": a.get("method", "get").lower(), "action": a.get("action", ""), "inputs": [],
                         "buttons": []}
        elif tag == "input" and self.form is not None:
            self.form["inputs"].append(a)
        elif tag == "button" and self.form is not None:
            self.form["buttons"].append(a)
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if self.stack and self.stack[-1] == tag:
            self.stack.pop()
        if tag in ("title", "h1", "h2", "p") and self.text is not None:
            t = " ".join("".join(self.text).split())
            if tag == "title":
                self.page.title = t
            elif tag == "h1":
                self.page.h1 = t
            elif tag == "h2":
                self.h2 = t
                self.page.sections.setdefault(t, [])
            elif self.p_class == "muted" and self.h2:
                self.page.notes[self.h2] = t
            else:
                self.page.paragraphs.append(t)
            self.text = None
        elif tag in ("td", "th") and self.cell is not None and self.row is not None:
            self.row.cells.append(" ".join("".join(self.cell).split()))
            self.cell = None
        elif tag == "tr" and self.row is not None:
            self.page.sections.setdefault(self.h2, []).append(self.row)
            self.row = None
        elif tag == "form" and self.form is not None:
            self.page.forms.append(self.form)
            if self.row is not None:
                label = " ".join(b.get("_text", "") for b in self.form["buttons"])
                self.row.forms.append((self.form["method"], self.form["action"], label))
            self.form = None

    def handle_data(self, data: str) -> None:
        if self.text is not None:
            self.text.append(data)
        if self.cell is not None:
            self.cell.append(data)
        if self.form is not None and self.stack and self.stack[-1] == "button" and self.form["buttons"]:
            self.form["buttons"][-1]["_text"] = self.form["buttons"][-1].get("_text", "") + data.strip()


def read_page(html: str) -> Page:
    """Parse a serialised status (or login) page into what a person reads off it."""
    r = _Reader()
    r.feed(html)
    r.close()
    return r.page

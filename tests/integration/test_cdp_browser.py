"""The test browser reads the DOM of a page that keeps replacing its document.

The status page refreshes itself every 10 s; a read that straddles a refresh must still return a whole
document. Reading it as ``DOM.getDocument`` then ``DOM.getOuterHTML`` failed there ("Could not find node with
given id", seen once in a `make test` run). Here the page reloads itself as fast as its server answers (0.1 s),
so almost every read straddles a reload: the two-call read failed 97 times of 100.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.integration.cdp_browser import Chromium, read_page

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PAGE = b"<!doctype html><meta http-equiv=refresh content=0><title>again</title><p>reloading"


class _Again(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        time.sleep(0.1)
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):  # the browser moved on to the next reload
            self.wfile.write(PAGE)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Again)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_the_dom_of_a_page_that_reloads_itself_reads_whole(site: str, tmp_path: Path) -> None:
    b = Chromium.start(tmp_path / "browser", 800, 600)
    try:
        b.navigate(site)
        for k in range(100):
            page = read_page(b.dom())
            assert (page.title, page.paragraphs) == ("again", ["reloading"]), (k, page)
            time.sleep(0.013)
    finally:
        b.close()

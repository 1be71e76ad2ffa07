"""Issue 29, item 14: the HTTP server bounds clients that drip their request head, answers
HEAD and OPTIONS, and never logs a request's query (it may hold the token)."""

from __future__ import annotations

import logging
import socket
import threading
import urllib.parse

import pytest

from tests.harness import poll_for
from tests.master.monitoring import monitored_core
from tests.master.test_http_api import SECRET, fetch
from weir.master.http_api import MAX_CONNECTIONS, HttpApi

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def api():
    core, _ = monitored_core()
    http = HttpApi(core, SECRET)
    http.start()
    try:
        yield http, core
    finally:
        http.stop()


def address(http: HttpApi) -> tuple[str, int]:
    url = urllib.parse.urlsplit(http.url)
    return url.hostname or "", url.port or 0


def raw_request(http: HttpApi, head: str) -> tuple[str, dict[str, str], bytes]:
    """Sends ``head`` as is; returns the status line, the headers and what followed them."""
    with socket.create_connection(address(http), timeout=10) as conn:
        conn.sendall(head.encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head_part, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head_part.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return status, headers, body


def drip(conn: socket.socket, stop: threading.Event) -> None:
    """A slow client: a request line, then a header line every second, never the end."""
    try:
        conn.sendall(b"GET /api/apps HTTP/1.0\r\n")
        while not stop.wait(1.0):
            conn.sendall(b"X-Drip: 1\r\n")
    except OSError:
        pass  # cut off by the server


@pytest.mark.slow
def test_clients_dripping_their_head_cannot_hold_every_slot():
    """(The head deadline is longer than the default here, so a loaded machine still sees
    every slot taken before it runs out.)"""
    core, _ = monitored_core()
    http = HttpApi(core, SECRET, head_deadline_s=15.0)
    http.start()
    stop = threading.Event()
    conns = [socket.create_connection(address(http), timeout=10)
             for _ in range(MAX_CONNECTIONS)]
    drippers = [threading.Thread(target=drip, args=(conn, stop), daemon=True)
                for conn in conns]
    try:
        for thread in drippers:
            thread.start()

        def answered() -> bool:
            try:
                return fetch(http.url + "api/apps")[0] == 200
            except OSError:
                return False  # closed at once: every slot is taken

        # the drippers hold every slot at first (a request is turned away, not queued) ...
        poll_for(lambda: not answered(), 10, "every slot to be taken by a dripping client")
        # ... but only until their head's deadline, not for the request's 30 s
        poll_for(answered, 25, "a normal request to be answered")
    finally:
        stop.set()
        for conn in conns:
            conn.close()
        for thread in drippers:
            thread.join(timeout=5)
        http.stop()


def test_head_is_answered_as_get_without_a_body(api):
    http, _ = api
    status, _, body = fetch(http.url + "api/apps")
    head_status, headers, rest = raw_request(
        http, f"HEAD /api/apps HTTP/1.0\r\nAuthorization: Bearer {SECRET}\r\n\r\n")
    assert status == 200 and head_status.split()[1] == "200"
    assert headers["Content-Type"] == "application/json"
    assert int(headers["Content-Length"]) == len(body) and rest == b""
    refused, _, rest = raw_request(http, "HEAD /api/apps HTTP/1.0\r\n\r\n")
    assert refused.split()[1] == "401" and rest == b""


def test_options_says_what_is_allowed_and_widens_nothing(api):
    http, _ = api
    status, headers, rest = raw_request(
        http, "OPTIONS /api/apps HTTP/1.0\r\nOrigin: http://elsewhere.example\r\n"
              "Access-Control-Request-Method: GET\r\n\r\n")
    assert status.split()[1] == "204" and rest == b""
    assert headers["Allow"] == "GET, HEAD, OPTIONS"
    assert not [name for name in headers if name.lower().startswith("access-control-")]
    assert fetch(http.url + "api/apps", method="POST")[1]["Allow"] == "GET, HEAD, OPTIONS"


def test_an_internal_error_logs_the_path_never_the_token(api, monkeypatch, caplog):
    http, core = api

    def broken() -> list:
        raise RuntimeError("the views failed")

    monkeypatch.setattr(core, "list_applications", broken)
    with caplog.at_level(logging.DEBUG, logger="weir.master.http_api"):
        status, _, _ = fetch(http.url + f"api/apps?token={SECRET}", secret=None)
    assert status == 500  # logged before it was answered
    assert "/api/apps" in caplog.text and "the views failed" in caplog.text
    assert SECRET not in caplog.text

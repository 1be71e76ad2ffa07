"""The master's HTTP side: a JSON API, the web dashboard and Prometheus' ``/metrics``.

Served from the master's process on a port of its own (``weir master --http-port``), with
the standard library's threading HTTP server: a few requests a second from a browser and
a scraper need nothing more. Every answer is built from the same messages as the gRPC
client API (``master.views``, via ``MasterCore``), turned into JSON by protobuf's own
mapping, so ``weir --json``, the API and the dashboard always agree.

Security: the API and the dashboard need the master's read-only HTTP token
(``master.auth.http_token``: derived from the secret, never the secret itself) unless
``open_api`` (``--http-open``): ``Authorization: Bearer <token>`` or ``?token=<token>``
(the dashboard's URL carries it and the page sends it on as a header); ``/metrics`` needs
it too unless ``open_metrics`` (``--metrics-open``). They show figures, never code or
data, but they name hosts, operators and errors. With the user's own certificate the
server speaks HTTPS with it.
"""

from __future__ import annotations

import hmac
import http.server
import json
import logging
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from importlib import resources
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from weir.master.core import MasterCore
from weir.master.errors import MasterError, NotFound
from weir.master.metrics import master_registry
from weir.master.tls import TlsFiles
from weir.proto import client_pb2
from weir.proto.contract import BEARER

__all__ = ["HttpApi"]

_LOGGER = logging.getLogger(__name__)

_WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}
_SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
_PAGE_POLICY = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                "form-action 'none'; frame-ancestors 'none'")
_UNAUTHORIZED_PAGE = """<!doctype html><meta charset="utf-8"><title>Weir: token needed</title>
<p>This Weir master needs its read-only HTTP token: open the URL that <code>weir run</code>
or <code>weir master</code> printed, or add <code>?token=TOKEN</code> (the
<code>http_token</code> in the master's secret file, <code>~/.weir/master-PORT.secret</code>;
never the secret itself).</p>"""


def _to_json(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


class _Route:
    def __init__(self, pattern: str, handler: Callable[..., Message], needs: str) -> None:
        self.pattern = re.compile(pattern)
        self.handler = handler
        self.needs = needs  # which permission: "api" or "metrics"


REQUEST_DEADLINE_S = 30.0
"""The whole of one request, read and answered: a client that sends (or reads) a byte
now and then, never silent for ``_Handler.timeout``, is still cut off."""

HEAD_DEADLINE_S = 5.0
"""The request line and headers (and the TLS handshake), all of them: a browser sends them
at once, so clients that drip a header line now and then are cut off within seconds and
cannot hold every one of the ``MAX_CONNECTIONS`` slots for long."""

_ALLOWED = "GET, HEAD, OPTIONS"


class HttpApi:
    """The HTTP server; ``start`` binds and serves from a thread, ``stop`` ends it.

    Args:
        core: the master's state.
        token: what callers must present (the master's read-only HTTP token).
        host, port: where to listen (port 0 = any free port).
        open_api: serve the API and the dashboard without the secret.
        open_metrics: serve ``/metrics`` without the secret.
        tls: serve HTTPS with this certificate and key.
        request_deadline_s: the whole of one request, read and answered.
        head_deadline_s: its request line and headers, read.
    """

    def __init__(self, core: MasterCore, token: str, host: str = "127.0.0.1", port: int = 0,
                 *, open_api: bool = False, open_metrics: bool = False,
                 tls: TlsFiles | None = None,
                 request_deadline_s: float = REQUEST_DEADLINE_S,
                 head_deadline_s: float = HEAD_DEADLINE_S) -> None:
        self.core = core
        self.request_deadline_s = request_deadline_s
        self.head_deadline_s = min(head_deadline_s, request_deadline_s)
        self._expected = token.encode()
        self.host, self.port = host, port
        self.open_api, self.open_metrics = open_api, open_metrics
        self.tls = tls
        self.registry = master_registry(core)
        self.url = ""
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.page = resources.files("weir.master").joinpath("dashboard.html").read_bytes()
        self.routes = [
            _Route(r"/api/apps", lambda: client_pb2.ListApplicationsResponse(
                applications=core.list_applications()), "api"),
            _Route(r"/api/apps/(?P<app>[^/]+)", core.application_info, "api"),
            _Route(r"/api/apps/(?P<app>[^/]+)/operators", lambda app: (
                client_pb2.ListOperatorsResponse(operators=core.list_operators(app))), "api"),
            _Route(r"/api/apps/(?P<app>[^/]+)/containers", lambda app: (
                client_pb2.ListContainersResponse(containers=core.list_containers(app))),
                "api"),
            _Route(r"/api/apps/(?P<app>[^/]+)/operators/(?P<operator>[^/]+)/windows",
                   core.operator_info, "api"),
            _Route(r"/api/apps/(?P<app>[^/]+)/plan", core.application_plan, "api"),
        ]

    @property
    def url_with_token(self) -> str:
        """The dashboard's URL with the token in it (for the person who started the master)."""
        if not self.url or self.open_api:
            return self.url
        return f"{self.url}?token={urllib.parse.quote(self._expected.decode(), safe='')}"

    def start(self) -> str:
        """Binds and serves; returns the base URL (``http://host:port/``).

        Raises:
            OSError: the address cannot be bound.
        """
        api = self

        class Handler(_Handler):
            pass

        Handler.api = api
        server_class = (_BoundedHTTPServerV6 if ":" in self.host.strip("[]")
                        else _BoundedHTTPServer)
        server = server_class((self.host.strip("[]") or "0.0.0.0", self.port), Handler)
        server.daemon_threads = True
        scheme = "http"
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(self.tls.cert), str(self.tls.key))
            # the handshake happens in the request's thread, not in the accepting one
            server.socket = context.wrap_socket(server.socket, server_side=True,
                                                do_handshake_on_connect=False)
            scheme = "https"
        host = "127.0.0.1" if self.host in _WILDCARD_HOSTS else self.host
        host = f"[{host}]" if ":" in host else host
        self.url = f"{scheme}://{host}:{server.server_address[1]}/"
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={
            "poll_interval": 0.2}, name="weir-master-http", daemon=True)
        self._thread.start()
        _LOGGER.info("dashboard, JSON API and /metrics on %s", self.url)
        return self.url

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._server = self._thread = None

    def allowed(self, needs: str, header: str | None, token: str | None) -> bool:
        """Whether a request for ``needs`` ("api" or "metrics") may be answered."""
        if (needs == "api" and self.open_api) or (needs == "metrics" and self.open_metrics):
            return True
        offered = ""
        if header and header.startswith(BEARER):
            offered = header[len(BEARER):].strip()
        elif token:
            offered = token
        return bool(offered) and hmac.compare_digest(offered.encode(), self._expected)


MAX_CONNECTIONS = 32
"""HTTP connections served at once: each has a thread; more are closed at once, so idle
connections cannot pile up threads in the master."""


class _BoundedHTTPServer(http.server.ThreadingHTTPServer):
    """A thread per connection, at most ``MAX_CONNECTIONS`` of them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            _LOGGER.debug("HTTP: %d connections open; one more from %s is closed",
                          MAX_CONNECTIONS, client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _BoundedHTTPServerV6(_BoundedHTTPServer):
    address_family = socket.AF_INET6


class _Handler(http.server.BaseHTTPRequestHandler):
    """One request: route, check the token, answer JSON, HTML or metrics text.

    HTTP/1.0: one request per connection, so the connection's deadlines are the
    request's: ``head_deadline_s`` for its head, ``request_deadline_s`` for all of it.
    ``HEAD`` is answered as ``GET`` without the body, ``OPTIONS`` with what is allowed
    (and nothing for other origins: no CORS).
    """

    api: HttpApi
    timeout = 10  # a silent client frees its thread
    server_version = "weir"
    sys_version = ""
    _head_only = False  # HEAD: headers as for GET, no body

    def setup(self) -> None:
        super().setup()
        self._started = time.monotonic()
        self._deadline = self._arm(self.api.head_deadline_s, "send its request head")

    def _arm(self, seconds: float, what: str) -> threading.Timer:
        """A timer that cuts the connection off unless cancelled within ``seconds``."""
        timer = threading.Timer(max(seconds, 0.0), self._cut_off, (what, seconds))
        timer.daemon = True
        timer.start()
        return timer

    def parse_request(self) -> bool:
        """Reads the headers under the head's deadline; then the rest of the request's
        deadline replaces it (one timer thread per connection at a time)."""
        parsed = super().parse_request()
        self._deadline.cancel()
        left = self.api.request_deadline_s - (time.monotonic() - self._started)
        self._deadline = self._arm(left, "be answered")
        return parsed

    def _cut_off(self, what: str, seconds: float) -> None:
        _LOGGER.debug("HTTP: a client at %s took over %.0f s to %s; closed",
                      self.client_address, seconds, what)
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def finish(self) -> None:
        self._deadline.cancel()
        try:
            super().finish()
        except OSError:
            pass

    def do_GET(self) -> None:  # noqa: N802 - the standard library's name
        try:
            self._get()
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception:  # noqa: BLE001 - one bad request must not take the server down
            # the path only: the query may hold the token
            _LOGGER.exception("HTTP %s %s failed", self.command, self._logged_path())
            self._json(500, {"error": "internal error; see the master's log"})

    def do_HEAD(self) -> None:  # noqa: N802
        """As GET, with the same status and headers (Content-Length too), no body."""
        self._head_only = True
        self.do_GET()

    def do_OPTIONS(self) -> None:  # noqa: N802
        """What may be asked: 204 with ``Allow``; no CORS headers, so other origins'
        pages are given nothing more than before."""
        self.send_response(204)
        for name, value in {**_SECURITY_HEADERS, "Allow": _ALLOWED}.items():
            self.send_header(name, value)
        self.end_headers()

    def _get(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        token = urllib.parse.parse_qs(url.query).get("token", [None])[0]
        header = self.headers.get("Authorization")
        path = url.path.rstrip("/") or "/"
        if path == "/healthz":  # for probes (Kubernetes): says nothing but whether it serves
            halted = self.api.core.halted
            self._send(503 if halted else 200, b"halted\n" if halted else b"ok\n",
                       "text/plain; charset=utf-8")
            return
        if path in ("/", "/index.html"):
            if not self.api.allowed("api", header, token):
                self._send(401, _UNAUTHORIZED_PAGE.encode(), "text/html; charset=utf-8")
                return
            self._send(200, self.api.page, "text/html; charset=utf-8",
                       {"Content-Security-Policy": _PAGE_POLICY})
            return
        if path == "/metrics":
            if not self.api.allowed("metrics", header, token):
                self._unauthorized()
                return
            self._send(200, generate_latest(self.api.registry), CONTENT_TYPE_LATEST)
            return
        for route in self.api.routes:
            match = route.pattern.fullmatch(path)
            if match is None:
                continue
            if not self.api.allowed(route.needs, header, token):
                self._unauthorized()
                return
            args = {k: urllib.parse.unquote(v) for k, v in match.groupdict().items()}
            try:
                message = route.handler(*args.values())
            except NotFound as exc:
                self._json(404, {"error": str(exc)})
                return
            except MasterError as exc:
                self._json(400, {"error": str(exc)})
                return
            self._json(200, _to_json(message))
            return
        self._json(404, {"error": f"no such resource {url.path!r}; the REST API's resources "
                                  "are in docs/operations/monitoring.md"})

    def do_POST(self) -> None:  # noqa: N802
        self._json(405, {"error": "the HTTP API is read-only; use `weir` to act"},
                   {"Allow": _ALLOWED})

    do_PUT = do_DELETE = do_PATCH = do_POST  # noqa: N815

    def _unauthorized(self) -> None:
        self._json(401, {"error": "this master needs its read-only HTTP token: send "
                                  "'Authorization: Bearer <token>' (or ?token=<token>); it is "
                                  "the http_token in the master's secret file"},
                   {"WWW-Authenticate": 'Bearer realm="weir"'})

    def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(body).encode(), "application/json", headers)

    def _send(self, status: int, body: bytes, content_type: str,
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in {**_SECURITY_HEADERS, **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if not self._head_only:
            self.wfile.write(body)

    def _logged_path(self) -> str:
        """The request's path without its query (which may hold the secret); a request
        line that could not be parsed has none yet."""
        return urllib.parse.urlsplit(getattr(self, "path", "") or "").path or "?"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
        _LOGGER.debug("HTTP %s %s", getattr(self, "command", None) or "?", self._logged_path())

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        _LOGGER.debug("HTTP %s %s -> %s", getattr(self, "command", None) or "?",
                      self._logged_path(), code)

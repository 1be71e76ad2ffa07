"""The master's HTTP side: the JSON API (the gRPC views as JSON), the page, /metrics, and
the secret on each."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from google.protobuf import json_format
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import poll_for
from tests.master.fakes import chain_descriptor
from tests.master.monitoring import WINDOWS, monitored_core
from weir.master import auth
from weir.master.client import WeirClient
from weir.master.http_api import MAX_CONNECTIONS, HttpApi
from weir.master.launcher import RecordingLauncher
from weir.master.server import MasterServer
from weir.master.tls import TlsFiles

pytestmark = pytest.mark.timeout(60)

SECRET = "s3cret-for-the-test"


@pytest.fixture
def api():
    core, app_id = monitored_core()
    http = HttpApi(core, SECRET)
    http.start()
    try:
        yield http, core, app_id
    finally:
        http.stop()


def fetch(url: str, *, secret: str | None = SECRET, method: str = "GET"
          ) -> tuple[int, dict[str, str], bytes]:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def get_json(url: str) -> dict:
    status, _, body = fetch(url)
    assert status == 200, body
    return json.loads(body)


def test_json_is_the_grpc_views(api):
    http, core, app_id = api
    base = http.url + f"api/apps/{app_id}"

    def as_dict(message):
        return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                          always_print_fields_with_no_presence=True)

    assert get_json(http.url + "api/apps")["applications"] == [
        as_dict(info) for info in core.list_applications()]
    app = get_json(base)
    assert app == as_dict(core.application_info(app_id))
    assert app["total_tuples_processed"] == str(WINDOWS * 150) and app["latency_ms"] == 50.0
    operators = get_json(base + "/operators")["operators"]
    assert [op["name"] for op in operators] == ["source", "relay1", "sink"]
    # int64 as a string, as the dashboard reads it: no watermark is -2^63
    assert {op["watermark_ms"] for op in operators} == {"-9223372036854775808"}
    assert get_json(base + "/containers")["containers"][0]["host"] == "testhost"
    windows = get_json(base + "/operators/relay1/windows")["recent_windows"]
    assert len(windows) == WINDOWS and windows[-1]["metrics"] == {"dropped": 500.0}
    assert get_json(base + "/operators/2/windows")["name"] == "relay1"  # by id too
    plan = get_json(base + "/plan")
    assert [(s["source_operator_id"], s["sink_operator_id"]) for s in plan["streams"]] == [
        (1, 2), (2, 3)]
    assert get_json(base + "/")["id"] == app_id  # a trailing slash is the same resource


def test_errors_are_json_with_a_status(api):
    http, _, app_id = api
    status, _, body = fetch(http.url + "api/apps/app-9999")
    assert status == 404 and "unknown application" in json.loads(body)["error"]
    status, _, body = fetch(http.url + f"api/apps/{app_id}/operators/nope/windows")
    assert status == 404 and "no operator 'nope'" in json.loads(body)["error"]
    assert fetch(http.url + "api/nothing")[0] == 404
    status, headers, _ = fetch(http.url + "api/apps", method="POST")
    assert status == 405 and headers["Allow"] == "GET, HEAD, OPTIONS"


@pytest.mark.parametrize("path", ["", "api/apps", "metrics"])
def test_everything_needs_the_secret_by_default(api, path):
    http, _, _ = api
    status, headers, _ = fetch(http.url + path, secret=None)
    assert status == 401
    assert fetch(http.url + path, secret="wrong")[0] == 401
    assert fetch(http.url + path)[0] == 200
    assert fetch(http.url + path + "?token=" + SECRET, secret=None)[0] == 200
    if path:
        assert headers["WWW-Authenticate"].startswith("Bearer")


def test_the_health_check_needs_no_secret_and_tells_only_whether_it_serves(api, monkeypatch):
    """For a Kubernetes probe: 200 while the master serves, 503 once its journal failed
    (it halted); nothing about its applications."""
    http, core, _ = api
    assert fetch(http.url + "healthz", secret=None)[::2] == (200, b"ok\n")
    monkeypatch.setattr(type(core), "halted", property(lambda _: "the journal failed"))
    assert fetch(http.url + "healthz", secret=None)[::2] == (503, b"halted\n")


def test_open_flags():
    core, _ = monitored_core()
    http = HttpApi(core, SECRET, open_metrics=True)
    http.start()
    try:
        assert fetch(http.url + "metrics", secret=None)[0] == 200
        assert fetch(http.url + "api/apps", secret=None)[0] == 401
        assert http.url_with_token == f"{http.url}?token={SECRET}"
    finally:
        http.stop()
    http = HttpApi(core, SECRET, open_api=True)
    http.start()
    try:
        assert fetch(http.url + "api/apps", secret=None)[0] == 200
        assert fetch(http.url, secret=None)[0] == 200
        assert fetch(http.url + "metrics", secret=None)[0] == 401
        assert http.url_with_token == http.url
    finally:
        http.stop()


def test_page_and_metrics(api):
    http, _, app_id = api
    status, headers, body = fetch(http.url)
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert headers["Referrer-Policy"] == "no-referrer"
    assert b'id="dag"' in body and b"/api/apps" in body
    status, headers, body = fetch(http.url + "metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert {"weir_application_latency_seconds", "weir_operator_tuples_processed",
            "weir_port_queue_size", "weir_container_cpu_percent"} <= names


def test_master_server_serves_it_and_tells_where(tmp_path):
    with MasterServer(launcher_factory=RecordingLauncher) as server:
        url = server.core.dashboard_url
        token = auth.http_token(server.secret)
        assert url.startswith("http://127.0.0.1:") and server.dashboard_url.startswith(url)
        assert token in server.dashboard_url and server.secret not in server.dashboard_url
        _, fields = auth.read_secret_file(server.secret_file)
        assert (fields["dashboard"], fields["http_token"]) == (url, token)
        with WeirClient(server.address) as client:
            client.submit(chain_descriptor(3), {})
            assert client.applications()[0].dashboard_url == url
        assert fetch(url + "api/apps", secret=token)[0] == 200
    with MasterServer(launcher_factory=RecordingLauncher, http_port=None) as server:
        assert server.core.dashboard_url == "" and server.dashboard_url == ""


def test_the_http_port_never_takes_the_secret_itself():
    """A browser sends its token to whoever holds the port (a dashboard tab polling a
    master that died): that token only reads figures; the secret is refused there."""
    with MasterServer(launcher_factory=RecordingLauncher) as server:
        url = server.core.dashboard_url
        assert fetch(url + "api/apps", secret=server.secret)[0] == 401
        assert fetch(url + "metrics", secret=server.secret)[0] == 401
        token = auth.http_token(server.secret)
        assert fetch(url + "metrics", secret=token)[0] == 200
        assert len(token) >= 43 and token != auth.http_token(server.secret + "x")
        assert fetch(url + "api/apps", secret=token, method="POST")[0] == 405  # read-only


def test_https_with_the_users_certificate(tls_files):
    import ssl

    cert, key = tls_files
    core, _ = monitored_core()
    http = HttpApi(core, SECRET, tls=TlsFiles(cert, key))
    http.start()
    try:
        assert http.url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(cert))
        request = urllib.request.Request(http.url + "api/apps",
                                         headers={"Authorization": f"Bearer {SECRET}"})
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            assert json.loads(response.read())["applications"]
    finally:
        http.stop()


def test_a_request_line_that_is_no_http_gets_400_without_a_traceback(api, capfd):
    http, _, _ = api
    host, port = urllib.parse.urlsplit(http.url).hostname, urllib.parse.urlsplit(http.url).port
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall(b"GARBAGE\r\n\r\n")
        answer = conn.recv(4096)
    assert b"400" in answer, answer  # one word: answered HTTP/0.9 style, the body alone
    time.sleep(0.2)  # the handler thread's logging, if any, is done
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.slow
def test_idle_connections_cannot_pile_up_threads(api):
    http, _, _ = api
    url = urllib.parse.urlsplit(http.url)
    idle = [socket.create_connection((url.hostname, url.port), timeout=10)
            for _ in range(MAX_CONNECTIONS + 3)]
    try:
        time.sleep(0.5)  # every connection accepted (or closed at once)
        serving = [t for t in threading.enumerate() if "process_request" in t.name]
        assert len(serving) <= MAX_CONNECTIONS
    finally:
        for conn in idle:
            conn.close()

    def answered() -> bool:
        try:
            return fetch(http.url + "api/apps")[0] == 200
        except urllib.error.URLError:
            return False  # a slot not given back yet: the connection was closed

    poll_for(answered, 10, "the closed connections' slots to come back")


def test_a_request_dripped_byte_by_byte_is_cut_off_at_its_deadline():
    """Issue 17, item 11: never silent for the idle timeout, still not kept forever."""
    core, _ = monitored_core()
    http = HttpApi(core, SECRET, request_deadline_s=1.0)
    http.start()
    url = urllib.parse.urlsplit(http.url)
    closed = False
    with socket.create_connection((url.hostname, url.port), timeout=10) as conn:
        conn.sendall(b"GET /api/apps HTTP/1.0\r\n")
        for _ in range(200):  # 60 s of dripping, far past the deadline
            try:
                conn.sendall(b"X")
                time.sleep(0.3)
                conn.setblocking(False)
                try:
                    closed = conn.recv(1) == b""
                except BlockingIOError:
                    pass
                finally:
                    conn.setblocking(True)
            except OSError:
                closed = True
            if closed:
                break
    http.stop()
    assert closed, "the server kept a dripping request open"

"""A Kubernetes API server for tests only (``KubernetesTestApi``), never a way to run
anything: core/v1 pods and secrets over HTTP and JSON, enough for the official ``kubernetes``
client (create, read, list with label and field selectors, delete, pod logs, watches that
resume from a resourceVersion), with a one-node kubelet (``tests/kubernetes_kubelet.py``)
that runs each pod's one container as a local process, so a launcher's pods really run.

What it does not model: isolation (none), images (ignored: the command runs on this machine
with its Python, its environment inherited under the container's ``env``, in this process's
working directory), restart policies other than Never, init containers, volumes other than
secret and emptyDir, ``$(VAR)`` expansion, authorization beyond one bearer token, updates
(PUT and PATCH answer 405). Its one liberty: each ``volumeMounts`` entry's ``mountPath`` is
rewritten, in the container's command, args and env values, to the volume's private folder
under the workdir (pods on one machine cannot share a real path such as /var/run/weir).
"""

from __future__ import annotations

import base64
import binascii
import copy
import hmac
import json
import re
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.kubernetes_kubelet import NODE_NAME, Kubelet, ObjectStore, now
from tests.kubernetes_validation import pod_errors, secret_errors, selector

if TYPE_CHECKING:
    import kubernetes.client

__all__ = ["NODE_NAME", "KubernetesTestApi", "kube_api"]

_STATIC = {
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/version": {"major": "1", "minor": "30", "gitVersion": "v1.30.0-weir-test",
                 "platform": "linux/amd64"},
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        {"name": name, "singularName": "", "namespaced": True, "kind": kind,
         "verbs": verbs} for name, kind, verbs in (
            ("pods", "Pod", ["create", "delete", "get", "list", "watch"]),
            ("pods/log", "Pod", ["get"]),
            ("secrets", "Secret", ["create", "delete", "get", "list", "watch"]))]},
}
_PATH = re.compile(r"/api/v1(?:/namespaces/(?P<ns>[^/]+))?/(?P<kind>pods|secrets)"
                   r"(?:/(?P<name>[^/]+)(?P<log>/log)?)?/?")
_KINDS = {"pods": "Pod", "secrets": "Secret"}
_SYSTEM_FIELDS = {"uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                  "deletionGracePeriodSeconds", "selfLink", "generation", "managedFields"}
_MAX_GRACE_S = 30


class ApiError(Exception):
    """Answered as a Kubernetes Status object."""

    def __init__(self, code: int, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.status = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                       "status": "Failure", "message": message, "reason": reason,
                       "code": code, **({"details": details} if details else {})}


def _not_found(kind: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{kind} "{name}" not found', name=name, kind=kind)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    api: KubernetesTestApi


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked watches, as the client expects
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read ``KubernetesTestApi.requests`` instead."""

    def setup(self) -> None:
        super().setup()
        self.server.api._connections.add(self.connection)

    def finish(self) -> None:
        self.server.api._connections.discard(self.connection)
        super().finish()

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        api = self.server.api
        api.requests.append((method, url.path))
        given = self.headers.get("Authorization", "").encode("latin-1", "replace")
        try:
            if not hmac.compare_digest(given, f"Bearer {api.token}".encode()):
                raise ApiError(401, "Unauthorized", "Unauthorized")
            query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            self._route(method, url.path, query, body)
        except ApiError as exc:
            self._send(exc.status["code"], exc.status)
        except Exception as exc:  # a bug of the fixture: say so to the client
            self._send(500, ApiError(500, "InternalError", f"{type(exc).__name__}: {exc}").status)

    def _send(self, code: int, payload: Any, content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str, path: str, query: dict[str, str], body: bytes) -> None:
        if path in _STATIC:
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on {path}")
            return self._send(200, _STATIC[path])
        match = _PATH.fullmatch(path)
        if match is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns, kind, name, log = match.group("ns", "kind", "name", "log")
        if ns is None and (name or method != "GET"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        api = self.server.api
        if log and kind != "pods":
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if method == "GET" and name is None:
            matches = selector(query.get("labelSelector"), query.get("fieldSelector"))
            if query.get("watch", "").lower() in {"true", "1"}:
                return self._watch(kind, ns, query, matches)
            with api._store.cond:
                items = [copy.deepcopy(o) for o in api._store.items(kind, ns) if matches(o)]
                return self._send(200, {"kind": f"{_KINDS[kind]}List", "apiVersion": "v1",
                                        "metadata": {"resourceVersion": str(api._store.version)},
                                        "items": items})
        if method == "POST" and name is None:
            return self._send(201, api._create(kind, ns, _json(body)))
        if method == "GET" and log:
            return self._send(200, api._log(ns, name, query.get("tailLines")).encode(),
                              "text/plain; charset=utf-8")
        if method == "GET" and name:
            with api._store.cond:
                obj = api._store.get(kind, ns, name)
                if obj is None:
                    raise _not_found(kind, name)
                return self._send(200, copy.deepcopy(obj))
        if method == "DELETE" and name and not log:
            return self._send(200, api._delete(kind, ns, name, query, body))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on {path}")

    def _watch(self, kind: str, ns: str | None, query: dict[str, str],
               matches: Callable[[dict[str, Any]], bool]) -> None:
        """A chunked stream of events, one JSON line each, until timeoutSeconds or stop."""
        store = self.server.api._store
        try:
            timeout = min(int(query.get("timeoutSeconds") or 300), 1800)
            since = query.get("resourceVersion") or "0"
            cursor = int(since)
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"invalid watch parameter: {exc}") from exc
        deadline = time.monotonic() + timeout
        with store.cond:
            backlog = []
            if since == "0":  # no version: the current objects first, as ADDED
                backlog = [{"type": "ADDED", "object": copy.deepcopy(obj)}
                           for obj in store.items(kind, ns) if matches(obj)]
                cursor = store.version
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for event in backlog:
                self._chunk(event)
            for event in self._changes(store, kind, ns, matches, cursor, deadline):
                self._chunk(event)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client went away
            self.close_connection = True

    def _changes(self, store: ObjectStore, kind: str, ns: str | None,
                 matches: Callable[[dict[str, Any]], bool], cursor: int,
                 deadline: float) -> Iterator[dict[str, Any]]:
        while True:
            with store.cond:
                while True:
                    if cursor < store.oldest:
                        gone = ApiError(410, "Expired", f"too old resource version: {cursor} "
                                        f"({store.oldest})")
                        yield {"type": "ERROR", "object": gone.status}
                        return
                    changes = store.since(cursor)
                    left = deadline - time.monotonic()
                    if changes or store.closed or left <= 0:
                        break
                    store.cond.wait(left)
            for change in changes:
                meta = change.object["metadata"]
                if change.kind == kind and ns in (None, meta["namespace"]) and matches(
                        change.object):
                    yield {"type": change.type, "object": change.object}
                cursor = change.version
            if store.closed or time.monotonic() >= deadline:
                return

    def _chunk(self, event: dict[str, Any]) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))


def _json(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body or b"{}")
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"the body is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ApiError(400, "BadRequest", "the body is not a JSON object")
    return value


class KubernetesTestApi:
    """A Kubernetes API server for tests only, on 127.0.0.1, with one node ("weir-test-node",
    ``node_memory_mb`` and ``node_cores``) whose kubelet runs pods as local processes (see
    the module's docstring for what is modelled). ``requests`` holds (method, URL path
    without its query) of every request, refused ones included."""

    def __init__(self, workdir: Path, *, node_memory_mb: int = 16384,
                 node_cores: float = 8.0) -> None:
        self.workdir = Path(workdir)
        self.token = secrets.token_urlsafe(24)
        self.url = ""
        self.requests: list[tuple[str, str]] = []
        self._store = ObjectStore()
        self._kubelet = Kubelet(self._store, self.workdir, node_memory_mb * 2**20, node_cores)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

    def start(self) -> KubernetesTestApi:
        """Serves on a free port of 127.0.0.1 (``url``)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.api = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,),
                                        name="kubernetes-test-api", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """SIGKILLs every pod's process group (and waits for them), ends the watches and
        the connections, stops serving. Idempotent."""
        self._kubelet.stop()
        with self._store.cond:
            self._store.closed = True
            self._store.cond.notify_all()
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        for connection in list(self._connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> KubernetesTestApi:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def configuration(self) -> kubernetes.client.Configuration:
        """A client configuration for this server and its token."""
        import kubernetes.client

        config = kubernetes.client.Configuration()
        config.host = self.url
        config.api_key = {"authorization": self.token}
        config.api_key_prefix = {"authorization": "Bearer"}
        return config

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig (JSON, which is YAML) whose current context is this server, its token
        and ``namespace``; owner-only, as it holds the token."""
        path = Path(path)
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "weir-test",
            "clusters": [{"name": "weir-test", "cluster": {"server": self.url}}],
            "users": [{"name": "weir-test", "user": {"token": self.token}}],
            "contexts": [{"name": "weir-test", "context": {
                "cluster": "weir-test", "user": "weir-test", "namespace": namespace}}]}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(json.dumps(config, indent=1))
        return path

    def pods(self, namespace: str) -> list[dict[str, Any]]:
        with self._store.cond:
            return copy.deepcopy(self._store.items("pods", namespace))

    def secrets(self, namespace: str) -> list[dict[str, Any]]:
        with self._store.cond:
            return copy.deepcopy(self._store.items("secrets", namespace))

    def pod_log(self, namespace: str, name: str) -> str:
        """The output (stdout and stderr) so far of the latest pod of that name, even gone."""
        log = self._kubelet.logs.get((namespace, name))
        return log.read_bytes().decode(errors="replace") if log and log.exists() else ""

    def pod_pid(self, namespace: str, name: str) -> int | None:
        """The pid of the pod's process while it runs (it leads the pod's process group)."""
        with self._store.cond:
            pod = self._store.get("pods", namespace, name)
            running = pod and self._kubelet.containers.get(pod["metadata"]["uid"])
            return running.proc.pid if running and running.proc.returncode is None else None

    def evict(self, namespace: str, name: str,
              message: str = "The node was low on resource: memory.") -> None:
        """As the kubelet under pressure: SIGKILLs the group, the pod stays as Failed, reason
        Evicted. Returns once the process is reaped. KeyError if there is no such pod."""
        self._kubelet.end(namespace, name, message)

    def vanish(self, namespace: str, name: str) -> None:
        """As a lost node's pod, garbage-collected: SIGKILLs the group, the object goes (a
        DELETED event). Returns once the process is reaped. KeyError if there is no such pod."""
        self._kubelet.end(namespace, name, None)

    def _create(self, kind: str, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            raise ApiError(422, "Invalid", f"{_KINDS[kind]} is invalid: metadata: Required")
        if meta.get("namespace") not in (None, ns):
            raise ApiError(400, "BadRequest", "the namespace of the provided object does not "
                           "match the namespace sent on the request")
        name = meta.get("name") or meta.get("generateName", "") + secrets.token_hex(3)[:5]
        errors = (pod_errors if kind == "pods" else secret_errors)(name, obj)
        if errors:
            raise ApiError(422, "Invalid", f'{_KINDS[kind]} "{name}" is invalid: '
                           + "; ".join(errors), name=name, kind=_KINDS[kind])
        meta = {k: v for k, v in meta.items() if k not in _SYSTEM_FIELDS} | {
            "name": name, "namespace": ns, "uid": str(uuid.uuid4()),
            "creationTimestamp": now()}
        if kind == "pods":
            spec = obj["spec"] | {"terminationGracePeriodSeconds": obj["spec"].get(
                "terminationGracePeriodSeconds", 30)}
            obj = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
                   "status": {"phase": "Pending"}}
        else:
            data = dict(obj.get("data") or {}) | {
                k: base64.b64encode(v.encode()).decode()
                for k, v in (obj.get("stringData") or {}).items()}
            obj = {"apiVersion": "v1", "kind": "Secret", "metadata": meta,
                   "type": obj.get("type") or "Opaque", "data": data} | (
                {"immutable": obj["immutable"]} if "immutable" in obj else {})
        with self._store.cond:
            if self._store.get(kind, ns, name) is not None:
                raise ApiError(409, "AlreadyExists", f'{kind} "{name}" already exists',
                               name=name, kind=kind)
            self._store.record(kind, obj, "ADDED")
            created = copy.deepcopy(obj)
            self._kubelet.sync()  # a new pod may start; a new secret may unblock one
        return created

    def _delete(self, kind: str, ns: str, name: str, query: dict[str, str],
                body: bytes) -> dict[str, Any]:
        options = _json(body) if body.strip() else {}
        with self._store.cond:
            obj = self._store.get(kind, ns, name)
            if obj is None:
                raise _not_found(kind, name)
            if kind == "pods":
                grace = query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
                if grace is None:
                    grace = obj["spec"]["terminationGracePeriodSeconds"]
                try:
                    grace = min(max(int(grace), 0), _MAX_GRACE_S)
                except (TypeError, ValueError) as exc:
                    raise ApiError(400, "BadRequest", f"gracePeriodSeconds: {exc}") from exc
                return self._kubelet.delete(obj, grace)
            self._store.record(kind, obj, "DELETED")
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": {"name": name, "kind": kind, "uid": obj["metadata"]["uid"]}}

    def _log(self, ns: str, name: str, tail: str | None) -> str:
        with self._store.cond:
            pod = self._store.get("pods", ns, name)
            if pod is None:
                raise _not_found("pods", name)
            container = pod["spec"]["containers"][0]["name"]
            if pod["metadata"]["uid"] not in self._kubelet.started:
                raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" '
                               "is waiting to start: ContainerCreating")
        text = self.pod_log(ns, name)
        if tail is not None:
            try:
                lines = int(tail)
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f"tailLines: {exc}") from exc
            text = "".join(text.splitlines(keepends=True)[-lines:] if lines > 0 else [])
        return text


@pytest.fixture
def kube_api(tmp_path: Path) -> Iterator[KubernetesTestApi]:
    """A started KubernetesTestApi (workdir ``tmp_path / "kube"``), stopped afterwards."""
    with KubernetesTestApi(tmp_path / "kube") as api:
        yield api

"""A Kubernetes API server for tests only (``KubernetesTestApi``), never a way to run
anything: core/v1 pods and secrets over HTTP and JSON, enough for the official ``kubernetes``
client (create, read, list with label and field selectors, delete, pod logs, watches that
resume from a resourceVersion), with a one-node kubelet (``tests/kubernetes_kubelet.py``)
that runs each pod's one container as a local process, so a launcher's pods really run.

What it does not model: isolation (none), images (ignored: the command runs on this machine
with its Python, its environment inherited under the container's ``env``, in this process's
working directory), restart policies other than Never, init containers, volumes other than
secret and emptyDir, ``$(VAR)`` expansion, authorization beyond one bearer token, updates
(PUT and PATCH answer 405), subresources but ``log``, deleting collections; other fields
(probes, nodeSelector, a container's securityContext...) are kept and ignored. What it
does model of what breaks launchers: Secret volumes laid out as the kubelet's
AtomicWriter does (``..data`` links; the pod's ``fsGroup`` as the files' group, 0400
shown as 0440), eviction, a pod garbage-collected (``vanish``), and a lost node
(``lose_node``: the process freezes and the API hears nothing more, no DELETED; a
graceful delete then leaves the pod Terminating, a force delete removes the object while
the process stays, and ``restore_node`` lets it go on until the returning kubelet kills
it). Its one liberty: each
``volumeMounts`` entry's ``mountPath`` is rewritten, in the container's command, args and env
values, to the volume's private folder under the workdir (pods on one machine cannot share a
real path such as /var/run/weir).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import functools
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

from tests import kubernetes_kubelet as node

if TYPE_CHECKING:
    import kubernetes.client

__all__ = ["KubernetesTestApi", "kube_api"]

_STATIC = {
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/version": {"major": "1", "minor": "30", "gitVersion": "v1.30.0-weir-test", "gitCommit": "",
                 "gitTreeState": "clean", "buildDate": "2024-04-17T00:00:00Z", "goVersion": "",
                 "compiler": "gc", "platform": "linux/amd64"},  # the client requires each
}
_PATH = re.compile(r"/api/v1(?:/namespaces/(?P<ns>[^/]+))?/(?P<kind>pods|secrets)"
                   r"(?:/(?P<name>[^/]+)(?P<log>/log)?)?/?")
_KINDS = {"pods": "Pod", "secrets": "Secret"}
_CLIENT_META = ("generateName", "labels", "annotations", "ownerReferences")  # kept, not set
_MAX_GRACE_S = 30
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_KEY = re.compile(r"[-._a-zA-Z0-9]+")


class ApiError(Exception):
    """Answered as a Kubernetes Status object."""

    def __init__(self, code: int, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.status = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                       "status": "Failure", "message": message, "reason": reason,
                       "code": code, **({"details": details} if details else {})}


def _errors(kind: str, name: str, obj: dict[str, Any]) -> list[str]:
    """Why the API server would refuse this object (422): its name, labels, secret data and
    (``node.pod_errors``) pod spec."""
    errors = node.invalid("metadata.name", name, _SUBDOMAIN, 253)
    for key, value in (obj["metadata"].get("labels") or {}).items():
        prefix, _, part = key.rpartition("/")
        errors += node.invalid("metadata.labels", prefix, _SUBDOMAIN, 253) if prefix else []
        errors += node.invalid("metadata.labels", part, _LABEL_PART, 63)
        errors += node.invalid(f"metadata.labels[{key}]", value, _LABEL_PART, 63) \
            if value != "" else []
    if kind == "pods":
        return errors + node.pod_errors(obj)
    for key, value in (obj.get("data") or {}).items():
        errors += node.invalid("data", key, _KEY, 253)
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, TypeError, ValueError) as exc:
            errors.append(f"data[{key}]: Invalid value: not base64: {exc}")
    return errors


def _int(value: object, what: str) -> int:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError) as exc:
        raise ApiError(400, "BadRequest", f"{what}: {exc}") from exc


_TERM = re.compile(r"\s*(!?)\s*([^\s!=]+)\s*(?:(==|=|!=)\s*([^\s!=]*))?\s*")
_SELECTABLE = {"metadata.name", "metadata.namespace", "status.phase", "spec.nodeName"}


def selector(labels: str | None, fields: str | None) -> Callable[[dict[str, Any]], bool]:
    """What a labelSelector (terms ``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``) and a
    fieldSelector (the first three, on a few fields) keep; 400 for other terms (set-based)."""
    terms = []
    for text, of_fields in ((labels, False), (fields, True)):
        for term in filter(str.strip, (text or "").split(",")):
            match = _TERM.fullmatch(term)
            if match is None or (match[1] and match[3]) or of_fields and (
                    not match[3] or match[2] not in _SELECTABLE):
                raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}: the "
                               "test API takes =, ==, != and (for labels) existence terms")
            terms.append((of_fields, *match.groups()))

    def matches(obj: dict[str, Any]) -> bool:
        labels = obj["metadata"].get("labels") or {}
        for of_fields, negated, key, op, value in terms:
            actual = functools.reduce(lambda d, k: (d or {}).get(k), key.split("."), obj) \
                if of_fields else labels.get(key)
            if op is None and (key in labels) == bool(negated):
                return False
            if op is not None and ((actual or "") == value) == (op == "!="):
                return False
        return True
    return matches


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

    def _serve(self) -> None:
        method, url = self.command, urlsplit(self.path)
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

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve

    def _send(self, code: int, payload: Any, content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str, path: str, query: dict[str, str], body: bytes) -> None:
        if path.rstrip("/") in _STATIC:  # the client asks for /version/
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on {path}")
            return self._send(200, _STATIC[path.rstrip("/")])
        match = _PATH.fullmatch(path)
        ns, kind, name, log = match.group("ns", "kind", "name", "log") if match else [None] * 4
        if match is None or ns is None and (name or method != "GET") or log and kind != "pods":
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        api = self.server.api
        if method == "GET" and name is None:
            matches = selector(query.get("labelSelector"), query.get("fieldSelector"))
            if query.get("watch", "").lower() in {"true", "1"}:
                return self._watch(kind, ns, query, matches)
            with api._store.cond:  # copied under the lock, sent after it
                items = [copy.deepcopy(o) for o in api._store.items(kind, ns) if matches(o)]
                listed = {"kind": f"{_KINDS[kind]}List", "apiVersion": "v1", "items": items,
                          "metadata": {"resourceVersion": str(api._store.version)}}
            return self._send(200, listed)
        if method == "POST" and name is None:
            return self._send(201, api._create(kind, ns, _json(body)))
        if method == "GET" and log:
            return self._send(200, api._log(ns, name, query.get("tailLines")).encode(),
                              "text/plain; charset=utf-8")
        if method == "GET" and name:
            with api._store.cond:
                obj = copy.deepcopy(api._get(kind, ns, name))
            return self._send(200, obj)
        if method == "DELETE" and name and not log:
            return self._send(200, api._delete(kind, ns, name, query, body))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on {path}")

    def _watch(self, kind: str, ns: str | None, query: dict[str, str],
               matches: Callable[[dict[str, Any]], bool]) -> None:
        """A chunked stream of events, one JSON line each, until timeoutSeconds or stop."""
        store = self.server.api._store
        timeout = min(_int(query.get("timeoutSeconds") or 300, "timeoutSeconds"), 1800)
        since = query.get("resourceVersion") or "0"
        cursor = _int(since, "resourceVersion")
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

    def _changes(self, store: node.ObjectStore, kind: str, ns: str | None,
                 matches: Callable[[dict[str, Any]], bool], cursor: int,
                 deadline: float) -> Iterator[dict[str, Any]]:
        while True:
            with store.cond:  # events are taken under the lock, written after it
                while not (expired := cursor < store.oldest):
                    changes = store.since(cursor)
                    left = deadline - time.monotonic()
                    if changes or store.closed or left <= 0:
                        break
                    store.cond.wait(left)
            if expired:
                yield {"type": "ERROR", "object": ApiError(410, "Expired", "too old resource "
                                                           f"version: {cursor}").status}
                return
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
    with contextlib.suppress(ValueError):
        if isinstance(value := json.loads(body or b"{}"), dict):
            return value
    raise ApiError(400, "BadRequest", "the body is not a JSON object")


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
        self._store = node.ObjectStore()
        self._kubelet = node.Kubelet(self._store, self.workdir, node_memory_mb * 2**20, node_cores)
        self._server: _Server | None = None
        self._thread = threading.Thread()
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
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        server.server_close()
        self._thread.join(5)

    def __enter__(self) -> KubernetesTestApi:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def configuration(self) -> kubernetes.client.Configuration:
        """A client configuration for this server and its token."""
        import kubernetes.client

        return kubernetes.client.Configuration(host=self.url, api_key={"authorization": self.token},
                                               api_key_prefix={"authorization": "Bearer"})

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

    def lose_node(self, namespace: str, name: str) -> None:
        """As when the pod's node is lost: its process freezes and the API hears nothing
        more of it (no DELETED); a force delete then removes the object while the process
        stays. KeyError if the pod has no process."""
        self._kubelet.lose_node(namespace, name)

    def restore_node(self, namespace: str, name: str) -> None:
        """The lost node is back: the pod's process goes on; if its pod was deleted
        meanwhile, the kubelet kills it a moment later."""
        self._kubelet.restore_node(namespace, name)

    def _create(self, kind: str, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict) or meta.get("namespace") not in (None, ns):
            raise ApiError(400, "BadRequest", "metadata: not an object, or the namespace of the "
                           "object does not match the namespace sent on the request")
        name = meta.get("name") or (meta["generateName"] + secrets.token_hex(3)[:5]
                                    if meta.get("generateName") else "")
        errors = _errors(kind, name, obj)
        if errors:
            raise ApiError(422, "Invalid", f'{_KINDS[kind]} "{name}" is invalid: '
                           + "; ".join(errors), name=name, kind=_KINDS[kind])
        meta = {k: meta[k] for k in _CLIENT_META if k in meta} | {
            "name": name, "namespace": ns, "uid": str(uuid.uuid4()),
            "creationTimestamp": node.now()}
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

    def _get(self, kind: str, ns: str, name: str) -> dict[str, Any]:
        obj = self._store.get(kind, ns, name)
        if obj is None:
            raise ApiError(404, "NotFound", f'{kind} "{name}" not found', name=name, kind=kind)
        return obj

    def _delete(self, kind: str, ns: str, name: str, query: dict[str, str],
                body: bytes) -> dict[str, Any]:
        options = _json(body) if body.strip() else {}
        with self._store.cond:
            obj = self._get(kind, ns, name)
            if kind == "pods":
                grace = query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
                grace = obj["spec"]["terminationGracePeriodSeconds"] if grace is None else grace
                grace = min(max(_int(grace, "gracePeriodSeconds"), 0), _MAX_GRACE_S)
                return self._kubelet.delete(obj, grace)
            self._store.record(kind, obj, "DELETED")
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": {"name": name, "kind": kind, "uid": obj["metadata"]["uid"]}}

    def _log(self, ns: str, name: str, tail: str | None) -> str:
        with self._store.cond:
            pod = self._get("pods", ns, name)
            if not (node.pod_folder(self.workdir, pod) / "log").exists():
                raise ApiError(400, "BadRequest", f'pod "{name}" is waiting to start')
        lines = self.pod_log(ns, name).splitlines(keepends=True)
        keep = len(lines) if tail is None else max(_int(tail, "tailLines"), 0)
        return "".join(lines[len(lines) - keep:] if keep else [])


@pytest.fixture
def kube_api(tmp_path: Path) -> Iterator[KubernetesTestApi]:
    """A started KubernetesTestApi (workdir ``tmp_path / "kube"``), stopped afterwards."""
    with KubernetesTestApi(tmp_path / "kube") as api:
        yield api

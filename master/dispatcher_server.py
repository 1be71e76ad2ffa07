"""The dispatcher's gRPC server: the client API (``proto/client.proto``), with the user's
secret, answered by ``master.dispatcher.Dispatcher``. It serves no umbilical: containers
heartbeat to their own application master.

Every client method is one handler here: the submit and the listings are the
dispatcher's own; every other call names an application (or, ``KillContainer``, a
container, whose id begins with its application's) and is forwarded to that
application's master. The request is parsed (and held to its size limit) first, so a
malformed one is refused here, not forwarded.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import message_factory

from weir.master import auth
from weir.master.dispatcher import Dispatcher
from weir.master.errors import MasterError
from weir.master.rpc import _CODES, SERVER_OPTIONS, RequestGuard
from weir.master.tls import identity_for, read_pem
from weir.proto import client_pb2
from weir.storage.private_files import make_private_dir

__all__ = ["DispatcherServer"]

_LOGGER = logging.getLogger("weir.master.dispatcher")
_SERVICE = client_pb2.DESCRIPTOR.services_by_name["WeirClient"]


class _Handlers(grpc.GenericRpcHandler):
    """``/weir.v1.WeirClient/<Method>``: parsed, then the dispatcher's or forwarded."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self._handlers: dict[str, Any] = {}
        for method in _SERVICE.methods:
            request_type = message_factory.GetMessageClass(method.input_type)
            path = f"/{_SERVICE.full_name}/{method.name}"
            self._handlers[path] = grpc.unary_unary_rpc_method_handler(
                self._behaviour(method.name), request_deserializer=request_type.FromString,
                response_serializer=lambda response: response.SerializeToString())

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        return self._handlers.get(handler_call_details.method)

    def _behaviour(self, name: str) -> Callable[[Any, grpc.ServicerContext], Any]:
        dispatcher = self.dispatcher
        own: dict[str, Callable[[Any], Any]] = {
            "SubmitApplication": dispatcher.submit,
            "ListApplications": lambda _request: dispatcher.list_applications(),
            "ListContainers": dispatcher.list_containers}

        def behaviour(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                if name in own:
                    return own[name](request)
                return dispatcher.forward(name, request)
            except MasterError as exc:
                code = next((c for kind, c in _CODES if isinstance(exc, kind)),
                            grpc.StatusCode.FAILED_PRECONDITION)
                context.abort(code, str(exc))
            except Exception as exc:  # noqa: BLE001 - a bug must still answer the caller
                _LOGGER.exception("%s failed", name)
                context.abort(grpc.StatusCode.INTERNAL,
                              f"internal error in the dispatcher: {type(exc).__name__}: {exc}")
        return behaviour


def advertise_host_for(host: str) -> str:
    """The host clients are told: a wildcard listens everywhere, loopback included."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


class DispatcherServer:
    """``weir master --application-masters``: the dispatcher listening with TLS and the
    user's secret (kept in ``state_dir/secret``), its secret file published for ``weir``
    on this machine.

    Args:
        state_dir: its folder (the dispatcher's journal, each application's folder).
        launcher, launcher_options, env: each application master's (``Dispatcher``).
        secret: what every call must carry (default: the kept one, else a new one).
    """

    def __init__(self, state_dir: str | Path, host: str = "127.0.0.1", port: int = 0, *,
                 launcher: str = "local", launcher_options: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None, secret: str | None = None,
                 advertise_host: str | None = None, publish_secret: bool = True,
                 start_timeout_s: float = 60.0) -> None:
        self.state_dir = Path(state_dir)
        make_private_dir(str(self.state_dir), "the dispatcher's folder",
                         advice="give --state-dir a folder of your own")
        self.host, self.port = host, port
        self.secret = secret.strip() if secret else auth.kept_secret(
            self.state_dir, "the dispatcher's kept secret",
            "give --state-dir a folder of your own")
        self.dispatcher = Dispatcher(self.state_dir, launcher, launcher_options, env=env,
                                     host=host, advertise_host=advertise_host,
                                     start_timeout_s=start_timeout_s)
        self.publish_secret = publish_secret
        self.secret_file: Path | None = None
        self.address = ""
        self.tls = identity_for(self.state_dir / "tls")
        self._server: grpc.Server | None = None
        self._lock = threading.Lock()

    def start(self) -> str:
        """Binds, takes back the journaled applications, serves; returns ``host:port``."""
        with self._lock:
            server = grpc.server(
                concurrent.futures.ThreadPoolExecutor(max_workers=16,
                                                      thread_name_prefix="weir-dispatcher"),
                options=SERVER_OPTIONS,
                interceptors=[auth.AuthInterceptor(self.secret), RequestGuard()])
            server.add_generic_rpc_handlers((_Handlers(self.dispatcher),))
            bound = server.add_secure_port(f"{self.host}:{self.port}",
                                           self.tls.server_credentials())
            if not bound:
                raise OSError(f"the dispatcher cannot listen on {self.host}:{self.port}")
            self.dispatcher.restore()
            server.start()
            self.dispatcher.start_watching()
            shown = advertise_host_for(self.host)
            self.address = f"{shown}:{bound}"
            self._server = server
            if self.publish_secret:
                path = auth.secret_path(bound)
                auth.write_secret_file(path, self.address, self.secret, read_pem(self.tls.trusted))
                self.secret_file = path
            _LOGGER.info("dispatcher listening on %s (application masters in %s)",
                         self.address, self.state_dir / "apps")
            return self.address

    def stop(self, grace_s: float = 10.0) -> None:
        """Stops every application master (each stops its containers), then serving."""
        with self._lock:
            server, self._server = self._server, None
        self.dispatcher.stop(grace_s)
        if self.secret_file is not None:
            auth.remove_secret_file(self.secret_file, self.secret)
        if server is not None:
            server.stop(grace=0.5).wait(5.0)

"""The master process's server: one gRPC port for the umbilical and client services.

Used by ``weir master`` (until a signal) and ``weir run`` (embedded, port 0, for one app).
Every call is TLS (``master.tls``: the user's certificate, or one the master makes) and
must carry the master's secret (``master.auth``).
"""

from __future__ import annotations

import concurrent.futures
import errno
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

import grpc

from weir.master import auth
from weir.master.client_service import ClientService
from weir.master.core import Clock, MasterCore, system_clock
from weir.master.gc_pacing import YoungCollections, tune_gc
from weir.master.http_api import HttpApi
from weir.master.launcher import Launcher, LauncherFactory
from weir.master.launcher import launcher_factory as named_launcher
from weir.master.persistence import ApplicationJournal, JournalError
from weir.master.rpc import LOADING_MESSAGE, SERVER_OPTIONS, RequestGuard, UnavailableInterceptor
from weir.master.tls import TemporaryIdentity, TlsFiles, identity_for, read_pem
from weir.master.umbilical_service import UmbilicalService
from weir.proto import client_pb2, client_pb2_grpc, umbilical_pb2_grpc
from weir.proto.contract import MASTER_FILE_ENV
from weir.storage import CorruptLog
from weir.storage.private_files import (
    UntrustedPath,
    check_private_tree,
    make_private_dir,
    write_private_file,
)

__all__ = ["MasterServer", "MasterStartError"]

_LOGGER = logging.getLogger(__name__)

HALT_NOTICE_S = 2.0  # a halted master answers every call with why this long, then stops

_WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}


_STATE_ADVICE = ("remove it, or give --state-dir a folder of your own that only you can "
                 "write (a new path is made owner-only)")


class MasterStartError(RuntimeError):
    """The master cannot start: its address cannot be bound, or its state folder cannot be
    trusted or read back."""


def _state_folder(state_dir: str | os.PathLike[str]) -> Path:
    """``state_dir`` made owner-only, or checked if it is there, with everything in it.

    The folder holds the secret, the TLS key and the journal (unpickled): one another user
    made or could write into (or a link in its place) would let them choose the secret
    the master accepts and the code it runs, so it is refused, whole, before anything in
    it is read. One that others could only read is closed to mode 0700. The last part of
    the path is never followed as a link; the folders above it are resolved.

    Raises:
        MasterStartError: naming the folder or file, what is wrong and what to do.
    """
    absolute = os.path.abspath(state_dir)
    path = Path(os.path.realpath(os.path.dirname(absolute))) / os.path.basename(absolute)
    what = "the master's state folder"
    try:
        make_private_dir(str(path), what, advice=_STATE_ADVICE)
        check_private_tree(str(path), what, advice=_STATE_ADVICE)
    except OSError as exc:
        raise _state_error(path, exc) from None
    return path


def _state_error(path: Path, exc: OSError) -> MasterStartError:
    """A state folder's problem as one line: ``UntrustedPath`` says it all already."""
    if isinstance(exc, UntrustedPath):
        return MasterStartError(exc.strerror or str(exc))
    if exc.errno == errno.ELOOP:
        detail = f"{exc.filename or path} is a symbolic link (never followed)"
    else:
        detail = f"{exc.filename or path}: {exc.strerror or exc}"
    return MasterStartError(f"cannot use the master's state folder {path}: {detail}; "
                            f"{_STATE_ADVICE}")


class MasterServer:
    """A master: gRPC services, the master loop and a launcher, started and stopped together.

    Example::

        with MasterServer(launcher_factory=RecordingLauncher) as server:
            address = server.address          # "127.0.0.1:40123"

    Args:
        host: the interface to listen on (loopback by default).
        advertise_host: the host put in the address the master hands out (to the
            containers it launches, ``master.json``, its secret file); default ``host``,
            or 127.0.0.1 for a wildcard ``host`` (its launched containers are local).
        port: 0 picks a free port.
        launcher_factory: builds the launcher from the bound address; default: "local".
        clock: epoch milliseconds, injectable for tests.
        stop_grace_s: how long ``stop`` lets containers exit before killing them.
        container_stop_grace_ms: how long containers of an ended application may linger.
        loop_interval_s: period of the liveness loop.
        max_workers: gRPC handler threads.
        max_concurrent_calls: calls in progress or waiting for a thread at most; more are
            refused at once (RESOURCE_EXHAUSTED, which containers retry), so a flood of
            calls cannot queue up memory in the master.
        secret: what every call must carry; a fresh random one if None.
        tls: serve TLS with this certificate and key (containers get them too); None:
            with one the master makes, kept in ``state_dir`` (so containers that outlive
            a restart still trust it) or in a private temporary folder.
        publish_secret: write the address and secret to ``auth.secret_path(port)``
            (0600) while running, so ``weir`` on this machine finds them.
        http_port: the dashboard, JSON API and ``/metrics`` (``master.http_api``) on this
            port of ``host``; 0 = any free port, None = no HTTP server.
        http_open, metrics_open: serve the API and dashboard, or ``/metrics``, without
            the secret.
        state_dir: the master's own folder (local): its journal (every application, so a
            master killed at any moment starts again from it), its secret (kept, so the
            containers still running are let back in) and ``master.json`` (its address,
            which containers re-read when they lose it). None = nothing survives a stop.
            Made owner-only; one that is there must be this user's and writable by nobody
            else, as everything in it (``MasterStartError`` otherwise).
        only_application: serve that one application alone, as its application master
            (``master.app_master``, started by the dispatcher): the only id a submit
            takes, once.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 launcher_factory: LauncherFactory | None = None, *,
                 clock: Clock = system_clock, stop_grace_s: float = 5.0,
                 container_stop_grace_ms: int = 10_000, loop_interval_s: float = 0.2,
                 max_workers: int = 16, max_concurrent_calls: int = 1024,
                 secret: str | None = None, tls: TlsFiles | None = None,
                 publish_secret: bool = True, http_port: int | None = 0,
                 http_open: bool = False, metrics_open: bool = False,
                 state_dir: str | os.PathLike[str] | None = None,
                 advertise_host: str | None = None, only_application: str = "") -> None:
        if secret is not None and not secret.strip():
            raise ValueError("the master's secret must not be empty")
        self.host = host
        self.only_application = only_application
        self.port = port
        self.advertise_host = advertise_host or None
        self.launcher_factory: LauncherFactory = launcher_factory or named_launcher("local")
        self.clock = clock
        self.stop_grace_s = stop_grace_s
        self.container_stop_grace_ms = container_stop_grace_ms
        self.loop_interval_s = loop_interval_s
        self.max_workers = max_workers
        self.max_concurrent_calls = max_concurrent_calls
        self.state_dir = _state_folder(state_dir) if state_dir is not None else None
        self.secret = secret.strip() if secret else self._kept_secret()
        self._loading = False
        self.own_tls = tls
        self._temporary_tls: TemporaryIdentity | None = None
        self.tls: TlsFiles | None = None  # what it serves, once started
        self.publish_secret = publish_secret
        self._http_options = (http_port, http_open, metrics_open)
        self._http: HttpApi | None = None
        self._secret_file: Path | None = None
        self._server: grpc.Server | None = None
        self._core: MasterCore | None = None
        self._address = ""
        self._stopped = False
        self._lock = threading.Lock()
        self.halted = threading.Event()  # it stopped serving: its journal failed
        self._young_collections: YoungCollections | None = None

    @property
    def address(self) -> str:
        """The bound ``host:port`` containers and clients use (empty before ``start``)."""
        return self._address

    @property
    def secret_file(self) -> Path | None:
        """Where the running master published its secret (None if it did not)."""
        return self._secret_file

    @property
    def core(self) -> MasterCore:
        if self._core is None:
            raise RuntimeError("the master is not started; call start() first")
        return self._core

    @property
    def launcher(self) -> Launcher:
        return self.core.launcher

    def start(self) -> str:
        """Binds, starts serving and the master loop; returns the bound ``host:port``.

        Raises:
            MasterStartError: the address cannot be bound.
        """
        with self._lock:
            if self._server is not None:
                return self._address
            server = grpc.server(
                concurrent.futures.ThreadPoolExecutor(max_workers=self.max_workers,
                                                      thread_name_prefix="weir-master-rpc"),
                options=SERVER_OPTIONS, maximum_concurrent_rpcs=self.max_concurrent_calls,
                interceptors=[auth.AuthInterceptor(self.secret), RequestGuard(),
                              UnavailableInterceptor(self._unavailable)])
            self._probe_port()
            try:
                self.tls = self._tls_identity()
            except OSError as exc:
                if self.state_dir is None or self.own_tls is not None:
                    raise
                raise _state_error(self.state_dir, exc) from None
            try:
                bound = server.add_secure_port(f"{self.host}:{self.port}",
                                               self.tls.server_credentials())
            except RuntimeError:
                bound = 0
            if not bound:
                raise MasterStartError(self._bind_error("cannot bind it"))
            advertised = self.advertise_host or (
                "127.0.0.1" if self.host in _WILDCARD_HOSTS else self.host)
            self._address = f"{advertised}:{bound}"
            launcher = self.launcher_factory(self._address)
            env = dict(auth.container_env(self.secret, self.tls))
            journal = None
            if self.state_dir is not None:
                env[MASTER_FILE_ENV] = str(self._write_address_file())
                journal = self._open_journal()
            launcher.set_credentials(env)
            core = MasterCore(launcher, clock=self.clock,
                              stop_grace_ms=self.container_stop_grace_ms,
                              loop_interval_s=self.loop_interval_s, journal=journal,
                              only_application=self.only_application)
            core.on_halt = self._halt
            umbilical_pb2_grpc.add_StreamingContainerUmbilicalServicer_to_server(
                UmbilicalService(core, self.tls.identity()), server)
            client_pb2_grpc.add_WeirClientServicer_to_server(ClientService(core), server)
            tune_gc()
            self._loading = journal is not None
            server.start()
            try:
                restored = core.restore()
            except (CorruptLog, JournalError) as exc:
                server.stop(None)
                raise MasterStartError(f"cannot take back the applications of {self.state_dir}: "
                                       f"{exc}") from None
            except Exception:
                server.stop(None)
                raise
            finally:
                self._loading = False
            if core.halted:
                server.stop(None)
                raise MasterStartError(core.halted)
            if restored:
                _LOGGER.info("master restored %d application(s) from %s", restored,
                             self.state_dir)
            try:  # after the restore: a failed start leaves no HTTP server behind
                self._start_http(core)
            except MasterStartError:
                server.stop(None)
                raise
            core.start()
            self._young_collections = YoungCollections().start()
            self._server, self._core = server, core
            if self.publish_secret:
                self._publish(bound)
            _LOGGER.info("master listening on %s with TLS (certificate %s; launcher %s)",
                         self._address, self.tls.cert, type(launcher).__name__)
            return self._address

    def _unavailable(self) -> str:
        """Why calls are refused now ("" = they are served)."""
        if self._loading:
            return LOADING_MESSAGE
        return self._core.halted if self._core is not None else ""

    def _halt(self, reason: str) -> None:
        """Stops serving, as a crash would, but cleanly: containers are left running for
        the next master to take back (``halted`` tells ``weir master`` to exit).

        For ``HALT_NOTICE_S`` first, every call is answered UNAVAILABLE with the reason:
        a call that follows the failed write, whoever made it, learns why."""
        def halt() -> None:
            time.sleep(HALT_NOTICE_S)
            with self._lock:
                server, self._stopped = self._server, True
            if server is not None:
                server.stop(grace=1.0).wait(5.0)
            if self._http is not None:
                self._http.stop()
            if self._secret_file is not None:
                auth.remove_secret_file(self._secret_file, self.secret)
            self.halted.set()

        threading.Thread(target=halt, name="weir-master-halt", daemon=True).start()

    def _tls_identity(self) -> TlsFiles:
        """The user's certificate, else the one kept in the state folder, else a fresh
        one in a private temporary folder (removed at stop)."""
        if self.own_tls is not None:
            return self.own_tls
        if self.state_dir is not None:
            return identity_for(self.state_dir / "tls")
        if self._temporary_tls is None:
            self._temporary_tls = TemporaryIdentity()
        return self._temporary_tls.files

    @property
    def dashboard_url(self) -> str:
        """The dashboard's URL with the read-only token in it (empty without an HTTP server)."""
        return self._http.url_with_token if self._http else ""

    def _start_http(self, core: MasterCore) -> None:
        """Starts the dashboard, JSON API and /metrics (``master.http_api``)."""
        port, open_api, open_metrics = self._http_options
        if port is None:
            return
        http = HttpApi(core, auth.http_token(self.secret), self.host, port, open_api=open_api,
                       open_metrics=open_metrics, tls=self.own_tls)
        try:
            core.dashboard_url = http.start()
        except OSError as exc:
            raise MasterStartError(f"cannot serve the dashboard on {self.host}:{port} "
                                   f"({exc.strerror or exc}); pass another --http-port") from None
        self._http = http

    def _publish(self, port: int) -> None:
        """Writes the secret file; without one, clients need the secret given to them."""
        path = auth.secret_path(port)
        try:
            assert self.tls is not None
            auth.write_secret_file(path, self._address, self.secret,
                                   read_pem(self.tls.trusted),
                                   {"dashboard": self._http.url,
                                    "http_token": auth.http_token(self.secret)}
                                   if self._http else None)
        except OSError as exc:
            _LOGGER.warning("cannot write the secret file %s (%s); clients need %s",
                            path, exc.strerror or exc, auth.SECRET_ENV)
            return
        self._secret_file = path

    def _open_journal(self) -> ApplicationJournal:
        assert self.state_dir is not None
        try:
            return ApplicationJournal(str(self.state_dir / "journal"))
        except CorruptLog as exc:
            raise MasterStartError(f"cannot take back the applications of {self.state_dir}: "
                                   f"{exc}") from None
        except OSError as exc:
            raise _state_error(self.state_dir, exc) from None

    def _kept_secret(self) -> str:
        """The secret of an earlier run on this state folder (``auth.kept_secret``), or a
        fresh one when there is no folder."""
        if self.state_dir is None:
            return auth.new_secret()
        try:
            return auth.kept_secret(self.state_dir, "the master's kept secret", _STATE_ADVICE)
        except OSError as exc:
            raise _state_error(self.state_dir, exc) from None

    def _write_address_file(self) -> Path:
        """``master.json`` in the state folder: where this master listens now."""
        assert self.state_dir is not None
        path = self.state_dir / "master.json"
        write_private_file(str(path), json.dumps({"address": self._address,
                                                  "pid": os.getpid()}).encode())
        return path

    def _probe_port(self) -> None:
        """Fails early, in one line, where gRPC would log a bind error to stderr."""
        if not self.port:
            return
        try:
            infos = socket.getaddrinfo(self.host or None, self.port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        except socket.gaierror as exc:
            raise MasterStartError(f"cannot listen on {self.host}:{self.port}: unknown host "
                                   f"({exc.strerror}); pass --host with a local address"
                                   ) from None
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                raise MasterStartError(self._bind_error(exc.strerror or str(exc))) from None

    def _bind_error(self, detail: str) -> str:
        return (f"cannot listen on {self.host}:{self.port} ({detail}); is another master "
                "running there? pass another --port, or 0 for any free port")

    def stop(self) -> None:
        """Stops the loop, every container, then the server. Safe to call twice."""
        with self._lock:
            if self._stopped or self._server is None or self._core is None:
                self._stopped = True
                return
            self._stopped = True
            server, core = self._server, self._core
        core.stop()
        try:
            core.launcher.stop_all(self.stop_grace_s)
            core.release_ended_runs()
        finally:
            if self._secret_file is not None:
                auth.remove_secret_file(self._secret_file, self.secret)
            server.stop(grace=0.5).wait(5.0)
            if self._http is not None:
                self._http.stop()
            if self._temporary_tls is not None:
                self._temporary_tls.cleanup()
            if self._young_collections is not None:
                self._young_collections.stop()
            _LOGGER.info("master at %s stopped", self._address)

    def wait_for_application(self, app_id: str, timeout_s: float) -> client_pb2.ApplicationInfo:
        """Blocks until the application is terminal; returns its final info.

        Raises:
            NotFound: unknown application.
            TimeoutError: still running after ``timeout_s``.
        """
        return self.core.wait_for_application(app_id, timeout_s)

    def __enter__(self) -> MasterServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

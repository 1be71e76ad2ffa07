"""The dispatcher: ``weir master --application-masters``, a thin front for one application
master process per application (``master.app_master``), as Flink's Dispatcher starts a
JobMaster per job and YARN an ApplicationMaster (Apex's Stram) per application.

It accepts submits, gives each application an id and a folder of its own under its state
folder, starts that application's master there (a local process in its own session, so
it outlives a dispatcher that dies) and forwards the submit to it; every later client call
that names an application goes to that application's master, with that application's
secret (the dispatcher reads it, the TLS certificate and the address from the folder,
owner-only). Containers never talk to the dispatcher: they heartbeat to their own
application master and hold only its secret, so nothing one application's code holds
reaches another application or the dispatcher.

It journals which applications exist and where their folders are; a restarted dispatcher
finds each application master again by the pid in its ``master.json`` (proven to be that
application master's before it is used) or starts it again, and that master takes its
containers back from its own journal. An application master that exits while its
application runs is started again the same way (at most ``MAX_RESTARTS`` times in a row);
once an application has ended, its last information is kept in the dispatcher's journal
and its master is stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc

from weir.master.client import WeirClient, WeirClientError
from weir.master.container_processes import is_named_process
from weir.master.errors import InvalidArgument, NotFound, Unavailable, shown
from weir.master.journal import Journal
from weir.proto import client_pb2
from weir.storage.private_files import make_private_dir, read_private_file

__all__ = ["APP_MASTER_ENV", "MAX_RESTARTS", "AppMaster", "Dispatcher"]

_LOGGER = logging.getLogger("weir.master.dispatcher")

APP_MASTER_ENV = "WEIR_APP_MASTER_ID"
"""Set in an application master's environment at launch: the proof that a pid is it."""
MAX_RESTARTS = 5
"""Times in a row an application master may exit while its application runs before the
application is shown FAILED (with the end of its log) instead of started again."""
_ENDED = frozenset({"FINISHED", "FAILED", "KILLED"})


@dataclasses.dataclass
class AppMaster:
    """One application's master, as the dispatcher knows it."""

    app_id: str
    folder: Path
    process: Any = None  # the Popen it started (None: adopted by pid, or not running)
    pid: int = 0
    restarts: int = 0  # exits in a row while its application ran
    final: client_pb2.ApplicationInfo | None = None  # once its application ended
    last_info: client_pb2.ApplicationInfo | None = None
    failure: str = ""  # why it is not started again
    client: WeirClient | None = None
    address: str = ""

    def running(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return self.pid > 0 and is_named_process(self.pid, self.app_id, APP_MASTER_ENV,
                                                 "application master") is None


class Dispatcher:
    """Application masters by application id (see the module docs).

    Args:
        folder: the dispatcher's own folder (local, owner-only): its journal and one
            folder per application under ``apps/``.
        launcher, launcher_options: how each application master starts its containers
            (``weir master``'s ``--launcher`` and its options).
        env: added to each application master's environment (and so its containers').
        host, advertise_host: where each application master listens, and the host its
            containers reach it by (``weir master --host/--advertise-host``).
        start_timeout_s: how long a new application master may take to listen.
    """

    def __init__(self, folder: str | os.PathLike[str], launcher: str = "local",
                 launcher_options: Mapping[str, Any] | None = None, *,
                 env: Mapping[str, str] | None = None, host: str = "127.0.0.1",
                 advertise_host: str | None = None, start_timeout_s: float = 60.0,
                 call_timeout_s: float = 30.0) -> None:
        self.folder = Path(folder)
        make_private_dir(str(self.folder), "the dispatcher's folder",
                         advice="give --state-dir a folder of your own")
        make_private_dir(str(self.folder / "apps"), "the dispatcher's folder",
                         advice="give --state-dir a folder of your own")
        self.launcher = launcher
        self.launcher_options = dict(launcher_options or {})
        self.env = dict(env or {})
        self.host, self.advertise_host = host, advertise_host
        self.start_timeout_s = start_timeout_s
        self.call_timeout_s = call_timeout_s
        self._journal = Journal(str(self.folder / "journal"))
        self._lock = threading.Lock()  # the records; never held across a call or a start
        self._apps: dict[str, AppMaster] = {}
        self._next = 1
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.trouble = ""  # why its last watch pass failed ("" = it works), in every listing

    # -- lifecycle --------------------------------------------------------------------
    def restore(self) -> int:
        """Takes back the journaled applications: each running master found by its pid,
        the others started again (their own journals bring their containers back)."""
        records = self._journal.load()
        for key, value in sorted(records.items()):
            if key == "next":
                self._next = int(value)
            elif key.startswith("app/"):
                record = json.loads(value)
                app = AppMaster(record["id"], Path(record["folder"]))
                final = records.get(f"final/{app.app_id}")
                if final is not None:
                    app.final = client_pb2.ApplicationInfo.FromString(final)
                self._apps[app.app_id] = app
        for app in self._apps.values():
            if app.final is None:
                self._find_or_start(app)
        return len(self._apps)

    def start_watching(self, interval_s: float = 1.0) -> None:
        """Restarts application masters that exit, and collects ended applications."""
        def watch() -> None:
            while not self._stop.wait(interval_s):
                self.watch_once()
        self._watcher = threading.Thread(target=watch, name="weir-dispatcher-watch",
                                         daemon=True)
        self._watcher.start()

    def stop(self, grace_s: float = 10.0) -> None:
        """Stops watching and every application master it runs (each stops its
        containers first)."""
        self._stop.set()
        with self._lock:
            apps = list(self._apps.values())
        for app in apps:
            self._terminate(app, grace_s)
        self._journal.close()

    # -- submit -----------------------------------------------------------------------
    def submit(self, request: client_pb2.SubmitApplicationRequest
               ) -> client_pb2.SubmitApplicationResponse:
        """A new application: an id, a folder, its master started, the submit forwarded.
        A refused DAG leaves its (ended) application master stopped and nothing listed."""
        if request.application_id:
            raise InvalidArgument("the dispatcher chooses application ids; submit without one")
        with self._lock:
            app_id = f"app-{self._next:04d}"
            self._next += 1
            self._journal.put("next", str(self._next).encode())
        app = AppMaster(app_id, self.folder / "apps" / app_id)
        self._start(app)
        forwarded = client_pb2.SubmitApplicationRequest()
        forwarded.CopyFrom(request)
        forwarded.application_id = app_id
        try:
            response = self._call(app, "SubmitApplication", forwarded)
        except BaseException:
            self._terminate(app, 5.0)
            raise
        with self._lock:
            self._apps[app_id] = app
            self._journal.put(f"app/{app_id}", json.dumps(
                {"id": app_id, "folder": str(app.folder)}).encode())
        return response

    # -- calls ------------------------------------------------------------------------
    def forward(self, method: str, request: Any) -> Any:
        """A client call for one application, answered by its master; an ended one's
        information from the dispatcher's record once its master is gone."""
        if method == "KillContainer":
            app = self._app(request.container_id.rsplit("-c", 1)[0], request.container_id)
        else:
            app = self._app(request.application_id)
        if app.final is not None and method == "GetApplicationInfo":
            return app.final
        if app.final is not None:
            raise Unavailable(f"application {app.app_id} ended ({app.final.state}); its "
                              "master is stopped, so only `weir app` shows it")
        return self._call(app, method, request)

    def list_applications(self) -> client_pb2.ListApplicationsResponse:
        """Every application's information, each from its master (a master that does not
        answer: the last information seen, its diagnostics saying so)."""
        with self._lock:
            apps = sorted(self._apps.values(), key=lambda a: a.app_id)
        infos = [self._info(app) for app in apps]
        if self.trouble:
            for index, kept in enumerate(infos):  # a copy: the records stay as they were
                info = infos[index] = client_pb2.ApplicationInfo()
                info.CopyFrom(kept)
                info.diagnostics = "; ".join(filter(None, (info.diagnostics, self.trouble)))
        return client_pb2.ListApplicationsResponse(applications=infos)

    def list_containers(self, request: client_pb2.ListContainersRequest
                        ) -> client_pb2.ListContainersResponse:
        if request.application_id:
            return self.forward("ListContainers", request)
        with self._lock:
            apps = [a for a in self._apps.values() if a.final is None]
        merged = client_pb2.ListContainersResponse()
        for app in sorted(apps, key=lambda a: a.app_id):
            with contextlib.suppress(Unavailable, WeirClientError):
                merged.containers.extend(self._call(
                    app, "ListContainers", client_pb2.ListContainersRequest(
                        application_id=app.app_id)).containers)
        return merged

    def pids(self) -> dict[str, int]:
        """Each application master's pid (0: not running): for ``weir apps --json``, tests."""
        with self._lock:
            return {a.app_id: (a.process.pid if a.process is not None else a.pid)
                    for a in self._apps.values() if a.final is None}

    def watch_once(self) -> None:
        """One pass of the watch (``check``); a pass that fails is kept in ``trouble``,
        shown in every application's diagnostics until a pass works again: the watch
        goes on, and nobody is left to believe masters are restarted when they are not."""
        try:
            self.check()
            self.trouble = ""
        except Exception as exc:  # noqa: BLE001 - said in the listings, and the watch goes on
            self.trouble = (f"the dispatcher's watch of application masters fails: "
                            f"{type(exc).__name__}: {exc}")
            _LOGGER.exception("the dispatcher's watch failed; it goes on")

    def check(self) -> None:
        """One pass of the watch: ended applications recorded and their masters stopped;
        masters that exited while their application ran started again."""
        with self._lock:
            apps = [a for a in self._apps.values() if a.final is None and not a.failure]
        for app in apps:
            if app.running():
                info = self._info(app, brief=True)
                if info.state in _ENDED and not info.containers_active:
                    self._finish(app, self._info(app))  # kept whole: its figures too
                continue
            self._restart(app)

    # -- inside -----------------------------------------------------------------------
    def _app(self, app_id: str, what: str = "") -> AppMaster:
        with self._lock:
            app = self._apps.get(app_id)
        if app is None:
            named = f"container {shown(what)}" if what else f"application {shown(app_id)}"
            raise NotFound(f"unknown {named}; `weir apps` lists the applications")
        return app

    def _info(self, app: AppMaster, *, brief: bool = False) -> client_pb2.ApplicationInfo:
        """Its application's information from its master; ``brief`` for the watch (no
        per-operator figures: the watch only needs its state)."""
        if app.final is not None:
            return app.final
        try:
            info = self._call(app, "GetApplicationInfo", client_pb2.GetApplicationInfoRequest(
                application_id=app.app_id, brief=brief), timeout_s=2.0)
            if not brief or app.last_info is None:
                app.last_info = info
            return info
        except (Unavailable, WeirClientError, NotFound) as exc:
            shown_info = client_pb2.ApplicationInfo(id=app.app_id, state="UNKNOWN")
            if app.last_info is not None:
                shown_info.CopyFrom(app.last_info)
            shown_info.diagnostics = (app.failure or f"its application master does not "
                                      f"answer ({exc}); the dispatcher starts it again")
            return shown_info

    def _call(self, app: AppMaster, method: str, request: Any,
              timeout_s: float | None = None) -> Any:
        """``method`` on the application's master with its secret. UNAVAILABLE (a master
        just started and not serving yet, loading its journal, or started again on
        another port) is tried again, the address read again, for up to ``timeout_s``."""
        timeout_s = timeout_s or self.call_timeout_s
        deadline = time.monotonic() + timeout_s
        attempt = 0
        while True:
            try:
                client = self._client(app, fresh=attempt > 0)
            except Unavailable:  # being started again: its address is not written yet
                if time.monotonic() >= deadline:
                    raise
            else:
                stub_call = getattr(client._stub, method)  # noqa: SLF001 - its own stub
                try:
                    return stub_call(request, timeout=timeout_s,
                                     metadata=client._metadata)  # noqa: SLF001
                except grpc.RpcError as exc:
                    code = exc.code() if hasattr(exc, "code") else None
                    if code != grpc.StatusCode.UNAVAILABLE or time.monotonic() >= deadline:
                        raise _as_master_error(exc) from None
            attempt += 1
            time.sleep(min(0.05 * attempt, 0.5))

    def _client(self, app: AppMaster, fresh: bool = False) -> WeirClient:
        if app.client is not None and not fresh:
            return app.client
        address = _read_json(app.folder / "master.json").get("address", "")
        if not address:
            raise Unavailable(f"application {app.app_id}'s master has not started yet")
        secret = read_private_file(str(app.folder / "secret"), "an application master's "
                                   "secret", secret=True).decode().strip()
        # its own self-signed certificate (``tls.identity_for``) is what it must prove
        app.client = WeirClient(address, secret=secret, tls_ca=app.folder / "tls" / "cert.pem",
                                timeout_s=self.call_timeout_s, loading_wait_s=0.0)
        app.address = address
        return app.client

    def _start(self, app: AppMaster) -> None:
        """Starts the application's master and waits until it listens."""
        make_private_dir(str(app.folder), "an application's folder",
                         advice="give --state-dir a folder of your own")
        with contextlib.suppress(FileNotFoundError):
            (app.folder / "master.json").unlink()  # the address of an earlier run
        log = open(app.folder / "app-master.log", "ab")  # noqa: SIM115 - the child keeps it
        env = {**os.environ, **self.env, APP_MASTER_ENV: app.app_id}
        env.pop("WEIR_SECRET", None)  # the user's secret stays with the dispatcher
        argv = [sys.executable, "-m", "weir.master.app_master", "--app-id", app.app_id,
                "--state-dir", str(app.folder), "--launcher", self.launcher,
                "--launcher-options", json.dumps(self.launcher_options), "--host", self.host,
                *(("--advertise-host", self.advertise_host) if self.advertise_host else ())]
        try:
            app.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, env=env,
                                           start_new_session=True)
        finally:
            log.close()
        app.pid = app.process.pid
        app.client = None
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if _read_json(app.folder / "master.json").get("pid") == app.pid:
                return
            if app.process.poll() is not None:
                raise Unavailable(f"application {app.app_id}'s master exited with code "
                                  f"{app.process.returncode} as it started: "
                                  f"{_tail(app.folder / 'app-master.log')}")
            time.sleep(0.05)
        self._terminate(app, 2.0)
        raise Unavailable(f"application {app.app_id}'s master did not listen within "
                          f"{self.start_timeout_s:g} s: {_tail(app.folder / 'app-master.log')}")

    def _find_or_start(self, app: AppMaster) -> None:
        """A journaled application's master: the one still running, else a new one."""
        pid = int(_read_json(app.folder / "master.json").get("pid") or 0)
        if pid and is_named_process(pid, app.app_id, APP_MASTER_ENV,
                                    "application master") is None:
            app.pid, app.process = pid, None
            return
        self._restart(app)

    def _restart(self, app: AppMaster) -> None:
        if app.restarts >= MAX_RESTARTS:
            app.failure = (f"its application master exited {app.restarts} times in a row; "
                           f"not started again: {_tail(app.folder / 'app-master.log')}")
            _LOGGER.error("app=%s %s", app.app_id, app.failure)
            failed = client_pb2.ApplicationInfo(id=app.app_id, name=app.app_id)
            if app.last_info is not None:
                failed.CopyFrom(app.last_info)  # what was last known of it, its figures
            failed.state, failed.diagnostics = "FAILED", app.failure
            failed.finished_ms = int(time.time() * 1000)
            self._finish(app, failed)  # journaled: FAILED after a restart too
            return
        app.restarts += 1
        _LOGGER.warning("app=%s its application master is not running; starting it again "
                        "(%d)", app.app_id, app.restarts)
        try:
            self._start(app)
            app.restarts = 0 if app.running() else app.restarts
        except Unavailable as exc:
            _LOGGER.error("app=%s %s", app.app_id, exc)

    def _finish(self, app: AppMaster, info: client_pb2.ApplicationInfo) -> None:
        """The application ended and its containers are gone: its information kept, its
        master stopped."""
        self._journal.put(f"final/{app.app_id}", info.SerializeToString())
        app.final = info
        self._terminate(app, 10.0)

    def _terminate(self, app: AppMaster, grace_s: float) -> None:
        """SIGTERM to the application master (it stops its containers), SIGKILL after
        ``grace_s``; only to a process proven to be it."""
        if not app.running():
            return
        pid = app.process.pid if app.process is not None else app.pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and app.running():
            time.sleep(0.05)
        if app.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if app.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                app.process.wait(5.0)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(read_private_file(str(path), "an application master's address"))
    except (FileNotFoundError, ValueError):
        return {}


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(its log is empty)"


def _as_master_error(exc: grpc.RpcError) -> Exception:
    """An application master's answer as the error the dispatcher answers with."""
    from weir.master.errors import DeadlineExceeded, FailedPrecondition

    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    kind = {grpc.StatusCode.NOT_FOUND: NotFound,
            grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
            grpc.StatusCode.UNAVAILABLE: Unavailable,
            grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded}.get(code, FailedPrecondition)
    return kind(details)

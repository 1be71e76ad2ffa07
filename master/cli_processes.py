"""The ``weir`` commands that run processes here: a master (``weir master``), an
application with its own master (``weir run``) and a container (``weir container``)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from weir.master import auth, live_view, tables
from weir.master.cli_config import load_app_and_overrides
from weir.master.cli_output import now_ms, print_json, to_dict
from weir.master.errors import MasterError
from weir.master.launcher import launcher_factory
from weir.master.server import MasterServer
from weir.master.tls import TlsFiles
from weir.proto import client_pb2
from weir.proto.contract import SECRET_ENV
from weir.runtime.spark.class_archive import ArchiveMaker
from weir.storage.locations import redact_location

__all__ = ["cmd_container", "cmd_master", "cmd_run"]

_LOGGER = logging.getLogger("weir.master.cli")


def _tls(args: argparse.Namespace) -> TlsFiles | None:
    """The user's certificate, if given (else the master makes one)."""
    return TlsFiles.from_options(args.tls_cert, args.tls_key, args.tls_ca)


_LAUNCHER_OPTIONS = {
    "kubernetes": {"k8s_image": "image", "k8s_namespace": "namespace",
                   "kubeconfig": "kubeconfig", "k8s_service_account": "service_account",
                   "k8s_pod_template": "pod_template"},
    "ray": {"ray_address": "address"},
}


def launcher_options(args: argparse.Namespace) -> dict[str, object]:
    """The chosen launcher's options from ``weir master``'s; another launcher's refused.

    Raises:
        ValueError: an option of a launcher that was not chosen (it would do nothing).
    """
    own = _LAUNCHER_OPTIONS.get(args.launcher, {})
    others = {option for name, options in _LAUNCHER_OPTIONS.items()
              if name != args.launcher for option in options}
    given = [option for option in others if getattr(args, option, None)]
    if given:
        flags = ", ".join("--" + option.replace("_", "-") for option in sorted(given))
        raise ValueError(f"{flags} do not apply to --launcher {args.launcher}")
    if args.launcher == "kubernetes" and not args.k8s_image:
        raise ValueError("--launcher kubernetes needs --k8s-image IMAGE: an image with "
                         "Weir and Java in it (deploy/Dockerfile builds one)")
    if own:
        return {key: value for option, key in own.items()
                if (value := getattr(args, option, None))}
    return {"log_dir": args.log_dir} if args.launcher == "local" else {}


def _class_archive(args: argparse.Namespace) -> None:
    """With local containers, has Spark's class-data archive made in the background if
    this machine has none yet (``runtime.spark.class_archive``): the next Spark JVMs here
    start in about half the time."""
    if args.launcher == "local":
        ArchiveMaker().start()


def cmd_master(args: argparse.Namespace) -> int:
    if args.application_masters:
        from weir.master.cli_dispatcher import run_dispatcher

        _class_archive(args)
        return run_dispatcher(args, launcher_options(args))
    factory = launcher_factory(args.launcher, **launcher_options(args))
    _class_archive(args)
    secret = (auth.read_secret_file(args.secret_file)[0] if args.secret_file
              else os.environ.get(SECRET_ENV) or None)
    server = MasterServer(args.host, args.port, factory, secret=secret, tls=_tls(args),
                          state_dir=args.state_dir, advertise_host=args.advertise_host,
                          **_http_options(args))
    stop = threading.Event()
    # SIGHUP: its terminal was closed; stop as cleanly as for Ctrl-C (containers, secret)
    previous = {s: signal.signal(s, lambda *_: stop.set())
                for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        address = server.start()
        secret_file = str(server.secret_file or "")
        dashboard = server.core.dashboard_url
        if args.json:
            print_json({"address": address, "secret_file": secret_file,
                         "tls": server.tls is not None, "dashboard": dashboard})
        else:
            print(address)
            if dashboard:
                print(f"weir: dashboard, JSON API and /metrics on {dashboard} (its read-only "
                      "token opens them, never the secret: ?token=TOKEN or 'Authorization: "
                      "Bearer TOKEN'; TOKEN is the http_token in the secret file)",
                      file=sys.stderr)
            print(f"weir: the master's secret is in {secret_file} (mode 0600): `weir` finds "
                  f"it on this machine; elsewhere set {SECRET_ENV} or pass --secret-file"
                  if secret_file else f"weir: clients need the master's secret: set "
                  f"{SECRET_ENV} or pass --secret-file", file=sys.stderr)
        sys.stdout.flush()
        while not stop.wait(0.5) and not server.halted.is_set():
            pass
        if server.halted.is_set():
            print(f"weir: error: {server.core.halted}", file=sys.stderr)
            return 1
        _LOGGER.info("master at %s stopping", address)
    finally:
        server.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    descriptor, overrides = load_app_and_overrides(args)
    factory = launcher_factory(args.launcher, **launcher_options(args))
    _class_archive(args)
    server = MasterServer(args.host, 0, factory, container_stop_grace_ms=5_000,
                          advertise_host=args.advertise_host, tls=_tls(args),
                          **_http_options(args))
    app_id = ""
    previous = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        server.start()
        app_id = server.core.submit(descriptor, overrides)
        _LOGGER.info("running %s as %s on the embedded master %s", args.app, app_id,
                     server.address)
        if server.dashboard_url and not args.quiet:
            print(f"weir: {app_id} dashboard: {server.dashboard_url}", file=sys.stderr)
        info = _follow(server, app_id, args.run_timeout, args.quiet)
        operators = server.core.list_operators(app_id)
        _print_run_result(args, info, operators)
        return 0 if info.state == "FINISHED" else 1
    except KeyboardInterrupt:
        print("weir: interrupted; stopping the application and its containers",
              file=sys.stderr)
        if app_id:
            try:
                server.core.kill_application(app_id, "interrupted (Ctrl-C)")
            except MasterError:
                pass
        return 130
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        server.stop()


def _http_options(args: argparse.Namespace) -> dict[str, Any]:
    """MasterServer's HTTP settings from ``--http-port``, ``--http-open``, ``--metrics-open``."""
    return {"http_port": None if args.http_port < 0 else args.http_port,
            "http_open": args.http_open, "metrics_open": args.metrics_open}


def _raise_interrupt(*_: object) -> NoReturn:
    raise KeyboardInterrupt


def _follow(server: MasterServer, app_id: str, timeout_s: float | None, quiet: bool = False
            ) -> client_pb2.ApplicationInfo:
    """Waits for the app to end, with a progress line on stderr (live on a terminal)."""
    deadline = time.monotonic() + timeout_s if timeout_s else None
    progress = live_view.ProgressLine(sys.stderr, quiet=quiet)
    try:
        while True:
            try:
                return server.wait_for_application(app_id, 0.5)
            except TimeoutError:
                pass
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"application {app_id} did not end within {timeout_s:g} s "
                                   "(--run-timeout); it was stopped")
            progress.show(server.core.application_info(app_id))
    finally:
        progress.clear()


def _print_run_result(args: argparse.Namespace, info: client_pb2.ApplicationInfo,
                      operators: list[client_pb2.OperatorInfo]) -> None:
    if args.json:
        print_json({"application": to_dict(info),
                     "operators": [to_dict(op) for op in operators]})
        return
    print(tables.render_table(tables.OPERATOR_HEADERS, tables.operator_rows(operators),
                              tables.OPERATOR_RIGHT))
    took = tables.format_duration_ms((info.finished_ms or now_ms()) - info.submitted_ms)
    line = f"{info.id} {info.name}: {info.state} after {took}"
    print(line + (f": {info.diagnostics}" if info.diagnostics else ""))
    if info.savepoint_path:  # taken from another terminal (weir savepoint --stop)
        print(f"savepoint {info.savepoint_state} at {redact_location(info.savepoint_path)}")


def cmd_container(args: argparse.Namespace) -> int:
    """``weir container ...`` is ``python -m weir.container ...`` (the master never imports it):
    ``args.forward`` (what weir does not know: ``--id``, ``--host``, ...) goes on as it is.

    The master's secret never goes on the command line: ``--secret-file`` is passed on,
    else ``$WEIR_SECRET`` stays in the environment, else the secret file of a master on
    this machine (it holds the certificate too) is passed on.
    """
    tail = ["--master", args.master, *args.forward]
    if args.verbose:
        tail.append("-v")
    if args.tls_ca:
        tail += ["--tls-ca", args.tls_ca]
    if args.secret_file:
        tail += ["--secret-file", args.secret_file]
    elif not os.environ.get(SECRET_ENV):
        found = auth.client_credentials(args.master)
        if found.secret and Path(found.source).is_file():  # the master's file: its certificate too
            tail += ["--secret-file", found.source]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "weir.container", *tail])
    return 1  # not reached

"""The ``weir`` command: run a master or a container, submit and inspect applications.

Bad input ends with one line on stderr (``weir: error: ...``) and a non-zero exit, never
a traceback. Attribute overrides: ``-D NAME=VALUE`` wins over ``--config FILE``, which
wins over the DAG's code.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from google.protobuf import json_format
from google.protobuf.message import Message

from master import auth, live_view, tables
from master.client import WeirClient, WeirClientError, default_master, parse_address
from master.errors import MasterError
from master.launcher import LocalProcessLauncher, launcher_factory, launcher_names
from master.physical_plan import PlanError
from master.planner import build_physical_plan
from master.server import MasterServer, MasterStartError
from master.tls import TlsFiles
from operators.app import AppLoadError, load_app
from operators.attributes import InvalidAttribute
from operators.dag import DagError
from proto import client_pb2, plan_pb2
from proto.contract import SECRET_ENV

__all__ = ["ConfigError", "main", "parse_defines", "read_config"]

_LOGGER = logging.getLogger(__name__)

_USER_ERRORS = (WeirClientError, AppLoadError, DagError, PlanError, InvalidAttribute,
                MasterError, MasterStartError, OSError, ValueError, TimeoutError)
_VALUE_OPTIONS = {"--master", "--config", "-D", "--timeout", "--secret-file", "--tls-ca"}


class ConfigError(ValueError):
    """A malformed ``-D`` value or config file."""


class _UsageError(Exception):
    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, raised instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{message} (see `{self.prog} --help`)")


# -- configuration ----------------------------------------------------------------------
def read_config(path: str | Path) -> dict[str, str]:
    """``NAME=VALUE`` lines; blank lines and ``#`` comments are skipped."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #", 1)[0].split("\t#", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"{path}:{number}: expected NAME=VALUE, got {raw.strip()!r}")
        values[name.strip()] = value.strip()
    return values


def parse_defines(defines: Sequence[str]) -> dict[str, str]:
    """``-D NAME=VALUE`` options as a dict."""
    values: dict[str, str] = {}
    for define in defines:
        name, sep, value = define.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"bad -D {define!r}: expected NAME=VALUE")
        values[name.strip()] = value.strip()
    return values


def _overrides(args: argparse.Namespace) -> dict[str, str]:
    values = read_config(args.config) if args.config else {}
    values.update(parse_defines(args.define))
    return values


def _load(args: argparse.Namespace) -> tuple[plan_pb2.DagDescriptor, dict[str, str]]:
    """The app's DAG descriptor and overrides, planned once here to fail early."""
    overrides = _overrides(args)
    descriptor = load_app(args.app).to_descriptor()
    build_physical_plan(descriptor, overrides, "check")
    return descriptor, overrides


# -- output -----------------------------------------------------------------------------
def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _to_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


def _print_json(value: Message | dict[str, Any]) -> None:
    data = _to_dict(value) if isinstance(value, Message) else value
    print(json.dumps(data, indent=2, sort_keys=False))


def _client(args: argparse.Namespace) -> WeirClient:
    return WeirClient(args.master, timeout_s=args.timeout, secret_file=args.secret_file,
                      tls_ca=args.tls_ca, on_loading=_say_loading)


def _say_loading(message: str) -> None:
    print(f"weir: {message} (retrying)", file=sys.stderr)


def _tls(args: argparse.Namespace) -> TlsFiles | None:
    """The user's certificate, if given (else the master makes one)."""
    return TlsFiles.from_options(args.tls_cert, args.tls_key, args.tls_ca)


# -- commands ---------------------------------------------------------------------------
def _cmd_master(args: argparse.Namespace) -> int:
    factory = launcher_factory(args.launcher, **({"log_dir": args.log_dir}
                                                 if args.launcher == "local" else {}))
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
            _print_json({"address": address, "secret_file": secret_file,
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


def _cmd_submit(args: argparse.Namespace) -> int:
    parse_address(args.master)
    descriptor, overrides = _load(args)
    with _client(args) as client:
        app_id = client.submit(descriptor, overrides)
    if args.json:
        _print_json(client_pb2.SubmitApplicationResponse(application_id=app_id))
    else:
        print(app_id)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    descriptor, overrides = _load(args)
    log_dir = args.log_dir

    def factory(address: str) -> LocalProcessLauncher:
        return LocalProcessLauncher(address, log_dir=log_dir)

    server = MasterServer("127.0.0.1", 0, factory, container_stop_grace_ms=5_000,
                          tls=_tls(args), **_http_options(args))
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
        _print_json({"application": _to_dict(info),
                     "operators": [_to_dict(op) for op in operators]})
        return
    print(tables.render_table(tables.OPERATOR_HEADERS, tables.operator_rows(operators),
                              tables.OPERATOR_RIGHT))
    took = tables.format_duration_ms((info.finished_ms or _now_ms()) - info.submitted_ms)
    line = f"{info.id} {info.name}: {info.state} after {took}"
    print(line + (f": {info.diagnostics}" if info.diagnostics else ""))


def _cmd_apps(args: argparse.Namespace) -> int:
    with _client(args) as client:
        apps = client.applications()
    if args.json:
        _print_json(client_pb2.ListApplicationsResponse(applications=apps))
    elif not apps:
        print("no applications; submit one with `weir submit APP.py`")
    else:
        print(tables.render_table(tables.APPLICATION_HEADERS,
                                  tables.application_rows(apps, _now_ms()),
                                  tables.APPLICATION_RIGHT))
        if apps[0].dashboard_url:  # a hint for people, kept off the table's stream
            print(f"weir: dashboard on {apps[0].dashboard_url} (add ?token=SECRET, the "
                  "master's secret)", file=sys.stderr)
    return 0


def _cmd_app(args: argparse.Namespace) -> int:
    with _client(args) as client:
        info = client.application(args.app_id)
    if args.json:
        _print_json(info)
    else:
        print(tables.application_details(info, _now_ms()))
    return 0


def _cmd_top(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise ValueError(f"--interval must be positive, not {args.interval:g}")
    with _client(args) as client:
        client.application(args.app_id)  # an unknown application fails here, in one line

        def read() -> live_view.Snapshot:
            return live_view.Snapshot(client.application(args.app_id),
                                      client.operators(args.app_id),
                                      client.containers(args.app_id))

        return live_view.run_top(read, interval_s=args.interval, count=args.count,
                                 as_json=args.json)


def _cmd_containers(args: argparse.Namespace) -> int:
    with _client(args) as client:
        containers = client.containers(args.app_id or args.app or "")
    if args.json:
        _print_json(client_pb2.ListContainersResponse(containers=containers))
    elif not containers:
        print("no containers")
    else:
        print(tables.render_table(tables.CONTAINER_HEADERS,
                                  tables.container_rows(containers, _now_ms()),
                                  tables.CONTAINER_RIGHT))
    return 0


def _cmd_operators(args: argparse.Namespace) -> int:
    with _client(args) as client:
        operators = client.operators(args.app_id)
    if args.json:
        _print_json(client_pb2.ListOperatorsResponse(operators=operators))
    else:
        print(tables.render_table(tables.OPERATOR_HEADERS, tables.operator_rows(operators),
                                  tables.OPERATOR_RIGHT))
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    with _client(args) as client:
        info = client.operator_stats(args.app_id, args.operator)
    if args.json:
        _print_json(info)
    else:
        print(tables.operator_details(info, _now_ms(), args.windows))
    return 0


def _cmd_kill_container(args: argparse.Namespace) -> int:
    with _client(args) as client:
        replacement = client.kill_container(args.container_id)
    if args.json:
        _print_json(client_pb2.KillContainerResponse(replacement_id=replacement))
    elif replacement:
        print(f"container {args.container_id} killed; {replacement} replaces it and its "
              "operators restart from their checkpoints")
    else:
        print(f"container {args.container_id} killed")
    return 0


def _cmd_repartition(args: argparse.Namespace) -> int:
    with _client(args) as client:
        response = client.repartition(args.app_id, args.operator, args.partitions)
    if args.json:
        _print_json(response)
    else:
        print(f"{args.app_id}: {response.message}; new partitions {list(response.partitions)}")
    return 0


def _cmd_shutdown(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.shutdown(args.app_id)
    if args.json:
        _print_json(client_pb2.ShutdownApplicationResponse())
    else:
        print(f"{args.app_id}: shutdown requested; its inputs end after the current window")
    return 0


def _cmd_kill(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.kill(args.app_id, args.reason)
    if args.json:
        _print_json(client_pb2.KillApplicationResponse())
    else:
        print(f"{args.app_id} killed")
    return 0


# -- parsing ----------------------------------------------------------------------------
def _common() -> argparse.ArgumentParser:
    """Options accepted before or after the subcommand (defaults filled in later)."""
    common = _Parser(add_help=False)
    common.add_argument("--master", default=argparse.SUPPRESS, metavar="HOST:PORT",
                        help="the master to talk to (default: $WEIR_MASTER or "
                             f"{default_master()})")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="machine-readable output (the API's messages as JSON)")
    common.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                        help="log at INFO (-vv: DEBUG)")
    common.add_argument("--timeout", type=float, default=argparse.SUPPRESS, metavar="S",
                        help="deadline of each call to the master, seconds (default 10)")
    common.add_argument("--secret-file", default=argparse.SUPPRESS, metavar="FILE",
                        help="the master's secret (default: $WEIR_SECRET, else the file a "
                             "master on this machine wrote); master: use it, not a new one")
    common.add_argument("--tls-ca", default=argparse.SUPPRESS, metavar="PEM",
                        help="the certificates the master must prove before the secret is "
                             "sent (default: $WEIR_TLS_CA, else the secret file's); "
                             "master/run: what containers and clients trust (default: "
                             "--tls-cert, for a self-signed certificate)")
    return common


def _tls_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tls-cert", metavar="PEM",
                        help="serve TLS with this certificate (default: $WEIR_TLS_CERT, else "
                             "one the master makes); containers serve their buffer servers "
                             "with it too")
    parser.add_argument("--tls-key", metavar="PEM",
                        help="the certificate's private key (default: $WEIR_TLS_KEY)")


def _http_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--http-port", type=int, default=0, metavar="PORT",
                        help="the dashboard, JSON API and /metrics on this port of the "
                             "master's host (default 0: any free port, printed; -1: none)")
    parser.add_argument("--http-open", action="store_true",
                        help="serve the dashboard and JSON API without the master's secret")
    parser.add_argument("--metrics-open", action="store_true",
                        help="serve /metrics without the master's secret")


def _app_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("app", metavar="APP.py", help="the application file (defines `dag`)")


def _attribute_parent() -> argparse.ArgumentParser:
    """-D and --config: only where an application is submitted (submit, run)."""
    options = _Parser(add_help=False)
    options.add_argument("-D", dest="define", action="append", default=argparse.SUPPRESS,
                         metavar="NAME=VALUE",
                         help="set an attribute (NAME or OPERATOR.NAME); wins over --config")
    options.add_argument("--config", default=argparse.SUPPRESS, metavar="FILE",
                         help="a file of NAME=VALUE lines; wins over the DAG's code")
    return options


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    attributes = _attribute_parent()
    parser = _Parser(prog="weir", parents=[common, attributes],
                     description="Weir: a stream-processing runtime (master, containers, CLI).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def command(name: str, func: Callable[[argparse.Namespace], int], text: str
                ) -> argparse.ArgumentParser:
        parents = [common, attributes] if name in ("submit", "run") else [common]
        p = sub.add_parser(name, parents=parents, help=text, description=text)
        p.set_defaults(func=func)
        return p

    p = command("master", _cmd_master, "run a master until Ctrl-C or SIGTERM")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; an address other hosts "
                        "reach, or 0.0.0.0, for containers on other hosts)")
    p.add_argument("--advertise-host", metavar="ADDR",
                   help="host of the address the master prints and gives its containers "
                        "(default: --host; 127.0.0.1 for 0.0.0.0)")
    p.add_argument("--port", type=int, default=5151, help="port (0 = any free port)")
    p.add_argument("--state-dir", metavar="DIR",
                   help="the master's journal, secret and address: a master started again "
                        "on the same DIR takes its running applications back")
    p.add_argument("--log-dir", help="write each container's output to LOG_DIR/<id>.log")
    p.add_argument("--launcher", default="local", choices=launcher_names(),
                   help="how containers start (recording: start none; run them by hand)")
    _tls_options(p)
    _http_arguments(p)
    sub.add_parser("container", help="run a container (python -m container ...)",
                   add_help=False)
    p = command("submit", _cmd_submit, "submit an application to a running master")
    _app_argument(p)
    p = command("run", _cmd_run, "run an application here, with its own master and "
                "containers, until it ends")
    _app_argument(p)
    p.add_argument("--log-dir", help="write each container's output to LOG_DIR/<id>.log")
    p.add_argument("--run-timeout", type=float, metavar="S",
                   help="stop the application if it has not ended after S seconds")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress line (nor dashboard URL) while the application runs")
    _tls_options(p)
    _http_arguments(p)
    command("apps", _cmd_apps, "list the applications")
    p = command("app", _cmd_app, "one application: totals, rates, latency, operators, failures")
    p.add_argument("app_id", metavar="APP_ID")
    p = command("top", _cmd_top, "a live view of an application, refreshed until Ctrl-C "
                "(--json: one document per line)")
    p.add_argument("app_id", metavar="APP_ID")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds between refreshes (default 1)")
    p.add_argument("--count", type=int, metavar="N", help="stop after N refreshes")
    p = command("containers", _cmd_containers, "list the containers")
    p.add_argument("app_id", nargs="?", metavar="APP_ID", help="only this application's")
    p.add_argument("--app", metavar="APP_ID", help="only this application's (same)")
    p = command("operators", _cmd_operators, "list an application's operators and stats")
    p.add_argument("app_id", metavar="APP_ID")
    p = command("stats", _cmd_stats, "one operator's stats and recent windows")
    p.add_argument("app_id", metavar="APP_ID")
    p.add_argument("operator", metavar="OPERATOR", help="operator name or physical id")
    p.add_argument("--windows", type=int, default=10, metavar="N",
                   help="recent windows to show (default 10)")
    p = command("kill-container", _cmd_kill_container, "kill a container's process")
    p.add_argument("container_id", metavar="CONTAINER_ID")
    p = command("repartition", _cmd_repartition,
                "change the number of partitions of a running operator (its keyed state "
                "moves to the new partitions)")
    p.add_argument("app_id", metavar="APP_ID")
    p.add_argument("operator", metavar="OPERATOR", help="the DAG's operator name")
    p.add_argument("partitions", type=int, metavar="N", help="the new number of partitions")
    p = command("shutdown", _cmd_shutdown,
                "end an application gracefully: inputs stop after the current window")
    p.add_argument("app_id", metavar="APP_ID")
    p = command("kill", _cmd_kill, "kill an application now")
    p.add_argument("app_id", metavar="APP_ID")
    p.add_argument("--reason", default="", help="recorded as the application's diagnostics")
    return parser


def _split_command(argv: list[str]) -> tuple[list[str], str, list[str]]:
    """(global options, subcommand, the rest)."""
    i = 0
    while i < len(argv):
        token = argv[i]
        if token in _VALUE_OPTIONS:
            i += 2
            continue
        if not token.startswith("-"):
            return argv[:i], token, argv[i + 1:]
        i += 1
    return argv, "", []


def _option(argv: list[str], name: str) -> str | None:
    """The value of ``name VALUE`` or ``name=VALUE`` in ``argv``, if there."""
    value = next((argv[i + 1] for i, t in enumerate(argv[:-1]) if t == name), None)
    return value or next((t.split("=", 1)[1] for t in argv if t.startswith(name + "=")), None)


def _exec_container(head: list[str], tail: list[str]) -> int:
    """``weir container ...`` is ``python -m container ...`` (the master never imports it).

    The master's secret goes to the container in its environment (never its command
    line): ``--secret-file`` is passed on as it is, else ``$WEIR_SECRET`` is, else the
    secret file of a master on this machine (``auth.client_credentials``) is read here.
    """
    master = _option(tail, "--master") or _option(head, "--master") or default_master()
    if _option(tail, "--master") is None:
        tail = ["--master", master, *tail]
    if any(t in ("-v", "--verbose") or t.startswith("-vv") for t in head):
        tail = [*tail, "-v"]
    for name in ("--secret-file", "--tls-ca"):
        value = _option(head, name)
        if value is not None and _option(tail, name) is None:
            tail = [*tail, name, value]
    if _option(tail, "--secret-file") is None and not os.environ.get(SECRET_ENV):
        found = auth.client_credentials(master)
        if found.secret and Path(found.source).is_file():  # the master's file: its certificate too
            tail = [*tail, "--secret-file", found.source]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "container", *tail])
    return 1  # not reached


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (tests swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 \
        else logging.DEBUG
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_weir", False):
            root.removeHandler(handler)
    handler = _StderrHandler()
    handler._weir = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)


def _fail(message: str, status: int = 1) -> int:
    first = (message.strip().splitlines() or ["unknown error"])[0]
    print(f"weir: error: {first}", file=sys.stderr)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """The ``weir`` entry point; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    head, command, tail = _split_command(argv)
    if command == "container":
        return _exec_container(head, tail)
    try:
        args = build_parser().parse_args(argv)
    except _UsageError as exc:
        return _fail(str(exc), exc.status)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    args.master = getattr(args, "master", None) or default_master()
    args.json = getattr(args, "json", False)
    args.verbose = getattr(args, "verbose", 0)
    args.timeout = getattr(args, "timeout", 10.0)
    args.define = getattr(args, "define", None) or []
    args.config = getattr(args, "config", None)
    args.secret_file = getattr(args, "secret_file", None)
    args.tls_ca = getattr(args, "tls_ca", None)
    if (args.define or args.config) and args.command not in ("submit", "run"):
        return _fail(f"-D and --config apply to submit and run, not to {args.command}", 2)
    configure_logging(args.verbose)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except _USER_ERRORS as exc:
        _LOGGER.debug("command failed", exc_info=True)
        return _fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - the user gets a line, -v gets the traceback
        _LOGGER.info("internal error", exc_info=True)
        return _fail(f"internal error: {type(exc).__name__}: {exc} (run with -v for details)")


if __name__ == "__main__":
    sys.exit(main())

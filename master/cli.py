"""The ``weir`` command: run a master or a container, submit and inspect applications.

Bad input ends with one line on stderr (``weir: error: ...``) and a non-zero exit, never
a traceback. Here: the argument parser, logging and the entry point; the commands are in
``master.cli_queries`` (calls to a running master) and ``master.cli_processes`` (a
master, ``weir run`` and a container run here); overrides in ``master.cli_config``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import weir
from weir.master.cli_config import ConfigError, parse_defines, read_config
from weir.master.cli_processes import cmd_container, cmd_master, cmd_run
from weir.master.cli_queries import (
    cmd_app,
    cmd_apps,
    cmd_containers,
    cmd_kill,
    cmd_kill_container,
    cmd_logs,
    cmd_operators,
    cmd_repartition,
    cmd_shutdown,
    cmd_stats,
    cmd_submit,
    cmd_top,
)
from weir.master.cli_savepoints import cmd_savepoint
from weir.master.client import DEFAULT_MASTER, WeirClientError, find_master
from weir.master.errors import MasterError
from weir.master.launcher import launcher_names
from weir.master.physical_plan import PlanError
from weir.master.server import MasterStartError
from weir.operators.app import AppLoadError
from weir.operators.attributes import InvalidAttribute
from weir.operators.dag import DagError

__all__ = ["ConfigError", "main", "parse_defines", "read_config"]

_LOGGER = logging.getLogger(__name__)

_USER_ERRORS = (WeirClientError, AppLoadError, DagError, PlanError, InvalidAttribute,
                MasterError, MasterStartError, OSError, ValueError, TimeoutError)


class _UsageError(Exception):
    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, raised instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{message} (see `{self.prog} --help`)")


def _common() -> argparse.ArgumentParser:
    """Options accepted before or after the subcommand (defaults filled in later)."""
    common = _Parser(add_help=False)
    common.add_argument("--master", default=argparse.SUPPRESS, metavar="HOST:PORT",
                        help="the master to talk to (default: $WEIR_MASTER, else "
                             f"{DEFAULT_MASTER} if it answers, else the one master of this "
                             "machine and user that does, e.g. a `weir run`; several: an "
                             "error)")
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


def port_number(lowest: int = 0) -> Callable[[str], int]:
    """An argparse type: a TCP port, ``lowest``..65535 (a larger number is refused, not
    wrapped around: 70000 would listen on 4464)."""

    def port(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid port {text!r}: give a number in "
                                             f"{lowest}..65535") from None
        if not lowest <= value <= 65535:
            raise argparse.ArgumentTypeError(f"port {value} is outside {lowest}..65535")
        return value

    return port


def absolute_location(path: str | None) -> str | None:
    """A local path made absolute against the caller's working folder (the master and its
    containers have their own); a URI (``scheme://``) and nothing stay as they are."""
    if not path or "://" in path or os.path.isabs(path):
        return path
    return os.path.abspath(path)


def _absolute_savepoints(args: argparse.Namespace) -> None:
    """Savepoint paths given to this command, made absolute before they are sent."""
    for name in ("path", "from_savepoint"):
        if args.command in ("savepoint", "submit", "run") and getattr(args, name, None):
            setattr(args, name, absolute_location(getattr(args, name)))


def _http_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--http-port", type=port_number(-1), default=0, metavar="PORT",
                        help="the dashboard, JSON API and /metrics on this port of the "
                             "master's host (default 0: any free port, printed; -1: none)")
    parser.add_argument("--http-open", action="store_true",
                        help="serve the dashboard and JSON API to anyone who reaches the "
                             "port, without the read-only HTTP token (printed in the "
                             "dashboard's URL; derived from the master's secret, never the "
                             "secret itself) that they need otherwise")
    parser.add_argument("--metrics-open", action="store_true",
                        help="serve /metrics without the read-only HTTP token (for a "
                             "Prometheus that cannot send one)")


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


CHANGING_COMMANDS = frozenset({"submit", "kill", "shutdown", "savepoint", "kill-container",
                               "repartition"})
"""Commands that change something on the master: they say which one when it was not named."""


def _found_master(command: str) -> str:
    """The master a command without ``--master`` talks to (``master`` and ``run`` start
    their own); a command that changes something says which one and how it was found."""
    address, how = find_master()
    if how and command in CHANGING_COMMANDS:
        print(f"weir: using the master at {address} ({how}; --master HOST:PORT names "
              "another)", file=sys.stderr)
    return address


def _host_arguments(p: argparse.ArgumentParser) -> None:
    """Where a master listens, and the address it gives its containers."""
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; an address other hosts "
                        "reach, or 0.0.0.0, for containers on other hosts or in a cluster)")
    p.add_argument("--advertise-host", metavar="ADDR",
                   help="host of the address the master prints and gives its containers "
                        "(default: --host; 127.0.0.1 for 0.0.0.0)")


def _launcher_arguments(p: argparse.ArgumentParser) -> None:
    """--launcher and each launcher's own options (``cli_processes.launcher_options``)."""
    p.add_argument("--launcher", default="local", choices=launcher_names(),
                   help="how containers start: local processes, kubernetes pods, ray "
                        "actors, or recording (start none; run them by hand)")
    k8s = p.add_argument_group("--launcher kubernetes")
    k8s.add_argument("--k8s-image", metavar="IMAGE",
                     help="the containers' image (Weir and Java in it: deploy/Dockerfile)")
    k8s.add_argument("--k8s-namespace", metavar="NS",
                     help="their namespace (default: the kubeconfig context's, or the "
                          "master pod's own)")
    k8s.add_argument("--kubeconfig", metavar="FILE",
                     help="the cluster (default: in a pod its service account, else "
                          "~/.kube/config)")
    k8s.add_argument("--k8s-service-account", metavar="NAME", default="",
                     help="the containers' pods' service account")
    k8s.add_argument("--k8s-pod-template", metavar="FILE",
                     help="a Pod manifest the pods start from (node selector, tolerations, "
                          "security context)")
    ray = p.add_argument_group("--launcher ray")
    ray.add_argument("--ray-address", metavar="ADDR",
                     help="the Ray cluster (what `ray start --head` printed; default: auto)")


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    attributes = _attribute_parent()
    parser = _Parser(prog="weir", parents=[common, attributes],
                     description="Weir: a stream-processing runtime (master, containers, CLI).")
    parser.add_argument("--version", action="version", version=f"weir {weir.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def command(name: str, func: Callable[[argparse.Namespace], int], text: str
                ) -> argparse.ArgumentParser:
        parents = [common, attributes] if name in ("submit", "run") else [common]
        p = sub.add_parser(name, parents=parents, help=text, description=text)
        p.set_defaults(func=func)
        return p

    p = command("master", cmd_master, "run a master until Ctrl-C or SIGTERM")
    _host_arguments(p)
    p.add_argument("--port", type=port_number(), default=5151,
                   help="port (0 = any free port; at most 65535)")
    p.add_argument("--state-dir", metavar="DIR",
                   help="the master's journal, secret and address: a master started again "
                        "on the same DIR takes its running applications back")
    p.add_argument("--log-dir", help="write each container's output to LOG_DIR/<id>.log")
    p.add_argument("--application-masters", action="store_true",
                   help="a dispatcher that runs each application in a master process of "
                        "its own (its own lock, core and secret), under --state-dir")
    _launcher_arguments(p)
    _tls_options(p)
    _http_arguments(p)
    p = command("container", cmd_container,
                "run a container here (python -m weir.container; its own options, such as "
                "--id ID, --host ADDR and --advertise-host ADDR, are passed on)")
    p.set_defaults(forwards=True)
    p = command("submit", cmd_submit, "submit an application to a running master")
    _app_argument(p)
    p.add_argument("--from-savepoint", metavar="PATH",
                   help="start every operator from this savepoint's state (matched by name)")
    p.add_argument("--allow-dropped", action="store_true",
                   help="with --from-savepoint: accept that operators of the savepoint are "
                   "not in the application (their state is left behind)")
    p = command("run", cmd_run, "run an application here, with its own master and "
                "containers, until it ends")
    _app_argument(p)
    _host_arguments(p)
    p.add_argument("--log-dir", help="write each container's output to LOG_DIR/<id>.log")
    _launcher_arguments(p)
    p.add_argument("--run-timeout", type=float, metavar="S",
                   help="stop the application if it has not ended after S seconds")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress line (nor dashboard URL) while the application runs")
    _tls_options(p)
    _http_arguments(p)
    command("apps", cmd_apps, "list the applications")
    p = command("app", cmd_app, "one application: totals, rates, latency, operators, failures")
    p.add_argument("app_id", metavar="APP_ID")
    p = command("top", cmd_top, "a live view of an application, refreshed until Ctrl-C "
                "(--json: one document per line)")
    p.add_argument("app_id", metavar="APP_ID")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds between refreshes (default 1)")
    p.add_argument("--count", type=int, metavar="N", help="stop after N refreshes")
    p = command("containers", cmd_containers, "list the containers")
    p.add_argument("app_id", nargs="?", metavar="APP_ID", help="only this application's")
    p.add_argument("--app", metavar="APP_ID", help="only this application's (same)")
    p = command("operators", cmd_operators, "list an application's operators and stats")
    p.add_argument("app_id", metavar="APP_ID")
    p = command("stats", cmd_stats, "one operator's stats and recent windows")
    p.add_argument("app_id", metavar="APP_ID")
    p.add_argument("operator", metavar="OPERATOR", help="operator name or physical id")
    p.add_argument("--windows", type=int, default=10, metavar="N",
                   help="recent windows to show (default 10)")
    p = command("logs", cmd_logs, "the end of an application's container logs (the master "
                "keeps them with --log-dir; a pod's log with --launcher kubernetes)")
    p.add_argument("app_id", metavar="APP_ID")
    p.add_argument("container_id", nargs="?", metavar="CONTAINER_ID",
                   help="only this container's (default: every container of the application)")
    p.add_argument("--bytes", type=int, default=0, metavar="N",
                   help="the last N bytes of each log (default 65536)")
    p = command("kill-container", cmd_kill_container, "kill a container's process")
    p.add_argument("container_id", metavar="CONTAINER_ID")
    p = command("repartition", cmd_repartition,
                "change the number of partitions of a running operator (its keyed state "
                "moves to the new partitions)")
    p.add_argument("app_id", metavar="APP_ID")
    p.add_argument("operator", metavar="OPERATOR", help="the DAG's operator name")
    p.add_argument("partitions", type=int, metavar="N", help="the new number of partitions")
    p = command("shutdown", cmd_shutdown,
                "end an application gracefully: inputs stop after the current window")
    p.add_argument("app_id", metavar="APP_ID")
    p = command("savepoint", cmd_savepoint,
                "save every operator's state under PATH (a path or a pyarrow.fs URI) while "
                "the application runs on, or with --stop, finishing it")
    p.add_argument("app_id", metavar="APP_ID")
    p.add_argument("path", metavar="PATH", help="a new folder (or URI) for the savepoint")
    p.add_argument("--stop", action="store_true",
                   help="end the sources after their current window and finish the "
                   "application with the savepoint")
    p.add_argument("--wait", type=float, default=600.0, metavar="S",
                   help="seconds to wait for the savepoint (default 600)")
    p = command("kill", cmd_kill, "kill an application now")
    p.add_argument("app_id", metavar="APP_ID")
    p.add_argument("--reason", default="", help="recorded as the application's diagnostics")
    return parser


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
    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown and not getattr(args, "forwards", False):
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    except _UsageError as exc:
        return _fail(str(exc), exc.status)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    args.forward = unknown
    # found, not given: a command that waits finds the master again if it restarts
    args.master_found = not getattr(args, "master", None) and not os.environ.get("WEIR_MASTER")
    try:
        args.master = getattr(args, "master", None) or (
            "" if args.command in ("master", "run") else _found_master(args.command))
    except WeirClientError as exc:
        return _fail(str(exc), 2)
    args.json = getattr(args, "json", False)
    args.verbose = getattr(args, "verbose", 0)
    args.timeout = getattr(args, "timeout", 10.0)
    args.define = getattr(args, "define", None) or []
    args.config = getattr(args, "config", None)
    args.secret_file = getattr(args, "secret_file", None)
    args.tls_ca = getattr(args, "tls_ca", None)
    if (args.define or args.config) and args.command not in ("submit", "run"):
        return _fail(f"-D and --config apply to submit and run, not to {args.command}", 2)
    _absolute_savepoints(args)
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

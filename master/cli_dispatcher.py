"""``weir master --application-masters``: the dispatcher in the foreground (``master.
dispatcher``), until Ctrl-C or SIGTERM, which stop every application master and so every
container, as stopping ``weir master`` does."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading

from weir.master import auth
from weir.master.cli_output import print_json
from weir.proto.contract import SECRET_ENV

__all__ = ["run_dispatcher"]


def _refuse_unsupported(args: argparse.Namespace) -> None:
    """Options a dispatcher does not carry out yet: refused, never ignored."""
    given = [flag for flag, on in (
        ("--tls-cert/--tls-key", args.tls_cert or args.tls_key),
        ("--http-port", args.http_port > 0), ("--http-open", args.http_open),
        ("--metrics-open", args.metrics_open)) if on]
    if given:
        raise ValueError(f"{', '.join(given)}: not served with --application-masters yet "
                         "(each application master is reached through the dispatcher's "
                         "client API); leave them out, or run without --application-masters")


def run_dispatcher(args: argparse.Namespace, launcher_options: dict[str, object]) -> int:
    from weir.master.dispatcher_server import DispatcherServer

    _refuse_unsupported(args)
    secret = (auth.read_secret_file(args.secret_file)[0] if args.secret_file
              else os.environ.get(SECRET_ENV) or None)
    scratch = None if args.state_dir else tempfile.mkdtemp(prefix="weir-dispatcher-")
    server = DispatcherServer(args.state_dir or scratch, args.host, args.port,
                              launcher=args.launcher, launcher_options=launcher_options,
                              secret=secret, advertise_host=args.advertise_host)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set())
                for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        address = server.start()
        if args.json:
            print_json({"address": address, "secret_file": str(server.secret_file or ""),
                        "tls": True, "dashboard": "", "application_masters": True})
        else:
            print(address)
            print(f"weir: one master process per application, under {server.state_dir}; "
                  f"the secret is in {server.secret_file} (mode 0600)", file=sys.stderr)
        sys.stdout.flush()
        stop.wait()
    finally:
        server.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0

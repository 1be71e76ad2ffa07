"""``python -m weir.master.app_master``: one application's own master, as Apex runs one
Stram per application (its YARN ApplicationMaster) and Flink one JobMaster per job.

The dispatcher (``master.dispatcher``, ``weir master --application-masters``) starts one
per application it accepts, in the application's own folder, and is its only client: it
forwards the submit (with the application's id) and every later call. The application
master plans, deploys, answers its containers' heartbeats, journals and recovers, exactly
as a master of many applications does (``MasterServer``), for this one application and
nothing else: a DAG that takes long to plan, or code that misbehaves in it, stops no other
application, and its containers hold only its secret.

What it keeps in its folder (made owner-only): its journal, its secret, its TLS pair and
``master.json`` (its address), which the dispatcher reads, and which its containers re-read
after a restart. It stops (its containers with it) on SIGTERM; it exits 1 if its journal
fails (``MasterServer.halted``).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading

from weir.master.launcher import launcher_factory
from weir.master.server import MasterServer

__all__ = ["main"]

_LOGGER = logging.getLogger("weir.master.app_master")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m weir.master.app_master",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--app-id", required=True, help="the one application it runs")
    parser.add_argument("--state-dir", required=True, help="its own folder")
    parser.add_argument("--launcher", default="local", help="how it starts containers")
    parser.add_argument("--launcher-options", default="{}", help="the launcher's, as JSON")
    parser.add_argument("--host", default="127.0.0.1", help="the address it listens on")
    parser.add_argument("--advertise-host", default=None,
                        help="the host its containers reach it by (default: --host)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    factory = launcher_factory(args.launcher, **json.loads(args.launcher_options))
    server = MasterServer(args.host, 0, factory, state_dir=args.state_dir,
                          publish_secret=False, http_port=None,
                          advertise_host=args.advertise_host, only_application=args.app_id)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: stop.set())
    try:
        server.start()
        while not stop.wait(0.5) and not server.halted.is_set():
            pass
        if server.halted.is_set():
            print(f"weir: error: {server.core.halted}", file=sys.stderr)
            return 1
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())

"""The container process: join the master, serve a buffer server, run operators until told to stop.

Started by the master's launcher as ``python -m container --master HOST:PORT --id ID``
(or by hand as ``weir container ...``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

import grpc

from container.buffer_server import BufferServer
from container.deploy import Deployment
from container.heartbeat_loop import HeartbeatLoop
from container.spark_bridge import SparkSessionBridge
from container.stats import ProcessStats
from container.umbilical_client import MasterUnreachable, UmbilicalClient
from operators.attributes import resolve

__all__ = ["main"]

_LOGGER = logging.getLogger("container")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="weir container",
                                     description="Run a Weir worker container.")
    parser.add_argument("--master", required=True, help="the master's HOST:PORT")
    parser.add_argument("--id", required=True, dest="container_id",
                        help="the container id the master assigned")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address the buffer server binds and advertises")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s container={args.container_id} %(name)s: %(message)s")
    if ":" not in args.master:
        print(f"weir container: error: bad master address {args.master!r}: expected HOST:PORT",
              file=sys.stderr)
        return 2
    client = UmbilicalClient(args.master, retry_window_s=30.0)
    try:
        context = client.get_init_context(args.container_id)
    except MasterUnreachable as exc:
        print(f"weir container: error: {exc}", file=sys.stderr)
        return 1
    except grpc.RpcError as exc:
        print(f"weir container: error: master {args.master} refused container "
              f"{args.container_id!r}: {exc.details()}", file=sys.stderr)
        return 1
    attributes = dict(context.attributes)
    client.retry_window_s = max(resolve("HEARTBEAT_TIMEOUT_MILLIS", attributes) / 1000, 5.0)
    buffer_server = BufferServer(host=args.host, port=0)
    buffer_server.start()
    spark = SparkSessionBridge.from_attributes(
        {name: resolve(name, attributes)
         for name in ("SPARK_MASTER", "SPARK_SHUFFLE_PARTITIONS", "SPARK_DRIVER_MEMORY",
                      "SPARK_WARMUP_ROWS")},
        app_name=f"weir-{context.application_id}-{args.container_id}")
    process_stats = ProcessStats()
    loop: HeartbeatLoop | None = None
    deployment = Deployment(context.application_id, args.container_id, buffer_server, spark,
                            context.start_window_millis, attributes,
                            on_change=lambda: loop.wake() if loop else None)
    loop = HeartbeatLoop(args.container_id, client, deployment, process_stats,
                         buffer_server.address, context.heartbeat_interval_millis)
    signal.signal(signal.SIGTERM, lambda *_: loop.stop())
    _LOGGER.info("container %s (pid %d) joined %s; buffer server at %s:%d", args.container_id,
                 os.getpid(), args.master, *buffer_server.address)
    reason = "stopped"
    try:
        reason = loop.run()
    except KeyboardInterrupt:
        reason = "interrupted"
    finally:
        deployment.stop_all()
        buffer_server.close()
        spark.stop()
        process_stats.close()
        client.close()
    _LOGGER.info("container %s exits: %s", args.container_id, reason)
    return 0 if reason in ("aborted by the master", "stopped", "interrupted") else 1

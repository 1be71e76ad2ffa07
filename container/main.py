"""The container process: join the master, serve a buffer server, run operators until told to stop.

Started by the master's launcher as ``python -m weir.container --master HOST:PORT --id ID``
(or by hand as ``weir container ...``, possibly on another host: see ``--host`` and
``--advertise-host``). The master's secret comes in the environment
(``WEIR_SECRET``, never on the command line, which ``ps`` shows everyone) or from
``--secret-file``; the certificates the master and other buffer servers must prove before
the secret is sent come from ``WEIR_TLS_CA`` / ``--tls-ca`` or the master's secret file.
No certificate, no start: the secret never goes to a peer that proved nothing. The
buffer server serves the TLS identity the master hands over in the init context.
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import json
import logging
import os
import signal
import socket
import stat
import sys
import threading
from pathlib import Path
from typing import BinaryIO

import grpc

from weir.container.buffer_server import BufferServer
from weir.container.deploy import Deployment
from weir.container.heartbeat_loop import HeartbeatLoop
from weir.container.lease import Lease
from weir.container.memory_shares import buffer_memory_bytes, use_container_pool
from weir.container.parent_death import die_with_parent
from weir.container.stats import ProcessStats
from weir.container.umbilical_client import MasterUnreachable, UmbilicalClient
from weir.operators.attributes import ATTRIBUTES, resolve
from weir.proto.contract import MASTER_FILE_ENV, SECRET_ENV, TLS_CA_ENV
from weir.runtime.spark.bridge import SparkSessionBridge
from weir.storage.mounted_secrets import is_secret_volume_key, read_secret_volume_key
from weir.storage.private_files import read_private_file

__all__ = ["main"]

_LOGGER = logging.getLogger("weir.container")

_WILDCARD_HOSTS = {"0.0.0.0", "::", "[::]", ""}


class _Credentials:
    """The master's secret and the certificates it must prove, read once at start."""

    def __init__(self, args: argparse.Namespace) -> None:
        fields = (_read_secret_file(args.secret_file) if args.secret_file
                  else _read_secret_pipe(sys.stdin.buffer) if args.secret_stdin else {})
        self.secret = str(fields.get("secret") or os.environ.get(SECRET_ENV, "")).strip()
        if not self.secret:
            raise ValueError(f"no secret for master {args.master}: set {SECRET_ENV} or pass "
                             "--secret-file (`weir container` finds the secret of a master "
                             "on this machine)")
        # Operators and Spark's processes need not see it.
        os.environ.pop(SECRET_ENV, None)
        if args.tls_ca:
            self.tls_root_certs = _read(args.tls_ca)
        elif fields.get("tls_ca_pem"):
            self.tls_root_certs = str(fields["tls_ca_pem"]).encode("ascii")
        else:
            raise ValueError(f"no certificate to check master {args.master} by, so its "
                             f"secret stays here: set {TLS_CA_ENV} or pass --tls-ca, or pass "
                             "--secret-file with a copy of the master's secret file (it "
                             "holds the certificate)")


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None


def _read_secret_file(path: str) -> dict[str, object]:
    """A master's secret file (JSON with ``secret`` and ``tls_ca_pem``) or a file holding
    just the secret, as fields. Only a regular file of this user that nobody else can read
    or write counts (it names the certificate the master is proven by), or a key of a
    Kubernetes Secret volume that passes ``storage.mounted_secrets``' checks."""
    try:
        if is_secret_volume_key(path):  # a Kubernetes Secret volume: the kubelet's links
            text = read_secret_volume_key(path, "the secret file").decode().strip()
        else:
            text = read_private_file(path, "the secret file", secret=True,
                                     advice="chmod 600 it if it is yours, or copy the "
                                     "master's secret file to a file of your own"
                                     ).decode().strip()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    fields: dict[str, object] = {"secret": text}
    if text.startswith("{"):
        try:
            fields = dict(json.loads(text))
        except (ValueError, TypeError):
            pass
    if not str(fields.get("secret") or "").strip():
        raise ValueError(f"secret file {path} holds no secret")
    return fields


def _read_secret_pipe(stream: BinaryIO) -> dict[str, object]:
    """The master's credentials from a pipe (``--secret-stdin``: how the Ray actor hands
    them over, so that they are never in the container's environment): the secret file's
    JSON, read to its end."""
    if not stat.S_ISFIFO(os.fstat(stream.fileno()).st_mode):
        raise ValueError("--secret-stdin: standard input is not a pipe; pipe the master's "
                         "credentials in (JSON with \"secret\" and \"tls_ca_pem\"), or use "
                         "--secret-file")
    text = stream.read(1 << 20).decode().strip()
    try:
        fields = dict(json.loads(text)) if text.startswith("{") else {"secret": text}
    except (ValueError, TypeError) as exc:
        raise ValueError(f"--secret-stdin: the credentials piped in are not JSON: {exc}"
                         ) from None
    if not str(fields.get("secret") or "").strip():
        raise ValueError("--secret-stdin: the credentials piped in hold no secret")
    return fields


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="weir container",
                                     description="Run a Weir worker container.")
    parser.add_argument("--master", required=True, help="the master's HOST:PORT")
    parser.add_argument("--id", required=True, dest="container_id",
                        help="the container id the master assigned")
    parser.add_argument("--host", metavar="ADDR",
                        help="address the buffer server listens on (default: this host's "
                             "address on the route to the master; 127.0.0.1 for a master "
                             "on loopback)")
    parser.add_argument("--advertise-host", metavar="ADDR",
                        help="address other containers reach the buffer server at, sent to "
                             "the master in heartbeats (default: --host, or the route "
                             "address when --host is a wildcard such as 0.0.0.0)")
    parser.add_argument("--secret-file", metavar="FILE",
                        help=f"the master's secret (default: ${SECRET_ENV})")
    parser.add_argument("--secret-stdin", action="store_true",
                        help="read the master's credentials (the secret file's JSON) from "
                             "a pipe on standard input: they never enter the environment")
    parser.add_argument("--tls-ca", default=os.environ.get(TLS_CA_ENV), metavar="PEM",
                        help="the certificates the master and other buffer servers must "
                             f"prove (default: ${TLS_CA_ENV}, else the secret file's)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    return parser.parse_args(argv)


def route_address(master: str) -> str:
    """This host's address on the route to ``master`` (``HOST:PORT``).

    The default for the buffer server, because the master's network is the one other
    containers share: a UDP ``connect`` sends nothing but makes the kernel pick the
    route and its source address. A master on loopback gives 127.0.0.1 (a local run
    keeps everything on loopback).

    Raises:
        OSError: the master's host cannot be resolved or has no route.
    """
    host, _, port = master.rpartition(":")
    infos = socket.getaddrinfo(host.strip("[]"), int(port) if port.isdecimal() else 0,
                               socket.AF_INET, socket.SOCK_DGRAM)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(infos[0][4])
        return str(probe.getsockname()[0])


MASTER_RETRY_S = 30.0
"""How long a container keeps calling a master that went away (it may be restarting)."""


def master_retry_window_s(attributes: dict[str, str]) -> float:
    """How long heartbeats retry an unreachable master before the container gives up.

    A restarted master adopts its containers and gives each a fresh heartbeat timeout,
    so a container should outlast a slow restart: 30 s, or the heartbeat timeout if
    longer (no master would have declared it lost before that anyway).
    """
    return max(MASTER_RETRY_S, resolve("HEARTBEAT_TIMEOUT_MILLIS", attributes) / 1000)


def buffer_server_hosts(master: str, host: str | None, advertise_host: str | None
                        ) -> tuple[str, str]:
    """(listen address, advertised address) of the buffer server, from the options.

    Raises:
        OSError: a default needs the route to the master and there is none.
    """
    bind = host or route_address(master)
    if advertise_host:
        return bind, advertise_host
    return bind, route_address(master) if bind in _WILDCARD_HOSTS else bind


def warm_spare_or_stop(spark: SparkSessionBridge, loop: HeartbeatLoop, failure: list[str],
                       container_id: str) -> None:
    """Warms a spare's Spark; if it cannot start, stops the heartbeat loop with the reason
    in ``failure``: the process exits, and the master, seeing it, starts another spare
    (a spare that never warms would wait as SPARE_STARTING for good, of no use)."""
    try:
        spark.warm_up(bounded=False)
    except Exception as exc:  # noqa: BLE001 - any failure: this spare is no use
        _LOGGER.exception("container %s: a spare whose Spark cannot start is no use; "
                          "exiting, so the master starts another", container_id)
        failure.append(f"Spark did not start in this spare: {exc}")
        loop.stop()


def start_spark(spark: SparkSessionBridge) -> None:
    """Starts Spark's session before the operators ask for it (each warms its own query
    as it activates); a failure is left to the operators, whose activation meets it again
    and fails saying why."""
    try:
        spark.session  # noqa: B018 - starting it is the point
    except Exception as exc:  # noqa: BLE001 - the operators hear it when they activate
        _LOGGER.info("Spark could not start (%s); the operators that need it will fail "
                     "saying why", type(exc).__name__)


def report_exit(client: UmbilicalClient, container_id: str, reason: str) -> None:
    """Tells the master why this container exits on its own (best effort: it may be gone)."""
    try:
        client.report_error(container_id, [], reason)
    except (grpc.RpcError, MasterUnreachable) as exc:
        _LOGGER.warning("could not tell the master why container %s exits: %s", container_id,
                        exc)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    die_with_parent()
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s container={args.container_id} %(name)s: %(message)s")
    if ":" not in args.master:
        print(f"weir container: error: bad master address {args.master!r}: expected HOST:PORT",
              file=sys.stderr)
        return 2
    try:
        credentials = _Credentials(args)
    except ValueError as exc:
        print(f"weir container: error: {exc}", file=sys.stderr)
        return 2
    client = UmbilicalClient(args.master, retry_window_s=MASTER_RETRY_S,
                             secret=credentials.secret,
                             tls_root_certs=credentials.tls_root_certs,
                             address_file=os.environ.get(MASTER_FILE_ENV))
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
    client.retry_window_s = master_retry_window_s(attributes)
    try:  # the address that answered get_init_context (it may come from master.json)
        bind_host, advertised_host = buffer_server_hosts(client.address, args.host,
                                                         args.advertise_host)
    except OSError as exc:
        print(f"weir container: error: no route to master {client.address} to pick the "
              f"buffer server's address ({exc.strerror or exc}); pass --host",
              file=sys.stderr)
        client.close()
        return 1
    identity = context.buffer_server_tls
    if not identity.certificate_pem or not identity.private_key_pem:
        print(f"weir container: error: master {client.address} sent no TLS identity for the "
              "buffer server (is it an older Weir?)", file=sys.stderr)
        client.close()
        return 1
    limit = {name: resolve(name, attributes) for name in ("CONTAINER_MEMORY_MB",
                                                          "BUFFER_MEMORY_MB")}
    arrow_pool = use_container_pool()
    buffer_server = BufferServer(host=bind_host, port=0, secret=credentials.secret,
                                 tls=(identity.certificate_pem, identity.private_key_pem),
                                 memory_budget_bytes=buffer_memory_bytes(limit))
    buffer_server.start()
    advertised = (advertised_host, buffer_server.address[1])
    spark = SparkSessionBridge.from_attributes(
        {name: resolve(name, attributes) for name in ATTRIBUTES if name.startswith("SPARK_")},
        app_name=f"weir-{context.application_id}-{args.container_id}")
    process_stats = ProcessStats()
    lease = Lease(resolve("HEARTBEAT_TIMEOUT_MILLIS", attributes))
    loop: HeartbeatLoop | None = None
    deployment = Deployment(context.application_id, args.container_id, buffer_server, spark,
                            context.start_window_millis, attributes,
                            on_change=lambda: loop.wake() if loop else None,
                            secret=credentials.secret,
                            tls_root_certs=credentials.tls_root_certs, lease=lease,
                            advertised=advertised)
    loop = HeartbeatLoop(args.container_id, client, deployment, process_stats,
                         advertised, context.heartbeat_interval_millis, lease,
                         spare_interval_ms=context.spare_heartbeat_interval_millis
                         if context.spare else 0,
                         spark_warm=lambda: spark.warm)
    signal.signal(signal.SIGTERM, lambda *_: loop.stop())
    # `kill -USR1 PID` writes every thread's stack to this container's log: how a
    # stalled container is diagnosed without stopping it
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    spare_failure: list[str] = []  # why a spare's Spark could not start, if it could not
    if context.warm_spark:  # a spare: Spark is hot by the time it is given operators
        warm_spare = functools.partial(warm_spare_or_stop, spark, loop, spare_failure,
                                       args.container_id)
        threading.Thread(target=warm_spare, name="spark-warm-up", daemon=True).start()
    elif context.start_spark:  # its operators run Spark: the JVM starts beside the deploy
        threading.Thread(target=start_spark, args=(spark,), name="spark-start",
                         daemon=True).start()
    _LOGGER.info("container %s (pid %d) joined %s; buffer server on %s:%d, advertised as "
                 "%s:%d; Arrow memory from %s", args.container_id, os.getpid(),
                 client.address, *buffer_server.address, *advertised, arrow_pool)
    reason = "stopped"
    try:
        reason = loop.run()
    except KeyboardInterrupt:
        reason = "interrupted"
    finally:
        lease.revoke()  # whatever the reason, this container acts no more
        loop.close()
        deployment.stop_all()
        buffer_server.close()
        spark.stop()
        process_stats.close()
        if spare_failure:  # a state and an error on the master, not only this log
            reason = spare_failure[0]
            report_exit(client, args.container_id, reason)
        client.close()
    _LOGGER.info("container %s exits: %s", args.container_id, reason)
    return 0 if reason in ("aborted by the master", "stopped", "interrupted") else 1

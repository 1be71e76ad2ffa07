"""The heartbeat loop: collect stats, send the heartbeat, carry out the master's answer."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc

from weir.container.deploy import DeployError, Deployment
from weir.container.deploy_queue import DeployQueue
from weir.container.heartbeat_reply import (
    Abort,
    Activate,
    Commit,
    EndInputs,
    Redeploy,
    TakeSavepoint,
    instructions,
)
from weir.container.lease import Lease
from weir.container.stats import ProcessStats
from weir.container.umbilical_client import MasterUnreachable, UmbilicalClient
from weir.operators.windows import format_window_id
from weir.proto import plan_pb2, umbilical_pb2

__all__ = ["HeartbeatLoop"]

_LOGGER = logging.getLogger(__name__)


class HeartbeatLoop:
    """Heartbeats every interval, and at once when ``wake()`` is called (a state change).

    Runs in the container's main thread until the master answers ABORT, the master
    cannot be reached for the client's retry window, or ``stop()`` is called.
    ``buffer_server_address`` is what the master hands to downstream containers: the
    advertised host (``--advertise-host``), which need not be the address bound. Every
    answer but ABORT renews ``lease``; ABORT revokes it. Deploys and undeploys go to a
    ``DeployQueue`` (its own thread), so none of them delays a heartbeat.

    A spare (``spare_interval_ms`` > 0) heartbeats that often until its first deploy
    request: deploys come only in replies, and a spare's come when it must take over a
    lost container's operators, at once. ``spark_warm`` says whether the container's
    SparkSession is warm, for the master to know when a spare is ready.
    """

    def __init__(self, container_id: str, client: UmbilicalClient, deployment: Deployment,
                 process_stats: ProcessStats, buffer_server_address: tuple[str, int],
                 interval_ms: int, lease: Lease | None = None, *, spare_interval_ms: int = 0,
                 spark_warm: Callable[[], bool] = lambda: False) -> None:
        self.container_id = container_id
        self.client = client
        self.deployment = deployment
        self.process_stats = process_stats
        self.host, self.port = buffer_server_address
        self.interval_ms = interval_ms
        self.lease = lease
        self.spare_interval_ms = spare_interval_ms  # 0 once it was given operators
        self.spark_warm = spark_warm
        self.committed_window_id = -1
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.deploys = DeployQueue(deployment, self._deploy_failed, self.wake)

    def close(self) -> None:
        """Stops the deploy queue (after ``run`` returned)."""
        self.deploys.close()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def build(self) -> umbilical_pb2.ContainerHeartbeat:
        sample = self.process_stats.sample()
        return umbilical_pb2.ContainerHeartbeat(
            container_id=self.container_id,
            buffer_server_host=self.host,
            buffer_server_port=self.port,
            jvm_name=self.process_stats.process_name,
            pid=self.process_stats.pid, host=self.process_stats.host,
            memory_mb_free=sample.memory_mb_free,
            memory_rss_mb=sample.memory_rss_mb,
            cpu_percent=sample.cpu_percent,
            gc_collection_count=sample.gc_collection_count,
            gc_collection_time_ms=sample.gc_collection_time_ms,
            stats=umbilical_pb2.ContainerStats(
                id=self.container_id, operators=[*self.deployment.heartbeats(self.interval_ms),
                                                 *self.deploys.placeholders()]),
            sent_tms=time.time_ns() // 1_000_000, spark_warm=self.spark_warm(),
            buffer_server=self.deployment.buffer_server.room(),
        )

    def run(self) -> str:
        """Heartbeats until told to stop; returns why it stopped.

        An error answer (INTERNAL, a refused secret, a master that stops) is not the end:
        the container keeps its operators and heartbeats on, as for an unreachable master,
        and gives up only when the master has kept refusing for the client's retry window.
        Its lease is not renewed meanwhile, so its operators stop writing when it runs out.
        """
        refused_since: float | None = None
        while not self._stop.is_set():
            self._wake.clear()
            sent_at = time.monotonic()
            try:
                response = self.client.heartbeat(self.build())
            except MasterUnreachable as exc:
                _LOGGER.error("container %s: %s; exiting", self.container_id, exc)
                if self.lease is not None:
                    self.lease.revoke()
                return "master unreachable"
            except grpc.RpcError as exc:
                refused_since = refused_since if refused_since is not None else sent_at
                refused_s = time.monotonic() - refused_since
                detail = f"{exc.code()}: {exc.details()}" if hasattr(exc, "code") else exc
                if refused_s >= self.client.retry_window_s:
                    _LOGGER.error("container %s: the master kept refusing heartbeats for "
                                  "%.0f s (%s); exiting", self.container_id, refused_s,
                                  detail)
                    if self.lease is not None:
                        self.lease.revoke()
                    return "master kept refusing"
                _LOGGER.warning("container %s: the master refused a heartbeat (%s); "
                                "retrying", self.container_id, detail)
                self._wake.wait(self.interval_ms / 1000)
                continue
            refused_since = None
            if self.lease is not None:
                if response.shutdown == umbilical_pb2.SHUTDOWN_TYPE_ABORT:
                    self.lease.revoke()
                else:
                    self.lease.renew(sent_at)
            outcome = self.apply(response)
            if outcome:
                return outcome
            delay_s = 0.05 if response.has_pending_requests else \
                (self.spare_interval_ms or self.interval_ms) / 1000
            self._wake.wait(delay_s)
        return "stopped"

    def apply(self, response: umbilical_pb2.ContainerHeartbeatResponse) -> str | None:
        """Carries out one answer (``heartbeat_reply.instructions``); returns a reason to
        exit, or None to go on."""
        for step in instructions(response, self.committed_window_id):
            match step:
                case Abort():
                    _LOGGER.info("container %s: master says ABORT", self.container_id)
                    return "aborted by the master"
                case Redeploy(undeploy=undeploy, deploy=deploy):
                    self.deploys.submit(undeploy, deploy)
                    if deploy:
                        self.spare_interval_ms = 0  # a spare no more: the usual pace
                        self.wake()  # report the new operators at once
                case Activate(operator_ids=ids):
                    self.deployment.activate(ids)
                case EndInputs(savepoint_path=path):
                    self.deployment.end_inputs(path)
                case TakeSavepoint(path=path, window_id=window_id):
                    self.deployment.take_savepoint(path, window_id)
                case Commit(window_id=window_id):
                    self.committed_window_id = window_id
                    _LOGGER.debug("container %s: committed window %s", self.container_id,
                                  format_window_id(window_id))
                    self.deployment.committed(window_id)
        return None

    def _deploy_failed(self, info: plan_pb2.OperatorDeployInfo, exc: DeployError) -> None:
        """A deploy failed (in the deploy queue's thread)."""
        _LOGGER.error("container %s: %s%s", self.container_id, exc,
                      " (fatal: it cannot succeed on retry)" if exc.fatal else "")
        if exc.fatal:  # the next heartbeat says so: the master fails the application
            self.deployment.deploy_failed(info, exc)
        else:  # the master restarts the container for another try
            try:
                self.client.report_error(self.container_id, [info.id], str(exc),
                                         info.generation)
            except (grpc.RpcError, MasterUnreachable) as error:
                _LOGGER.warning("container %s: could not report the failed deploy of %d: %s",
                                self.container_id, info.id, error)

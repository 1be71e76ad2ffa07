"""Deploy and undeploy requests, carried out in order in a thread of their own.

A deploy unpickles an operator and restores its checkpoint (from any ``pyarrow.fs``
store), and an undeploy may wait for a stuck operator's thread: seconds, during which the
heartbeat thread used to stay silent, until the master could count the container lost.
Here the heartbeat thread only hands requests over and goes on; an operator queued or
being deployed is reported as setting up (ACTIVE, not ready), so the master neither
resends its deploy request nor takes it for gone.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Sequence

from weir.container.deploy import DeployError, Deployment
from weir.container.durable_folders import redeployed
from weir.proto import plan_pb2, umbilical_pb2

__all__ = ["DeployQueue"]

_LOGGER = logging.getLogger(__name__)


class DeployQueue:
    """One worker thread for ``deployment``'s deploys and undeploys, in arrival order.

    Args:
        deployment: carries them out.
        on_error: told of a deploy that failed (in the worker thread).
        on_done: told after each request (the next heartbeat should go at once).
    """

    def __init__(self, deployment: Deployment,
                 on_error: Callable[[plan_pb2.OperatorDeployInfo, DeployError], None],
                 on_done: Callable[[], None] = lambda: None) -> None:
        self.deployment = deployment
        self._on_error = on_error
        self._on_done = on_done
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[str, object]] = collections.deque()
        self._in_flight: dict[int, plan_pb2.OperatorDeployInfo] = {}  # queued or deploying
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="deploy-queue", daemon=True)
        self._thread.start()

    def submit(self, undeploy: Sequence[int],
               deploy: Sequence[plan_pb2.OperatorDeployInfo]) -> None:
        """Queues a heartbeat answer's undeploys, then its deploys (a deploy request for
        an operator already queued or running in that generation is dropped)."""
        with self._cond:
            if undeploy:
                self._queue.append(("undeploy", list(undeploy)))
            for info in deploy:
                queued = self._in_flight.get(info.id)
                running = self.deployment.runners.get(info.id)
                if (queued is not None and queued.generation >= info.generation) or (
                        running is not None and running.generation >= info.generation):
                    continue
                self._in_flight[info.id] = info
                self._queue.append(("deploy", info))
            self._cond.notify_all()

    def placeholders(self) -> list[umbilical_pb2.OperatorHeartbeat]:
        """Operators queued or being deployed, not yet running: reported as setting up."""
        with self._cond:
            infos = list(self._in_flight.values())
        running = self.deployment.runners
        return [umbilical_pb2.OperatorHeartbeat(
                    node_id=info.id, state=umbilical_pb2.OPERATOR_STATE_ACTIVE, ready=False,
                    generation=info.generation,
                    recovering=redeployed(info.first_generation, info.generation))
                for info in infos if info.id not in running]

    def wait_idle(self, timeout_s: float) -> bool:
        """Waits until every request so far was carried out; True if so."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Drops what is still queued and waits for the request being carried out."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._in_flight.clear()
            self._cond.notify_all()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if self._closed:
                    return
                kind, request = self._queue.popleft()
                self._busy = True
            try:
                if kind == "undeploy":
                    self.deployment.undeploy(request)  # type: ignore[arg-type]
                else:
                    self._deploy(request)  # type: ignore[arg-type]
            except Exception:  # noqa: BLE001 - the worker must outlive one bad request
                _LOGGER.exception("%s request failed", kind)
            finally:
                with self._cond:
                    if kind == "deploy":
                        info = request
                        if self._in_flight.get(info.id) is info:  # type: ignore[attr-defined]
                            del self._in_flight[info.id]  # type: ignore[attr-defined]
                    self._busy = False
                    self._cond.notify_all()
                self._on_done()

    def _deploy(self, info: plan_pb2.OperatorDeployInfo) -> None:
        try:
            self.deployment.deploy(info)
        except DeployError as exc:
            self._on_error(info, exc)

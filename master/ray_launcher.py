"""The Ray launcher: each container a process held by a Ray actor, placed by Ray on a node
of its cluster with the application's resource requests.

Ray never restarts an actor here (``max_restarts=0``): Weir's master decides recovery. A
node lost, or an actor killed, ends the actor's ``wait`` call with an error, which is a
container that ended, told to the master at once. An actor no node has room for yet is
reported by ``waiting``; a request no node of the cluster could ever meet is refused at
submit. The master's secret and certificate reach the actor as its arguments, through
Ray's own channels (run Ray with TLS, ``RAY_USE_TLS``, on a network others share), and the
container through a pipe (``--secret-stdin``): never in its environment, where
``/proc/<pid>/environ`` would show them to any task of the same user on that node.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from weir.master.launcher import (
    LOG_KEPT_BYTES,
    NO_REQUEST,
    Launcher,
    Resources,
    UnplaceableRequest,
    credentials_document,
    master_tag,
    without_credentials,
)

__all__ = ["RayLauncher"]

_LOGGER = logging.getLogger("weir.master.launcher")

_POLL_S = 0.2
_RETRY_S = 1.0
_STOP_TIMEOUT_S = 5.0


class _Held:
    """One container's actor and what is known of it."""

    def __init__(self, actor: Any, resources: Resources) -> None:
        self.actor = actor
        self.resources = resources
        self.started = actor.where.remote()
        self.ended = actor.wait.remote()
        self.exit_code: int | None = None
        self.last_log: tuple[bytes, bool] | None = None


class RayLauncher(Launcher):
    """Runs each container in a Ray actor ``weir-<tag>-<container id>``.

    Args:
        master_address: the master's ``host:port`` the containers call (every Ray node
            must reach it: start the master with ``--host``/``--advertise-host``).
        address: the Ray cluster (``ray start --head`` prints it); default: the one this
            process is connected to, else ``auto``.
        command: the program before ``--master`` on the nodes; default: the node's
            Python with ``-m weir.container`` (Weir must be installed on every node).
    """

    spans_hosts = True

    def __init__(self, master_address: str, *, address: str | None = None,
                 command: Sequence[str] | None = None) -> None:
        import ray  # noqa: PLC0415 - an extra: loaded when it is named

        self._ray = ray
        if not ray.is_initialized():
            ray.init(address=address or "auto", namespace="weir", log_to_driver=False,
                     logging_level=logging.WARNING)
        self.master_address = master_address
        self.command = list(command) if command else None
        self.tag = master_tag({})  # set_credentials: the same after a restart
        self._held: dict[str, _Held] = {}
        self._gone: dict[str, int] = {}  # adopted containers whose actors had ended
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True,
                                         name=f"weir-ray-watch-{self.tag}")
        self._watcher.start()

    def set_credentials(self, env: Mapping[str, str]) -> None:
        super().set_credentials(env)
        self.tag = master_tag(env)  # a restarted master finds its actors by name

    def adopt(self, container_id: str, pid: int, host: str) -> None:
        """Takes charge of the actor an earlier master process (same secret, same tag)
        made; one that is gone is told as ended. Looked up off the caller's thread."""
        def look_up() -> None:
            try:
                actor = self._ray.get_actor(self._name(container_id), namespace="weir")
            except ValueError:  # no such actor: it ended while no master watched
                _LOGGER.warning("container=%s: its Ray actor is gone", container_id)
                self._ended(container_id, None, -9)
                return
            with self._lock:
                self._held.setdefault(container_id, _Held(actor, NO_REQUEST))

        threading.Thread(target=look_up, daemon=True, name=f"weir-ray-adopt-{container_id}"
                         ).start()

    def _name(self, container_id: str) -> str:
        return f"weir-{self.tag}-{container_id}"

    # -- placing ------------------------------------------------------------------------
    def check_request(self, resources: Resources) -> None:
        nodes = [n.get("Resources", {}) for n in self._ray.nodes() if n.get("Alive")]
        memory = resources.memory_mb * 2**20
        if any(n.get("CPU", 0) >= resources.cores and n.get("memory", 0) >= memory
               for n in nodes):
            return
        largest = max(nodes, key=lambda n: (n.get("CPU", 0), n.get("memory", 0)), default={})
        raise UnplaceableRequest(
            f"no node of the Ray cluster has CONTAINER_CORES={resources.cores:g} and "
            f"CONTAINER_MEMORY_MB={resources.memory_mb} (the largest: "
            f"{largest.get('CPU', 0):g} CPUs, {int(largest.get('memory', 0)) >> 20} MB): "
            "ask for less, or add bigger nodes")

    def launch(self, container_id: str, resources: Resources = NO_REQUEST) -> None:
        from weir.master.ray_actor import ContainerProcess  # noqa: PLC0415

        options: dict[str, Any] = {
            "name": self._name(container_id), "lifetime": "detached",
            "max_restarts": 0, "max_task_retries": 0, "max_concurrency": 4,
            "num_cpus": resources.cores}
        if resources.memory_mb:
            options["memory"] = resources.memory_mb * 2**20
        actor = self._ray.remote(ContainerProcess).options(**options).remote(
            self.master_address, container_id, without_credentials(self.credential_env),
            self.command, f"weir-ray-{self.tag}", credentials_document(self.credential_env))
        with self._lock:
            self._held[container_id] = _Held(actor, resources)
        _LOGGER.info("container=%s asked of Ray (%s)", container_id, options)

    def waiting(self, container_id: str) -> str:
        with self._lock:
            held = self._held.get(container_id)
        if held is None or held.exit_code is not None:
            return ""
        ready, _ = self._ray.wait([held.started], timeout=0)
        if ready:
            return ""
        wanted = f"{held.resources.cores:g} CPUs"
        if held.resources.memory_mb:
            wanted += f" and {held.resources.memory_mb} MB"
        return f"Ray has no node with {wanted} free yet (the actor is pending)"

    # -- what the master asks -------------------------------------------------------------
    def exit_code(self, container_id: str) -> int | None:
        with self._lock:
            held = self._held.get(container_id)
            return self._gone.get(container_id) if held is None else held.exit_code

    def kill(self, container_id: str, dump_threads: bool = False) -> None:
        with self._lock:
            held = self._held.get(container_id)
        if held is None:
            return
        if dump_threads:  # the actor signals its container: SIGUSR1 writes the stacks
            with contextlib.suppress(Exception):
                self._ray.get(held.actor.stop.remote(signal.SIGUSR1), timeout=_STOP_TIMEOUT_S)
            time.sleep(0.2)
        self._end(held, signum=signal.SIGKILL)

    def stop_all(self, grace_s: float = 5.0) -> None:
        with self._lock:
            live = [h for h in self._held.values() if h.exit_code is None]
        for held in live:
            held.actor.stop.remote(signal.SIGTERM)  # the container stops cleanly
        self._ray.wait([h.ended for h in live], num_returns=len(live), timeout=grace_s)
        for held in live:
            self._end(held, signum=signal.SIGKILL)
        self._stop.set()
        # no thread of ours may be inside a Ray call when the process next shuts Ray down
        # (a ray.shutdown() under a thread's ray.wait() takes the whole process with it)
        self._watcher.join(timeout=_STOP_TIMEOUT_S)

    def _end(self, held: _Held, signum: int) -> None:
        """Stops the container (its process group) and releases its actor."""
        try:
            self._ray.get(held.actor.stop.remote(signum), timeout=_STOP_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - a dead actor's node took its process with it
            pass
        self._ray.kill(held.actor, no_restart=True)

    def log(self, container_id: str, max_bytes: int) -> tuple[bytes, bool, str]:
        with self._lock:
            held = self._held[container_id]  # KeyError: not launched here
        where = f"Ray actor {self._name(container_id)}"
        if held.last_log is not None:
            data, more = held.last_log
            return data[-max_bytes:], more or len(data) > max_bytes, where
        try:
            data, more = self._ray.get(held.actor.log_tail.remote(max_bytes), timeout=10)
        except Exception as exc:  # noqa: BLE001 - its node is gone
            return f"(its log is gone with its actor: {type(exc).__name__})\n".encode(), \
                False, where
        return data, more, where

    # -- watching ------------------------------------------------------------------------
    def _watch(self) -> None:
        """Waits for any container's ``wait`` to end: its exit code, or the actor's death
        (its node lost, or it was killed) as an exit by SIGKILL."""
        while not self._stop.is_set():
            with self._lock:
                pending = {h.ended: (cid, h) for cid, h in self._held.items()
                           if h.exit_code is None}
            if not pending:
                self._stop.wait(_POLL_S)
                continue
            try:
                ready, _ = self._ray.wait(list(pending), num_returns=1, timeout=_POLL_S)
            except Exception as exc:  # noqa: BLE001 - Ray unreachable: the heartbeat
                # timeouts still find lost containers; the watch goes on when Ray is back
                self._watch_failed("watching Ray actors", exc)
                _LOGGER.warning("watching Ray actors failed (%s: %s); again in %.0f s",
                                type(exc).__name__, exc, _RETRY_S)
                self._stop.wait(_RETRY_S)
                continue
            self._watch_ok()
            for ref in ready:
                container_id, held = pending[ref]
                try:
                    code = int(self._ray.get(ref))
                except Exception as exc:  # noqa: BLE001 - RayActorError: node or actor gone
                    code = -9
                    _LOGGER.warning("container=%s: its Ray actor died (%s)", container_id,
                                    type(exc).__name__)
                self._ended(container_id, held, code)

    def _ended(self, container_id: str, held: _Held | None, code: int) -> None:
        if held is None:  # adopted, but gone: known as ended, with nothing to release
            with self._lock:
                self._gone[container_id] = code
            self._exited(container_id)
            return
        if code != -9:  # the actor lives: keep its log's end, then release it
            try:
                held.last_log = self._ray.get(held.actor.log_tail.remote(LOG_KEPT_BYTES),
                                              timeout=10)
            except Exception:  # noqa: BLE001 - gone meanwhile
                held.last_log = None
            self._ray.kill(held.actor, no_restart=True)
        with self._lock:
            held.exit_code = code
        self._exited(container_id)

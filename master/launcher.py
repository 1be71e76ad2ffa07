"""Container launchers: how the master starts, watches and stops container processes.

A small registry maps names to launcher factories: ``local`` processes by default,
``kubernetes`` pods and ``ray`` actors (their modules, and client libraries, loaded only
when named), ``recording`` (starts nothing: tests, containers started by hand). The
master never imports ``container``: launchers run ``python -m weir.container``, and an
in-thread launcher takes the container's entry point from its caller.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import hmac
import importlib
import json
import logging
import math
import re
import secrets
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from weir.master.tls import TLS_CERT_ENV, TLS_KEY_ENV
from weir.proto.contract import SECRET_ENV, TLS_CA_ENV

__all__ = [
    "CREDENTIAL_ENV",
    "LOG_KEPT_BYTES",
    "NO_REQUEST",
    "Launcher",
    "LauncherFactory",
    "Resources",
    "RecordingLauncher",
    "ThreadLauncher",
    "UnplaceableRequest",
    "launcher_factory",
    "launcher_names",
    "check_memory_fits",
    "credentials_document",
    "master_tag",
    "register_launcher",
    "without_credentials",
]

_LOGGER = logging.getLogger(__name__)

CREDENTIAL_ENV = (SECRET_ENV, TLS_CERT_ENV, TLS_KEY_ENV, TLS_CA_ENV)
"""The variables that carry the master's secret and TLS files to a container: set from
the master's credentials, never inherited from the master's own environment."""


def credentials_document(env: Mapping[str, str]) -> str:
    """The master's credentials as the container reads them from a file or a pipe
    (``--secret-file``, ``--secret-stdin``): JSON with the secret and the certificate the
    master is proven by, read from the master's own file (a container on another node
    cannot read that path)."""
    fields = {"secret": env.get(SECRET_ENV, "")}
    if env.get(TLS_CA_ENV):
        fields["tls_ca_pem"] = Path(env[TLS_CA_ENV]).read_text()
    return json.dumps(fields)


def without_credentials(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the variables that carry credentials (``CREDENTIAL_ENV``)."""
    return {name: value for name, value in env.items() if name not in CREDENTIAL_ENV}


@dataclasses.dataclass(frozen=True)
class Resources:
    """What a container asks its cluster manager for (the application's
    CONTAINER_MEMORY_MB and CONTAINER_CORES); 0 = no request, the manager's default."""

    memory_mb: int = 0
    cores: float = 0.0

    @classmethod
    def of(cls, attributes: Mapping[str, Any]) -> Resources:
        """The request of an application with these resolved DAG attributes."""
        return cls(int(attributes["CONTAINER_MEMORY_MB"]), float(attributes["CONTAINER_CORES"]))


NO_REQUEST = Resources()

LOG_KEPT_BYTES = 1 << 20
"""How much of an ended container's log a cluster launcher keeps for ``weir logs`` once
it released the pod or actor that held the log."""


def master_tag(env: Mapping[str, str]) -> str:
    """A short name for one master's containers in a cluster manager (pod labels, actor
    names), the same after a restart: an HMAC of its secret, which a master restarted on
    its state folder keeps, and which the tag does not reveal. Random without a secret."""
    secret = env.get(SECRET_ENV, "")
    if not secret:
        return secrets.token_hex(4)
    return hmac.new(secret.encode(), b"weir cluster tag v1", hashlib.sha256).hexdigest()[:8]


class UnplaceableRequest(ValueError):
    """No node of the launcher's manager could ever run a container asking for this."""


_JVM_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)b?\s*$", re.IGNORECASE)
_MB_PER_UNIT = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024, "": 1}


def check_memory_fits(attributes: Mapping[str, Any], uses_spark: bool) -> None:
    """Raises UnplaceableRequest when a container's ``CONTAINER_MEMORY_MB`` cannot hold
    what it is asked to: ``BUFFER_MEMORY_MB`` is at most half of it (the rest is the
    operators' and their queues'), and with Spark it holds the driver, the heap
    (``SPARK_DRIVER_MEMORY``) and the JVM's own memory beside it, which Spark counts as
    max(384 MB, 10 % of the heap) (``memoryOverhead``), with the buffer server beside
    them. Such a container would be killed at its first large job or full buffer, by its
    launcher or the kernel."""
    memory_mb = int(attributes.get("CONTAINER_MEMORY_MB", 0) or 0)
    if not memory_mb:
        return  # no request, no limit
    buffer_mb = int(attributes.get("BUFFER_MEMORY_MB", 0) or 0)
    if buffer_mb * 2 > memory_mb:
        raise UnplaceableRequest(
            f"BUFFER_MEMORY_MB={buffer_mb} is more than half of CONTAINER_MEMORY_MB="
            f"{memory_mb}: the rest of the container (its operators, their queues) would "
            "have no room; give the buffer server less, or the container more")
    found = _JVM_SIZE.match(str(attributes.get("SPARK_DRIVER_MEMORY", "")))
    if not uses_spark or found is None:
        return  # no Spark, or a size Spark itself will refuse with its own words
    heap_mb = int(found.group(1)) * _MB_PER_UNIT[found.group(2).lower()]
    needed_mb = math.ceil(heap_mb + max(384, heap_mb / 10))
    if memory_mb < needed_mb:
        raise UnplaceableRequest(
            f"CONTAINER_MEMORY_MB={memory_mb} is less than Spark's driver needs "
            f"(SPARK_DRIVER_MEMORY={attributes['SPARK_DRIVER_MEMORY']}: {needed_mb:,} MB with "
            "the JVM's own memory): ask for more memory, or give Spark a smaller heap")
    if memory_mb < needed_mb + buffer_mb:
        raise UnplaceableRequest(
            f"CONTAINER_MEMORY_MB={memory_mb} cannot hold Spark's driver ({needed_mb:,} MB) "
            f"and the buffer server's BUFFER_MEMORY_MB={buffer_mb}: ask for more memory, or "
            "give the buffer server less")


class Launcher(abc.ABC):
    """Starts container processes for one master and tracks them until ``stop_all``.

    ``launch`` must not wait for the container to call the master: the master may hold
    its lock while launching.
    """

    credential_env: Mapping[str, str] = {}
    """What a container needs in its environment to call the master (its secret, TLS)."""

    on_exit: Callable[[str], None] | None = None
    """Told the container's id, from a launcher thread, as soon as a container it started
    has ended (``exit_code`` then gives its code), so that the master recovers it at once
    instead of at its next liveness pass; None: nobody listens, the passes find it."""

    def set_credentials(self, env: Mapping[str, str]) -> None:
        """Called by the master before any launch: hand ``env`` to every container."""
        self.credential_env = dict(env)

    @abc.abstractmethod
    def launch(self, container_id: str, resources: Resources = NO_REQUEST) -> None:
        """Starts the container; raises OSError (or RuntimeError) if it cannot.

        A request no node of the manager can ever meet raises UnplaceableRequest; one
        that has to wait for room is launched and reported by ``waiting`` until placed.
        """

    def check_request(self, resources: Resources) -> None:
        """Raises UnplaceableRequest, saying why and what to do, if no node could ever run
        a container asking for ``resources`` (the master asks at submit)."""
        return None

    spans_hosts: bool = False
    """Its containers may run on other machines than the master and each other (a
    cluster manager's nodes): their state must be where every node reaches it
    (``master.state_location``)."""

    def check_spark(self) -> None:
        """Raises UnplaceableRequest if this launcher's containers could not start Spark
        (no Java where they run), asked at submit for a DAG with Spark operators. Only a
        launcher that runs them here can know; a pod or a Ray node is asked by its
        container (``runtime.spark.java``)."""
        return None

    def log(self, container_id: str, max_bytes: int) -> tuple[bytes, bool, str] | None:
        """The last ``max_bytes`` of the container's output as its manager keeps it: (the
        bytes, whether earlier output was left out, where it is); None if this launcher
        keeps none (the master's log folder may: ``container_logs``).

        Raises:
            KeyError: the container is not one of this launcher's.
        """
        return None

    def waiting(self, container_id: str) -> str:
        """Why the container, launched, is not running yet (the manager's reason: no node
        has room, its image is being pulled); "" once it runs, or if the launcher cannot
        tell. The master shows it and does not count the wait as a silent container."""
        return ""

    @abc.abstractmethod
    def exit_code(self, container_id: str) -> int | None:
        """The container's exit code once it ended; None while it runs or if unknown."""

    def exit_reason(self, container_id: str) -> str:
        """Why the ended container ended, where its manager says more than its exit code
        (killed over its memory limit, evicted); "" otherwise. Shown in its diagnostics."""
        return ""

    @abc.abstractmethod
    def kill(self, container_id: str, dump_threads: bool = False) -> None:
        """Kills the container (and everything it started) now; no-op if unknown or gone.

        ``dump_threads``: first ask it for its threads' stacks, written to its log (the
        master gave up on a live process that does not answer), where the launcher can.
        """

    @abc.abstractmethod
    def stop_all(self, grace_s: float = 5.0) -> None:
        """Asks every container to stop, waits up to ``grace_s``, then kills what is left."""

    def adopt(self, container_id: str, pid: int, host: str) -> None:
        """Takes charge of a container an earlier master process launched (after a restart);
        a launcher that cannot reach it leaves it to the heartbeat timeout."""
        return None

    _trouble = ""
    _trouble_since = 0.0

    def trouble(self) -> str:
        """What keeps the launcher from following its containers now (its watch of the
        cluster manager failing), since when; "" while it follows them. The master shows
        it in each live container's diagnostics: an exit may go unseen meanwhile (the
        heartbeat timeout still finds a lost container)."""
        return self._trouble

    def _watch_failed(self, what: str, exc: BaseException) -> None:
        """Records that the watch (``what``) failed with ``exc`` (see ``trouble``)."""
        if not self._trouble:
            self._trouble_since = time.time()
        since = time.strftime("%H:%M:%S", time.localtime(self._trouble_since))
        detail = " ".join(str(exc).split())[:300]
        self._trouble = f"{what} fails since {since}: {type(exc).__name__}: {detail}"

    def _watch_ok(self) -> None:
        self._trouble = ""

    def _exited(self, container_id: str) -> None:
        """Tells ``on_exit`` that the container ended; a listener that raises is logged, it
        must not end the thread that watches (the liveness passes still find the exit)."""
        listener = self.on_exit
        if listener is None:
            return
        try:
            listener(container_id)
        except Exception:  # noqa: BLE001 - a listener's bug must not stop the watch
            _LOGGER.exception("container=%s: telling the master of its exit failed",
                              container_id)


LauncherFactory = Callable[[str], Launcher]
"""Builds a launcher for the master listening at the given ``host:port``."""

_REGISTRY: dict[str, Callable[..., Launcher]] = {}


def register_launcher(name: str, factory: Callable[..., Launcher]) -> None:
    """Makes ``factory(master_address, **options)`` available as launcher ``name``."""
    _REGISTRY[name] = factory


def launcher_names() -> list[str]:
    return sorted(_REGISTRY)


def launcher_factory(name: str, **options: Any) -> LauncherFactory:
    """A factory for the registered launcher ``name`` with ``options``.

    Raises:
        ValueError: no launcher has that name.
    """
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown launcher {name!r}; known launchers: {launcher_names()}")
    return lambda address: factory(address, **options)


class RecordingLauncher(Launcher):
    """Starts nothing and records what it was asked: for tests, or containers run by hand.

    ``set_exit_code`` plays a container process that exited.
    """

    def __init__(self, master_address: str = "") -> None:
        self.master_address = master_address
        self.launched: list[str] = []
        self.requests: dict[str, Resources] = {}
        self.killed: list[str] = []
        self.dumped: list[str] = []  # killed with a thread dump asked first
        self.stopped = False
        self.fail_launch: set[str] = set()
        self._exit_codes: dict[str, int] = {}
        self._lock = threading.Lock()

    def launch(self, container_id: str, resources: Resources = NO_REQUEST) -> None:
        if container_id in self.fail_launch:
            raise OSError(f"cannot launch {container_id} (as asked by the test)")
        with self._lock:
            self.launched.append(container_id)
            self.requests[container_id] = resources

    def set_exit_code(self, container_id: str, code: int) -> None:
        with self._lock:
            self._exit_codes[container_id] = code
        self._exited(container_id)

    def exit_code(self, container_id: str) -> int | None:
        with self._lock:
            return self._exit_codes.get(container_id)

    def kill(self, container_id: str, dump_threads: bool = False) -> None:
        with self._lock:
            self.killed.append(container_id)
            self.dumped += [container_id] if dump_threads else []
            self._exit_codes.setdefault(container_id, -signal.SIGKILL)

    def stop_all(self, grace_s: float = 5.0) -> None:
        self.stopped = True


ContainerTarget = Callable[[str, str, threading.Event], int]
"""A container's entry point for ``ThreadLauncher``: (master address, id, stop) -> exit code."""


class ThreadLauncher(Launcher):
    """Runs each container as a thread of this process, calling ``target``.

    The caller supplies the entry point (for example a test that imports ``container``);
    ``kill`` and ``stop_all`` set the container's stop event and wait for its thread.
    """

    def __init__(self, master_address: str, target: ContainerTarget) -> None:
        self.master_address = master_address
        self.target = target
        self._threads: dict[str, tuple[threading.Thread, threading.Event]] = {}
        self._exit_codes: dict[str, int] = {}
        self._lock = threading.Lock()

    def launch(self, container_id: str, resources: Resources = NO_REQUEST) -> None:
        stop = threading.Event()  # a thread of this process: requests are not enforced

        def run() -> None:
            code = 1
            try:
                code = self.target(self.master_address, container_id, stop)
            except Exception:  # noqa: BLE001 - a crashing container is an exit code
                _LOGGER.exception("container=%s thread crashed", container_id)
            with self._lock:
                self._exit_codes[container_id] = code
            self._exited(container_id)

        thread = threading.Thread(target=run, name=f"weir-{container_id}", daemon=True)
        with self._lock:
            self._threads[container_id] = (thread, stop)
        thread.start()

    def exit_code(self, container_id: str) -> int | None:
        with self._lock:
            return self._exit_codes.get(container_id)

    def kill(self, container_id: str, dump_threads: bool = False) -> None:
        self._stop([container_id], grace_s=5.0)  # a thread: its stack is this process's

    def stop_all(self, grace_s: float = 5.0) -> None:
        with self._lock:
            ids = list(self._threads)
        self._stop(ids, grace_s)

    def _stop(self, ids: list[str], grace_s: float) -> None:
        with self._lock:
            entries = [self._threads[i] for i in ids if i in self._threads]
        for _, stop in entries:
            stop.set()
        deadline = time.monotonic() + grace_s
        for thread, _ in entries:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                _LOGGER.error("container thread %s did not stop within %.1f s", thread.name,
                              grace_s)


def _named(module: str, name: str, extra: str = "") -> Callable[..., Launcher]:
    """A factory that imports the launcher's module when the launcher is named: a cluster
    manager's client library is needed only by a master that uses it."""
    def make(master_address: str, **options: Any) -> Launcher:
        try:
            return getattr(importlib.import_module(module), name)(master_address, **options)
        except ModuleNotFoundError as exc:
            if not extra or exc.name != extra:
                raise
            raise ValueError(f"this launcher needs the {extra} package: pip install "
                             f"'weir-streams[{extra}]'") from None
    return make


register_launcher("local", _named("weir.master.local_launcher", "LocalProcessLauncher"))
register_launcher("kubernetes", _named("weir.master.kubernetes_launcher", "KubernetesLauncher",
                                       "kubernetes"))
register_launcher("ray", _named("weir.master.ray_launcher", "RayLauncher", "ray"))
register_launcher("recording", RecordingLauncher)

"""Container launchers: how the master starts, watches and stops container processes.

A small registry maps names to launcher factories (``local`` processes by default;
``recording`` starts nothing, for tests and for containers started by hand). The master
never imports ``container``: the local launcher runs ``python -m weir.container`` and an
in-thread launcher takes the container's entry point from its caller.
"""

from __future__ import annotations

import abc
import dataclasses
import errno
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from weir.master.container_processes import (
    CANNOT_INSPECT,
    AdoptedProcess,
    GoneProcess,
    is_container_process,
)
from weir.master.tls import TLS_CERT_ENV, TLS_KEY_ENV
from weir.proto.contract import CONTAINER_ID_ENV, SECRET_ENV, TLS_CA_ENV
from weir.storage.private_files import UntrustedPath, make_private_dir

__all__ = [
    "CREDENTIAL_ENV",
    "Launcher",
    "LauncherFactory",
    "LocalProcessLauncher",
    "RecordingLauncher",
    "ThreadLauncher",
    "launcher_factory",
    "launcher_names",
    "register_launcher",
]

_LOGGER = logging.getLogger(__name__)

CREDENTIAL_ENV = (SECRET_ENV, TLS_CERT_ENV, TLS_KEY_ENV, TLS_CA_ENV)
"""The variables that carry the master's secret and TLS files to a container: set from
the master's credentials, never inherited from the master's own environment."""


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
    def launch(self, container_id: str) -> None:
        """Starts the container; raises OSError (or RuntimeError) if it cannot."""

    @abc.abstractmethod
    def exit_code(self, container_id: str) -> int | None:
        """The container's exit code once it ended; None while it runs or if unknown."""

    @abc.abstractmethod
    def kill(self, container_id: str) -> None:
        """Kills the container (and everything it started) now; no-op if unknown or gone."""

    @abc.abstractmethod
    def stop_all(self, grace_s: float = 5.0) -> None:
        """Asks every container to stop, waits up to ``grace_s``, then kills what is left."""

    def adopt(self, container_id: str, pid: int, host: str) -> None:
        """Takes charge of a container an earlier master process launched (after a restart);
        a launcher that cannot reach it leaves it to the heartbeat timeout."""
        return None

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


_LOG_FOLDER = "the container log folder (--log-dir)"
_LOG_ADVICE = "remove it, or give --log-dir a folder of your own"
_LOG_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK
              | getattr(os, "O_NOFOLLOW", 0))


def _open_log(log_dir: Path, container_id: str) -> IO[bytes]:
    """``<log_dir>/<container id>.log`` for appending, owner-only.

    A container's log holds its errors, paths and data it printed, so the folder is made
    (or checked) owner-only, and the file is never reached through a link (``O_NOFOLLOW``:
    a link planted at its name would send the log wherever it points), a FIFO does not
    block the master, and what is there must be a regular file of this user.

    Raises:
        OSError: the folder or the file fails those checks (``UntrustedPath``, or ELOOP
            for a link).
    """
    make_private_dir(str(log_dir), _LOG_FOLDER, advice=_LOG_ADVICE)  # it may be gone since
    path = log_dir / f"{container_id}.log"
    fd = os.open(path, _LOG_FLAGS, 0o600)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise UntrustedPath(errno.EPERM, f"the container log {path} is not a regular "
                                f"file of this user; {_LOG_ADVICE}")
        os.fchmod(fd, 0o600)  # a file left by an earlier run keeps no wider mode
        os.set_blocking(fd, True)
        return os.fdopen(fd, "ab")
    except BaseException:
        os.close(fd)
        raise


@dataclasses.dataclass
class _Child:
    popen: subprocess.Popen[bytes] | AdoptedProcess | GoneProcess
    log_file: IO[bytes] | None
    swept: bool = False


def _signal_group(pgid: int, signum: int) -> None:
    """Signals a container's process group; never ours, init's, or "every process"."""
    if pgid <= 1 or pgid == os.getpgrp():
        _LOGGER.error("refusing to signal process group %d: not a container's", pgid)
        return
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


_CAN_WATCH = hasattr(os, "waitid") and hasattr(os, "WNOWAIT")
"""Whether a thread can wait for a child's exit without reaping it (not on Windows)."""


class LocalProcessLauncher(Launcher):
    """Runs each container as ``python -m weir.container --master ADDR --id ID`` on this machine.

    Each container gets its own process group (``start_new_session``), so killing the
    group also kills what it started (Spark's JVM). The working directory and the
    environment are inherited; ``WEIR_CONTAINER_ID`` and the master's credentials
    (``set_credentials``: its secret, TLS files) are added, in the environment rather than
    on the command line, which every local user can read with ``ps``.

    Args:
        master_address: the master's ``host:port`` the containers call.
        log_dir: if set, each container's stdout and stderr go to ``<log_dir>/<id>.log``
            (owner-only; the folder is made or checked owner-only at once, see
            ``_open_log``); otherwise they are inherited.
        command: the program before ``--master``; ``python -m weir.container`` by default.
        env: extra environment variables for the containers.
    """

    def __init__(self, master_address: str, log_dir: str | Path | None = None, *,
                 command: Sequence[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.master_address = master_address
        self.log_dir = Path(log_dir) if log_dir else None
        if self.log_dir is not None:  # a folder another user could write is refused now
            make_private_dir(str(self.log_dir), _LOG_FOLDER, advice=_LOG_ADVICE)
        self.command = list(command) if command else [sys.executable, "-m", "weir.container"]
        self.env = dict(env or {})
        self._children: dict[str, _Child] = {}
        self._lock = threading.Lock()

    def argv(self, container_id: str) -> list[str]:
        """The command line of container ``container_id``."""
        return [*self.command, "--master", self.master_address, "--id", container_id]

    def launch(self, container_id: str) -> None:
        env = {name: value for name, value in os.environ.items()
               if name not in CREDENTIAL_ENV}
        env.update({**self.env, **self.credential_env, CONTAINER_ID_ENV: container_id})
        log_file: IO[bytes] | None = None
        if self.log_dir is not None:
            log_file = _open_log(self.log_dir, container_id)
            env.setdefault("PYTHONUNBUFFERED", "1")
        try:
            popen = subprocess.Popen(self.argv(container_id), env=env, stdin=subprocess.DEVNULL,
                                     stdout=log_file, stderr=log_file, start_new_session=True)
        except OSError:
            if log_file is not None:
                log_file.close()
            raise
        with self._lock:
            self._children[container_id] = _Child(popen, log_file)
        _LOGGER.info("container=%s launched: pid %d%s", container_id, popen.pid,
                     f", log {self.log_dir / (container_id + '.log')}" if self.log_dir else "")
        if _CAN_WATCH:
            threading.Thread(target=self._watch, args=(container_id, popen.pid),
                             name=f"weir-watch-{container_id}", daemon=True).start()

    def _watch(self, container_id: str, pid: int) -> None:
        """Waits for the container process to end and tells ``on_exit`` at once.

        ``WNOWAIT`` leaves the process a zombie for ``Popen`` to reap (``exit_code``), so
        its exit code and pid stay Popen's; the master's liveness pass, which used to find
        the exit only at its next poll (up to its period later, 200 ms), runs now.
        """
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass  # already reaped (a poll or a kill got there first): it ended all the same
        self._exited(container_id)

    def adopt(self, container_id: str, pid: int, host: str) -> None:
        """Watches (and may later kill) a running container an earlier master launched, if
        ``pid`` is proven to be it (``is_container_process``); otherwise leaves it alone."""
        if host and host != socket.gethostname():
            return
        refusal = is_container_process(pid, container_id)
        if refusal is not None and not refusal.endswith(CANNOT_INSPECT):
            # proven gone: no process has that pid, or another one has it now (a pid is
            # reused only once its process ended): lost at once, never signalled
            with self._lock:
                self._children.setdefault(container_id, _Child(GoneProcess(pid), None, swept=True))
            _LOGGER.warning("container=%s is gone: %s", container_id, refusal)
            return
        if refusal is not None:
            _LOGGER.warning("container=%s not adopted: %s; it is never signalled",
                            container_id, refusal)
            return
        with self._lock:
            if container_id not in self._children:
                self._children[container_id] = _Child(AdoptedProcess(pid), None)
        _LOGGER.info("container=%s adopted: pid %d, launched by an earlier master",
                     container_id, pid)

    def pid(self, container_id: str) -> int | None:
        child = self._children.get(container_id)
        return child.popen.pid if child else None

    def exit_code(self, container_id: str) -> int | None:
        with self._lock:
            child = self._children.get(container_id)
            if child is None:
                return None
            code = child.popen.poll()
            if code is not None and not child.swept:
                # The container is gone; make sure nothing it started outlives it.
                child.swept = True
                _signal_group(child.popen.pid, signal.SIGKILL)
                self._close(child)
            return code

    def kill(self, container_id: str) -> None:
        with self._lock:
            child = self._children.get(container_id)
        if child is None:
            return
        _LOGGER.info("container=%s killing process group %d", container_id, child.popen.pid)
        self._kill_group(container_id, child)

    def stop_all(self, grace_s: float = 5.0) -> None:
        with self._lock:
            children = dict(self._children)
        for child in children.values():
            if child.popen.poll() is None:
                # The container alone: it stops its Spark session cleanly, then exits;
                # the group (its JVM included) is killed below if anything lingers.
                child.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(c.popen.poll() is None
                                                  for c in children.values()):
            time.sleep(0.05)
        for cid, child in children.items():
            if child.popen.poll() is None:
                _LOGGER.warning("container=%s did not stop within %.1f s; killing it", cid,
                                grace_s)
            self._kill_group(cid, child)  # also what it started

    def _kill_group(self, container_id: str, child: _Child) -> None:
        """SIGKILLs the container's process group (unless that was done: ``swept``), reaps
        it and closes its log."""
        if not child.swept:
            _signal_group(child.popen.pid, signal.SIGKILL)
        child.swept = True
        try:
            child.popen.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            _LOGGER.error("container=%s pid %d survived SIGKILL for 5 s", container_id,
                          child.popen.pid)
        self._close(child)

    @staticmethod
    def _close(child: _Child) -> None:
        if child.log_file is not None and not child.log_file.closed:
            child.log_file.close()


class RecordingLauncher(Launcher):
    """Starts nothing and records what it was asked: for tests, or containers run by hand.

    ``set_exit_code`` plays a container process that exited.
    """

    def __init__(self, master_address: str = "") -> None:
        self.master_address = master_address
        self.launched: list[str] = []
        self.killed: list[str] = []
        self.stopped = False
        self.fail_launch: set[str] = set()
        self._exit_codes: dict[str, int] = {}
        self._lock = threading.Lock()

    def launch(self, container_id: str) -> None:
        if container_id in self.fail_launch:
            raise OSError(f"cannot launch {container_id} (as asked by the test)")
        with self._lock:
            self.launched.append(container_id)

    def set_exit_code(self, container_id: str, code: int) -> None:
        with self._lock:
            self._exit_codes[container_id] = code
        self._exited(container_id)

    def exit_code(self, container_id: str) -> int | None:
        with self._lock:
            return self._exit_codes.get(container_id)

    def kill(self, container_id: str) -> None:
        with self._lock:
            self.killed.append(container_id)
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

    def launch(self, container_id: str) -> None:
        stop = threading.Event()

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

    def kill(self, container_id: str) -> None:
        self._stop([container_id], grace_s=5.0)

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


register_launcher("local", LocalProcessLauncher)
register_launcher("recording", RecordingLauncher)

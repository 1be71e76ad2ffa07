"""The local launcher: each container a process of this machine, in its own process
group, its log a private file, held to its request (``local_limits``); killed (after a
thread dump) when the master gives up on it."""

from __future__ import annotations

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
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import psutil

from weir.master.container_processes import (
    CANNOT_INSPECT,
    AdoptedProcess,
    GoneProcess,
    is_container_process,
)
from weir.master.launcher import (
    CREDENTIAL_ENV,
    NO_REQUEST,
    Launcher,
    Resources,
    UnplaceableRequest,
)
from weir.master.local_limits import CoreSets, MemoryGuard
from weir.proto.contract import CONTAINER_ID_ENV
from weir.runtime.spark.java import java_problem
from weir.storage.private_files import UntrustedPath, make_private_dir

__all__ = ["LocalProcessLauncher"]

_LOGGER = logging.getLogger("weir.master.launcher")


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


def _has_ended(pid: int) -> bool:
    """Whether our child ``pid`` has exited (a zombie, or reaped already), without reaping;
    False where that cannot be asked (no ``waitid``: ``poll`` alone answers there)."""
    if not _CAN_WATCH:
        return False
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _reaped_code(popen: subprocess.Popen[bytes]) -> int | None:
    """The exit code of a child that has ended. ``poll`` says None while another thread
    (a kill, reaping it) holds ``Popen``'s wait lock, so a container lost to the memory
    guard could read as still running to whoever ``on_exit`` told; wait for that thread."""
    try:
        return popen.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        return None


def _signal_group(pgid: int, signum: int) -> None:
    """Signals a container's process group; never ours, init's, or "every process"."""
    if pgid <= 1 or pgid == os.getpgrp():
        _LOGGER.error("refusing to signal process group %d: not a container's", pgid)
        return
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


_DUMP_WAIT_S = 0.2
"""How long a container is given to write its thread dump before it is killed."""

_CAN_WATCH = hasattr(os, "waitid") and hasattr(os, "WNOWAIT")
"""Whether a thread can wait for a child's exit without reaping it (not on Windows)."""

_CAN_PIN = hasattr(os, "sched_setaffinity")
"""Whether a process can be pinned to cores (Linux)."""


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

    The application's request is held to (``local_limits``): a container whose processes
    use more than ``CONTAINER_MEMORY_MB`` is killed, its diagnostics saying so
    (``exit_reason``), and ``CONTAINER_CORES`` pins it to that many cores, rounded up.
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
        self._reasons: dict[str, str] = {}
        self._memory = MemoryGuard(self._over_memory)
        self._cores = CoreSets() if _CAN_PIN else None

    def argv(self, container_id: str) -> list[str]:
        """The command line of container ``container_id``."""
        return [*self.command, "--master", self.master_address, "--id", container_id]

    def check_spark(self) -> None:
        """The containers run here, with this process's environment and the launcher's:
        the Java their Spark would start must be here (``runtime.spark.java``)."""
        problem = java_problem({**os.environ, **self.env})
        if problem is not None:
            raise UnplaceableRequest(problem)

    def check_request(self, resources: Resources) -> None:
        """Every container runs on this machine: a request larger than it is refused, and
        so are cores where this system cannot pin a process to them."""
        memory_mb = psutil.virtual_memory().total >> 20
        if resources.memory_mb > memory_mb:
            raise UnplaceableRequest(f"CONTAINER_MEMORY_MB={resources.memory_mb} is more than this "
                             f"machine's memory ({memory_mb:,} MB), and the local launcher "
                             "runs every container here: ask for less, or run the master "
                             "with a launcher that has bigger nodes (--launcher kubernetes)")
        cores = os.cpu_count() or 1
        if resources.cores > cores:
            raise UnplaceableRequest(f"CONTAINER_CORES={resources.cores:g} is more than this "
                             f"machine's {cores} cores, and the local launcher runs every "
                             "container here: ask for fewer, or run the master with a "
                             "launcher that has bigger nodes (--launcher kubernetes)")
        if resources.cores and self._cores is None:
            raise UnplaceableRequest("CONTAINER_CORES is set, and the local launcher cannot pin "
                                     "a process to cores on this system: leave it at 0 here")

    def launch(self, container_id: str, resources: Resources = NO_REQUEST) -> None:
        self.check_request(resources)
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
            self._reasons.pop(container_id, None)
        self._hold_to(container_id, popen.pid, resources)
        _LOGGER.info("container=%s launched: pid %d%s", container_id, popen.pid,
                     f", log {self.log_dir / (container_id + '.log')}" if self.log_dir else "")
        if _CAN_WATCH:
            threading.Thread(target=self._watch, args=(container_id, popen.pid),
                             name=f"weir-watch-{container_id}", daemon=True).start()

    def _hold_to(self, container_id: str, pid: int, resources: Resources) -> None:
        """Pins the new container to its cores and watches its memory; a pin that fails
        kills it and fails the launch (a request is met, or refused)."""
        if resources.cores and self._cores is not None:
            cores = self._cores.take(resources.cores)
            try:  # before it starts a thread or a JVM: they inherit the set
                os.sched_setaffinity(pid, cores)
            except OSError as exc:
                self.kill(container_id)
                raise OSError(exc.errno, f"could not pin container {container_id} to cores "
                              f"{sorted(cores)} (CONTAINER_CORES={resources.cores:g}): "
                              f"{exc.strerror}") from None
        if resources.memory_mb:
            self._memory.watch(container_id, pid, resources.memory_mb)

    def _over_memory(self, container_id: str, reason: str) -> None:
        _LOGGER.warning("container=%s %s", container_id, reason)
        with self._lock:
            self._reasons[container_id] = reason
        self.kill(container_id)

    def exit_reason(self, container_id: str) -> str:
        with self._lock:
            return self._reasons.get(container_id, "")

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
        self._memory.forget(container_id)
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
            if code is None and isinstance(child.popen, subprocess.Popen) \
                    and _has_ended(child.popen.pid):
                code = _reaped_code(child.popen)
            if code is not None and not child.swept:
                # The container is gone; make sure nothing it started outlives it.
                child.swept = True
                _signal_group(child.popen.pid, signal.SIGKILL)
                self._close(child)
            return code

    def kill(self, container_id: str, dump_threads: bool = False) -> None:
        with self._lock:
            child = self._children.get(container_id)
        if child is None:
            return
        if dump_threads:
            self._dump_threads(container_id, child)
        _LOGGER.info("container=%s killing process group %d", container_id, child.popen.pid)
        self._kill_group(container_id, child)

    @staticmethod
    def _dump_threads(container_id: str, child: _Child) -> None:
        """Asks a live container for its threads' stacks (``SIGUSR1``, written to its log)
        before the kill: a container the master gave up on (blocked, silent) says in its
        log where it stood, as ``kill -USR1`` would have."""
        if child.swept or not isinstance(child.popen, subprocess.Popen):
            return  # gone, or adopted (an earlier master's child: its log is not ours)
        if child.popen.poll() is not None:
            return
        try:
            child.popen.send_signal(signal.SIGUSR1)
        except ProcessLookupError:
            return
        time.sleep(_DUMP_WAIT_S)  # faulthandler writes from the signal handler at once

    def stop_all(self, grace_s: float = 5.0) -> None:
        self._memory.stop()
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

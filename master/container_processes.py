"""Container processes the master did not start itself (an earlier master did): proven to
be a container's before anything is done to them, watched by pid, or known to be gone.
A pid is never signalled unless it is proven to be the container's (``is_container_process``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess

import psutil

from weir.proto.contract import CONTAINER_ID_ENV

__all__ = ["CANNOT_INSPECT", "AdoptedProcess", "GoneProcess", "is_container_process",
           "is_named_process"]

CANNOT_INSPECT = "cannot be inspected"
"""How ``is_container_process`` ends the one reason that does not prove a process gone."""


class AdoptedProcess:
    """A container process an earlier master launched: not our child, so watched by pid."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        try:
            self._process: psutil.Process | None = psutil.Process(pid)
        except psutil.NoSuchProcess:
            self._process = None

    def poll(self) -> int | None:
        if self.returncode is None and (
                self._process is None or not self._process.is_running()
                or self._process.status() == psutil.STATUS_ZOMBIE):
            self.returncode = -1  # gone; its exit code went to the earlier master
        return self.returncode

    def send_signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)

    def wait(self, timeout: float | None = None) -> int:
        if self._process is not None:
            try:
                self._process.wait(timeout)
            except psutil.TimeoutExpired:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0) from None
            except psutil.NoSuchProcess:
                pass
        self.returncode = -1
        return -1


class GoneProcess:
    """A container process proven gone when an earlier master's container was taken back:
    it exited (code -1: its code went to that master); its pid is never signalled."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode = -1

    def poll(self) -> int:
        return -1

    def send_signal(self, signum: int) -> None:
        """Nothing: the pid may be another process's now."""

    def wait(self, timeout: float | None = None) -> int:
        return -1


def is_container_process(pid: int, container_id: str) -> str | None:
    """Why ``pid`` cannot be proven to be container ``container_id``'s process, or None.

    The proof: it is a process of this user, leader of its own process group (the
    launcher starts each container in a new session), other than this process and its
    group, whose environment names that container (``WEIR_CONTAINER_ID``, set at launch;
    only its owner can read it). A pid that was reused, or invented by a heartbeat, fails.
    """
    return is_named_process(pid, container_id, CONTAINER_ID_ENV, "container")


def is_named_process(pid: int, name: str, env_name: str, what: str) -> str | None:
    """Why ``pid`` cannot be proven to be ``what`` ``name``'s process (its environment's
    ``env_name`` set to ``name`` at launch, the proof ``is_container_process`` gives), or
    None."""
    if pid <= 1:
        return f"pid {pid} is not a process a {what} could have"
    try:
        process = psutil.Process(pid)
        if process.uids().real != os.getuid():
            return f"process {pid} belongs to another user"
        if pid == os.getpid() or os.getpgid(pid) == os.getpgrp():
            return f"process {pid} is the master's own"
        if os.getpgid(pid) != pid:
            return f"process {pid} leads no process group of its own"
        named = process.environ().get(env_name)
    except (psutil.NoSuchProcess, ProcessLookupError):
        return f"process {pid} does not exist"
    except (psutil.AccessDenied, PermissionError):
        return f"process {pid} {CANNOT_INSPECT}"
    if named != name:
        return f"process {pid} is not {what} {name} (its {env_name} is {named!r})"
    return None

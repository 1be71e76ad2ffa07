"""What the local launcher makes of a container's request, so that it takes effect here
too: ``CONTAINER_MEMORY_MB`` is a limit on the memory of the container's processes
(Spark's JVM included), checked every second as YARN's NodeManager checks its containers,
and a container over it is killed with the reason kept for its diagnostics;
``CONTAINER_CORES`` pins the container to that many of this machine's cores (rounded up),
given out in turn so that containers spread over the cores."""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable

import psutil

__all__ = ["CoreSets", "MemoryGuard", "tree_memory_bytes"]

_LOGGER = logging.getLogger("weir.master.launcher")

MEMORY_POLL_S = 1.0
"""How often the container's memory is measured (YARN's default is every 3 s)."""


def _own_bytes(process: psutil.Process) -> int:
    info = process.memory_info()
    return info.rss - getattr(info, "shared", 0)


def tree_memory_bytes(pid: int) -> int:
    """The memory process ``pid`` and all its descendants hold: resident pages not backed
    by a file (RSS less its shared pages), which the kernel cannot drop under pressure.
    Mapped files (libraries, spill files the buffer server serves from a memory map) are
    left out: counting them, as plain RSS does, would kill a container for its cache.

    Raises:
        psutil.NoSuchProcess: ``pid`` is gone.
    """
    root = psutil.Process(pid)
    total = _own_bytes(root)
    for child in root.children(recursive=True):
        try:
            total += _own_bytes(child)
        except psutil.Error:
            continue  # ended meanwhile
    return total


class MemoryGuard:
    """Measures each watched container's process tree every ``poll_s`` and calls
    ``over_limit(container_id, reason)`` once for one above its limit (then forgets it).

    The thread starts with the first ``watch`` and ends at ``stop``. An error measuring
    or killing one container (other than its end) is logged and the others are still
    measured; the thread itself never ends on an error, so no limit silently lapses.
    """

    def __init__(self, over_limit: Callable[[str, str], None],
                 poll_s: float = MEMORY_POLL_S) -> None:
        self._over_limit = over_limit
        self._poll_s = poll_s
        self._watched: dict[str, tuple[int, int]] = {}  # container id -> (pid, limit MB)
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, container_id: str, pid: int, limit_mb: int) -> None:
        with self._lock:
            self._watched[container_id] = (pid, limit_mb)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="weir-memory-guard",
                                                daemon=True)
                self._thread.start()

    def forget(self, container_id: str) -> None:
        with self._lock:
            self._watched.pop(container_id, None)

    def stop(self) -> None:
        self._stopped.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def check(self) -> None:
        """One pass over the watched containers (the thread's loop; tests call it)."""
        with self._lock:
            watched = dict(self._watched)
        for container_id, (pid, limit_mb) in watched.items():
            try:
                used = tree_memory_bytes(pid)
            except psutil.NoSuchProcess:
                self.forget(container_id)  # ended: its watcher tells the master
                continue
            except Exception:  # noqa: BLE001 - one container's error must not blind the guard
                _LOGGER.exception("container=%s: measuring its memory failed", container_id)
                continue
            if used > limit_mb << 20:
                self._tell(container_id, pid, used, limit_mb)

    def _tell(self, container_id: str, pid: int, used: int, limit_mb: int) -> None:
        """Forgets the container and tells ``over_limit``; if that fails, it is logged and
        the container watched again, to be told at the next pass."""
        self.forget(container_id)
        try:
            self._over_limit(container_id, (
                f"killed by the local launcher: its processes used {used >> 20:,} MB of "
                f"memory, over its CONTAINER_MEMORY_MB={limit_mb:,}; give the application "
                "more (CONTAINER_MEMORY_MB), or its Spark less (SPARK_DRIVER_MEMORY)"))
        except Exception:  # noqa: BLE001 - the guard must go on; the next pass tries again
            _LOGGER.exception("container=%s: acting on its memory limit failed", container_id)
            with self._lock:
                self._watched.setdefault(container_id, (pid, limit_mb))

    def _run(self) -> None:
        while not self._stopped.wait(self._poll_s):
            self.check()


class CoreSets:
    """Hands out sets of this process's allowed cores, each starting where the previous
    one ended, so that pinned containers spread over the machine."""

    def __init__(self, cores: list[int] | None = None) -> None:
        self._cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
        self._next = 0
        self._lock = threading.Lock()

    def take(self, cores: float) -> set[int]:
        """``ceil(cores)`` cores (at most all of them)."""
        wanted = min(len(self._cores), max(1, math.ceil(cores)))
        with self._lock:
            start, self._next = self._next, (self._next + wanted) % len(self._cores)
        return {self._cores[(start + i) % len(self._cores)] for i in range(wanted)}

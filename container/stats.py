"""Process figures for heartbeats: CPU and memory from psutil, GC from Python's collector."""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import socket
import threading
import time

import psutil

__all__ = ["GcMonitor", "ProcessSample", "ProcessStats"]

_LOGGER = logging.getLogger(__name__)
_MB = 1024 * 1024


class GcMonitor:
    """Counts collections and the time spent in them through ``gc.callbacks``.

    ``gc.get_stats`` gives counts but no time, so the callback measures each collection.
    Install one per process; ``close()`` removes the callback.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started_ns = 0
        self.collections = sum(s["collections"] for s in gc.get_stats())
        self.time_ns = 0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started_ns = time.perf_counter_ns()
        elif phase == "stop" and self._started_ns:
            with self._lock:
                self.collections += 1
                self.time_ns += time.perf_counter_ns() - self._started_ns
            self._started_ns = 0

    def close(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)


@dataclasses.dataclass(frozen=True)
class ProcessSample:
    cpu_percent: float
    memory_rss_mb: int
    memory_mb_free: int
    gc_collection_count: int
    gc_collection_time_ms: int


class ProcessStats:
    """Samples this process and its children (Spark's JVM) once per heartbeat.

    The children are listed again only every ``CHILDREN_TTL_S``: listing them walks every
    process of the machine (psutil reads all of ``/proc``), twice a heartbeat: it cost a
    container busy with Nexmark's q1 about 8 % of a core (one 10 s py-spy profile, 41 of
    1,025 samples),
    for a tree that changes once, when Spark starts. A child that ended is noticed at the
    next sample, which lists them again.
    """

    CHILDREN_TTL_S = 5.0

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._gc = GcMonitor()
        self._children: list[psutil.Process] = []
        self._listed_s = -self.CHILDREN_TTL_S
        self._seen: set[int] = set()
        self._last_cpu_s, _, _ = self._measure()
        self._last_wall_s = time.monotonic()
        self.pid, self.host = os.getpid(), socket.gethostname()
        self.process_name = f"{self.pid}@{self.host}"

    def _tree(self) -> list[psutil.Process]:
        now = time.monotonic()
        if now - self._listed_s >= self.CHILDREN_TTL_S:
            self._listed_s = now
            try:
                self._children = self._process.children(recursive=True)
            except psutil.Error:
                self._children = []
        return [self._process, *self._children]

    def _measure(self) -> tuple[float, float, int]:
        """CPU seconds of the tree, of its processes not seen before (their CPU until now
        is not this interval's: a JVM found up to ``CHILDREN_TTL_S`` after it started),
        and resident bytes, in one pass."""
        cpu_s, new_s, rss = 0.0, 0.0, 0
        seen = set()
        for proc in self._tree():
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    rss += proc.memory_info().rss
            except psutil.Error:
                if proc is not self._process:
                    self._listed_s = -self.CHILDREN_TTL_S  # one ended: list again next time
                continue
            seen.add(proc.pid)
            cpu_s += times.user + times.system
            if proc.pid not in self._seen:
                new_s += times.user + times.system
        self._seen = seen
        return cpu_s, new_s, rss

    def sample(self) -> ProcessSample:
        """CPU since the previous sample (100 = one core busy), memory now, GC totals."""
        (cpu_s, new_s, rss), wall_s = self._measure(), time.monotonic()
        elapsed = max(wall_s - self._last_wall_s, 1e-6)
        # A child that exited takes its CPU with it; never report a negative figure.
        cpu_percent = max(0.0, 100.0 * (cpu_s - new_s - self._last_cpu_s) / elapsed)
        self._last_cpu_s, self._last_wall_s = cpu_s, wall_s
        return ProcessSample(
            cpu_percent=round(cpu_percent, 1),
            memory_rss_mb=rss // _MB,
            memory_mb_free=psutil.virtual_memory().available // _MB,
            gc_collection_count=self._gc.collections,
            gc_collection_time_ms=self._gc.time_ns // 1_000_000,
        )

    def close(self) -> None:
        self._gc.close()

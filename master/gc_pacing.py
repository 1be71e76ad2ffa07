"""The master's garbage-collection policy: full collections rare, young ones by the clock.

The master holds a large, long-lived heap (plans, one stats ring per port of every
operator) and answers heartbeats with many short-lived messages. With Python's default
thresholds full collections ran every few seconds under load and paused every handler
thread for up to 0.3 s, which set the heartbeat p99 (``bench/control_plane.py``). Raising
the thresholds alone was not enough: at a steady load, objects die about as fast as they
are born, so the young generation's count (allocations minus frees) hardly grows, young
collections stop, and every survivor since the last one (the rings' newest windows, a
few million small tuples at 10,000 operators) piles up in the young generation until one
collection walks them all: 648 ms, once in four minutes, measured. Collecting the young
generation on a clock keeps each walk to a fraction of a second's survivors; the rings'
tuples of numbers are then untracked at their first walk and never walked again.
"""

from __future__ import annotations

import gc
import threading

__all__ = ["YOUNG_COLLECTION_INTERVAL_S", "YoungCollections", "tune_gc"]

YOUNG_COLLECTION_INTERVAL_S = 0.1
"""How often the young generation is collected, whatever its count says."""


def tune_gc() -> None:
    """Moves what exists at start-up out of the collector's way (``gc.freeze``) and makes
    the older generations' collections rare."""
    gc.freeze()
    gen0, _, _ = gc.get_threshold()
    gc.set_threshold(max(gen0, 10_000), 50, 1_000)


class YoungCollections:
    """A daemon thread collecting generation 0 every ``interval_s`` until ``stop``."""

    def __init__(self, interval_s: float = YOUNG_COLLECTION_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.collections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="weir-master-gc",
                                        daemon=True)

    def start(self) -> YoungCollections:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            gc.collect(0)
            self.collections += 1

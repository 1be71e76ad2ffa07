"""The local runner's Spark: the container's bridge (``runtime.spark.bridge``), one per
process, so that a local run hands windows to Spark by the same code path as a container
(the window input written as it arrives, the same schemas, the same warm-up), and a test
file with several local runs pays the JVM's start once. pyspark is imported only when a
run's operator uses Spark."""

from __future__ import annotations

import atexit
import threading

from weir.runtime.spark.bridge import SparkSessionBridge

__all__ = ["shared_bridge"]

_LOCK = threading.Lock()
_SHARED: dict[str, SparkSessionBridge] = {}
_WARM_UP_ROWS = 5_000  # a test's windows are small; the warm-up need not be large


def shared_bridge(master: str = "local[1]") -> SparkSessionBridge:
    """The process's bridge for ``master`` (one session per process: asking for another
    master stops the previous one's session first; a stopped one is made again)."""
    with _LOCK:
        bridge = _SHARED.get(master)
        if bridge is None or bridge.stopped:
            for other in _SHARED.values():
                other.stop()
            _SHARED.clear()
            bridge = _SHARED[master] = SparkSessionBridge(
                master=master, shuffle_partitions=1, app_name="weir-local-run",
                log_level="ERROR", warmup_rows=_WARM_UP_ROWS)
        return bridge


@atexit.register
def _stop_shared() -> None:
    for bridge in _SHARED.values():
        bridge.stop()

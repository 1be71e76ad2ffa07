"""The durable side of an operator's window loop: checkpoints after application windows,
the committed window handed to the operator, and the wait for the final commit.

A mixin of ``container.window_loop.OperatorRunner`` (its state is the runner's), kept apart
so the loop reads as windows and alignment.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

from container.lease import Lease
from container.runner_needs import Checkpointer, Clock
from container.runner_savepoints import SavepointDuty
from operators.operator import Operator, OperatorContext
from operators.watermarks import Watermarks
from operators.windows import format_window_id
from proto import plan_pb2, umbilical_pb2

__all__ = ["CommitSteps"]

_LOGGER = logging.getLogger("container.window_loop")


class CommitSteps:
    """Checkpoint and commit steps of the runner, run in the operator's thread."""

    operator_id: int
    operator: Operator
    context: OperatorContext
    checkpointer: Checkpointer | None
    lease: Lease | None
    clock: Clock
    stopped: threading.Event
    app_window_count: int
    checkpoint_window_count: int
    marks: Watermarks
    _window: int
    _checkpoint_due: bool
    _last_checkpoint: int
    _committed_pending: int
    _committed_delivered: int
    _committed_arrived: threading.Event
    _stats: collections.deque[umbilical_pb2.OperatorStats]
    _stats_lock: threading.Lock
    _on_change: Callable[[], None]
    savepoint: SavepointDuty

    def notify_committed(self, window_id: int) -> None:
        """The master's committed window; ``committed()`` reaches the operator at the next
        window boundary, in its own thread."""
        self._committed_pending = max(self._committed_pending, window_id)
        self._committed_arrived.set()

    def _hold_lease(self) -> None:
        """Waits while the container's lease has lapsed (see ``container.lease``)."""
        if self.lease is not None:
            self.lease.wait(self.stopped)

    def _checkpoint(self, window_id: int, stats: umbilical_pb2.OperatorStats) -> None:
        """Saves the state after ``window_id`` (an application-window boundary)."""
        self._checkpoint_due = False
        if self.checkpointer is None:
            return
        self._hold_lease()
        self._last_checkpoint = window_id
        started_ms, started = self.clock.now_ms(), time.perf_counter()
        size = self.checkpointer.checkpoint(self.operator_id, window_id, self.operator)
        took_ms = round((time.perf_counter() - started) * 1000)
        stats.checkpoint.CopyFrom(plan_pb2.Checkpoint(
            window_id=window_id, application_window_count=self.app_window_count,
            checkpoint_window_count=self.checkpoint_window_count))
        stats.checkpoint_stats.CopyFrom(umbilical_pb2.CheckpointStats(
            checkpoint_start_time=started_ms, checkpoint_time_ms=took_ms,
            checkpoint_bytes=size or 0))
        _LOGGER.debug("operator %s (%d) checkpointed window %s in %d ms", self.context.name,
                      self.operator_id, format_window_id(window_id), took_ms)
        self.operator.checkpointed(window_id)

    def _await_final_commit(self) -> None:
        """The stream ended: checkpoint the last window and wait until it is committed.

        Teardown waits for it so that ``committed`` reaches the operator for every one of
        its windows: a source frees the input it read, an exactly-once sink publishes what
        it staged. The master commits the end of the stream once every operator checkpointed
        it (operators that ended earlier and are done hold nothing back).
        """
        if self.checkpointer is None or self._window < 0:
            return
        if self._last_checkpoint != self._window:
            stats = umbilical_pb2.OperatorStats(  # a repeat: the master takes its
                window_id=self._window, watermark_ms=self.marks.current)  # checkpoint only
            self._checkpoint(self._window, stats)
            with self._stats_lock:
                self._stats.append(stats)
            self._on_change()
        while not self.stopped.is_set() and self._committed_delivered < self._window:
            self._committed_arrived.wait(0.5)
            self._committed_arrived.clear()
            self._deliver_committed()

    def _has_checkpoint(self, window_id: int) -> bool:
        return self.checkpointer is not None and self.checkpointer.has(self.operator_id,
                                                                       window_id)

    def _deliver_committed(self) -> None:
        """Between windows: the committed window reaches the operator, and the part of a
        savepoint taken while it runs is written (``container.runner_savepoints``)."""
        if self.savepoint.path:
            self.savepoint.while_running(self.operator_id, self._window,
                                         self._has_checkpoint)
        committed = self._committed_pending
        if committed > self._committed_delivered:
            self._hold_lease()
            self._committed_delivered = committed
            self.operator.committed(committed)
            if self.checkpointer is not None:
                self.checkpointer.committed(self.operator_id, committed)

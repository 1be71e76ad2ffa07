"""What an operator owes a savepoint (``storage.savepoints``): its part, written in its
own thread, between windows, so nothing of it changes while it is copied.

Two kinds. A savepoint with a stop is written once the stream ended and was committed
(``at_end``): the last checkpoint. One taken while the application runs names a window
every operator checkpointed (``window``): the part is that checkpoint, written at the
first window boundary after it; the durable folder copied then may be a few windows
ahead of it, as after a crash, and the operator's recovery takes it back (a store's undo
log, an exactly-once sink's commit steps).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["SavepointDuty"]

Writer = Callable[[int, int, str], None]
"""Writes operator ``id``'s part for the checkpoint of ``window`` under ``path``."""


class SavepointDuty:
    """One runner's savepoint duty; ``written`` is the path of the last part it wrote."""

    def __init__(self) -> None:
        self.path = ""
        self.window = -1  # -1: at the end of the stream (a stop)
        self.writer: Writer | None = None
        self.written = ""

    def ask(self, path: str, window: int, writer: Writer) -> None:
        """The master asked for a savepoint at ``path`` (a new one replaces an old one)."""
        if path != self.path:
            self.path, self.window, self.writer = path, window, writer

    @property
    def at_end(self) -> bool:
        return bool(self.path) and self.window < 0

    def while_running(self, operator_id: int, current_window: int,
                      has_checkpoint: Callable[[int], bool]) -> None:
        """Writes the part of a running savepoint once the operator is past its window
        and the checkpoint there exists (a redeployed instance saves it again)."""
        if (self.path and self.window >= 0 and self.written != self.path
                and current_window >= self.window and has_checkpoint(self.window)):
            self._write(operator_id, self.window)

    def at_stream_end(self, operator_id: int, last_checkpoint: int) -> None:
        """Writes the part of a savepoint with a stop: the stream's last checkpoint."""
        if self.at_end and self.written != self.path and last_checkpoint >= 0:
            self._write(operator_id, last_checkpoint)

    def _write(self, operator_id: int, window: int) -> None:
        assert self.writer is not None
        self.writer(operator_id, window, self.path)
        self.written = self.path

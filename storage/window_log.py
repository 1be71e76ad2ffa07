"""What a source read in each window, kept until the window is committed (Apex's
WindowDataManager), so that a recovered source re-reads exactly the same windows.

A checkpoint holds a source's read position as of one window; the windows after it
are replayed downstream only if the source cuts them again at the same places. The
window log remembers those places: the source saves its position at the end of every
window (synced before the window's end goes downstream) and, restored from an older
checkpoint, reads window by window up to the logged positions before reading freely.

>>> import tempfile
>>> log = WindowLog(tempfile.mkdtemp())
>>> log.save(7, {"offset": 120}); log.save(8, {"offset": 300})
>>> WindowLog(log.folder).after(7)
{8: {'offset': 300}}
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from weir.storage.records import RecordLog

__all__ = ["WindowLog"]


class WindowLog:
    """Per-window values (JSON) of one operator, in a ``RecordLog`` under ``folder``."""

    def __init__(self, folder: str, segment_bytes: int = 1 << 20,
                 guard: Callable[[], None] | None = None) -> None:
        self.folder = folder
        self._log = RecordLog(folder, segment_bytes, guard)
        self._index: list[tuple[int, int]] = []  # (window id, sequence number), ascending
        self._values: dict[int, Any] = {}
        for seq, payload in self._log.records():
            record = json.loads(payload)
            self._remember(int(record["w"]), seq, record["v"])

    def save(self, window_id: int, value: Any) -> None:
        """Records ``value`` for ``window_id`` durably (synced when this returns)."""
        if self._index and window_id <= self._index[-1][0]:
            raise ValueError(f"window log {self.folder}: window {window_id} saved after window "
                             f"{self._index[-1][0]}; windows must increase")
        seq = self._log.append(json.dumps({"w": window_id, "v": value}).encode())
        self._log.sync()
        self._remember(window_id, seq, value)

    def after(self, window_id: int) -> dict[int, Any]:
        """The logged values of the windows after ``window_id``, in window order."""
        return {w: self._values[w] for w, _ in self._index if w > window_id}

    def committed(self, window_id: int) -> None:
        """Forgets the windows up to ``window_id``: they are never replayed again.

        The record of the newest of them stays on disk if it shares a segment with newer
        ones; it is not replayed (replay starts after a checkpoint, never before it).
        """
        first_kept = next((s for w, s in self._index if w > window_id), self._log.next_seq)
        self._log.delete_before(first_kept)
        for w, _ in [entry for entry in self._index if entry[0] <= window_id]:
            self._values.pop(w, None)
        self._index = [entry for entry in self._index if entry[0] > window_id]

    def close(self) -> None:
        self._log.close()

    def _remember(self, window_id: int, seq: int, value: Any) -> None:
        self._index.append((window_id, seq))
        self._values[window_id] = value

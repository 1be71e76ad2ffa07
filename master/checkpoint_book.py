"""The checkpoints one operator reported, as the master books them (kept per operator on
its ``Application``; ``master.checkpoints`` applies the rules over them)."""

from __future__ import annotations

import bisect

from weir.operators.windows import NO_WINDOW

__all__ = ["CheckpointBook"]


class CheckpointBook:
    """The checkpoints one operator reported: ascending, without repeats, and what they cost.

    Reports may come late or out of order; a repeated one is ignored. ``high_water`` is
    the newest checkpoint ever recorded, even after ``forget_after``: a checkpoint past
    it is real progress (it resets the operator's failures in a row).
    """

    def __init__(self) -> None:
        self.windows: list[int] = []
        self.high_water = NO_WINDOW
        self.count = 0
        self.last_time_ms = 0
        self.total_time_ms = 0
        self.last_start_ms = 0
        self.last_bytes = 0

    last_bytes = 0  # (class default: books journaled before sizes were kept)

    def add(self, window_id: int, time_ms: int = 0, start_ms: int = 0,
            size_bytes: int = 0) -> bool:
        """Records the checkpoint of ``window_id``; False if it was already known."""
        if window_id < 0:
            return False
        index = bisect.bisect_left(self.windows, window_id)
        if index < len(self.windows) and self.windows[index] == window_id:
            return False
        self.windows.insert(index, window_id)
        self.high_water = max(self.high_water, window_id)
        self.count += 1
        self.last_time_ms = time_ms
        self.total_time_ms += time_ms
        self.last_start_ms = max(self.last_start_ms, start_ms)
        if size_bytes:
            self.last_bytes = size_bytes
        return True

    @property
    def latest(self) -> int:
        """The newest checkpoint, or -1 (the initial state) when there is none."""
        return self.windows[-1] if self.windows else NO_WINDOW

    @property
    def average_time_ms(self) -> float:
        return self.total_time_ms / self.count if self.count else 0.0

    def floor(self, bound: int) -> int:
        """The newest checkpoint not after ``bound``, or -1."""
        index = bisect.bisect_right(self.windows, bound)
        return self.windows[index - 1] if index else NO_WINDOW

    def prune_before(self, window_id: int) -> None:
        """Forgets checkpoints older than ``window_id`` (no longer any use for recovery)."""
        del self.windows[:bisect.bisect_left(self.windows, window_id)]

    def forget_after(self, window_id: int) -> list[int]:
        """Forgets checkpoints newer than ``window_id``; returns them.

        Used when the operator is redeployed from ``window_id``: what its previous
        instance saved later is not trusted; its new instance saves them again.
        """
        index = bisect.bisect_right(self.windows, window_id)
        dropped = self.windows[index:]
        del self.windows[index:]
        return dropped

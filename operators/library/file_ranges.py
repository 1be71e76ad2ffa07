"""What the file sources share: a read position in a set of files and windows recorded as
ranges of them, so a replayed window reads exactly the same ranges again."""

from __future__ import annotations

import zlib
from typing import Any, ClassVar

from weir.storage.replayable import ReplayableSource

__all__ = ["FileRangeSource"]


class FileRangeSource(ReplayableSource):
    """A ``ReplayableSource`` over files read one after another in name order.

    State: ``done`` (files read to the end), ``current`` and ``offset`` (the file being
    read and the next unit in it: a byte, a row) and ``partition``. A window's record is
    its ranges ``[name, start, end, finished]``. A subclass gives the units' budget
    (``read_step``, ``window_limit``) and implements ``_next_file``, ``_read_more``
    (read up to ``want`` units of ``current``, then ``_record`` them), ``_read_range``
    (a replayed range, exactly) and ``_close``; ``_finished`` hears of each file read
    to the end.
    """

    NON_STATE: ClassVar[tuple[str, ...]] = (*ReplayableSource.NON_STATE, "_ranges",
                                            "_window_units", "_next_scan")

    def _init_position(self, watch: bool) -> None:
        self.watch = watch
        self.done: list[str] = []  # files read to the end
        self.current: str | None = None  # the file being read
        self.offset = 0  # the next unit of ``current``
        self.partition = (0, 1)  # (index, count): the files this partition reads

    def reset_non_state(self) -> None:
        super().reset_non_state()
        self._ranges: list[list[Any]] = []
        self._window_units = 0
        self._next_scan = 0.0

    # -- what a subclass gives -------------------------------------------------------
    def read_step(self) -> int:
        """Units read per call at most."""
        raise NotImplementedError

    def window_limit(self) -> int | None:
        """Units per streaming window at most (None: as fast as possible)."""
        raise NotImplementedError

    def _next_file(self) -> str | None:
        raise NotImplementedError

    def _read_more(self, want: int) -> None:
        raise NotImplementedError

    def _read_range(self, name: str, start: int, end: int, finished: bool) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def _finished(self, name: str) -> None:
        """File ``name`` was read to the end (in the current window)."""

    # -- runtime hooks -------------------------------------------------------------
    def begin_window(self, window_id: int) -> None:
        self._ranges = []
        self._window_units = 0
        super().begin_window(window_id)

    def teardown(self) -> None:
        self._close()
        super().teardown()

    # -- ReplayableSource ------------------------------------------------------------
    def window_record(self) -> list[list[Any]]:
        return self._ranges

    def read(self, limit: list[list[Any]] | None) -> bool:
        if limit is not None:
            for name, start, end, finished in limit:
                self._read_range(name, start, end, finished)
            return True
        if self.current is None:
            self.current, self.offset = self._next_file(), 0
            if self.current is None:
                return self.watch
        want = self.read_step()
        per_window = self.window_limit()
        if per_window is not None:
            if self._window_units >= per_window:
                return True
            want = min(want, per_window - self._window_units)
        self._read_more(want)
        return True

    # -- the position ------------------------------------------------------------------
    def _mine(self, name: str) -> bool:
        """Whether this partition reads file ``name`` (a stable hash of the name)."""
        index, count = getattr(self, "partition", (0, 1))
        return count <= 1 or zlib.crc32(name.encode()) % count == index

    def _record(self, name: str, start: int, end: int, finished: bool) -> None:
        """Advances the position and notes the range in the window's record."""
        if self._ranges and self._ranges[-1][0] == name and self._ranges[-1][2] == start:
            self._ranges[-1][2] = end
            self._ranges[-1][3] = finished
        else:
            self._ranges.append([name, start, end, finished])
        self.offset = end
        if finished:
            self.done.append(name)
            self._finished(name)
            self.current, self.offset = None, 0
            self._close()

"""A replayable source over the text files of a folder, freeing each file only once the
windows that read it are committed."""

from __future__ import annotations

import fnmatch
import logging
import os
import time
from typing import BinaryIO, ClassVar

import pyarrow as pa

from weir.operators.library.file_ranges import FileRangeSource
from weir.operators.library.sources import LINE_SCHEMA, _lines
from weir.operators.operator import OperatorContext
from weir.operators.ports import OutputPort

__all__ = ["DirectorySource"]

_LOGGER = logging.getLogger(__name__)
_SCAN_S = 0.1


class DirectorySource(FileRangeSource):
    """Emits the lines of the UTF-8 text files in a folder, file by file in name order.

    Use it for input that arrives as files. Its read position (the file being read and
    a byte offset in it, and the files read to the end) is checkpointed and each
    window's byte ranges are logged, so a recovered source re-reads exactly the same
    windows: with an exactly-once sink, every line is counted once whatever fails.
    Files that appear later are new input; a file must be complete when it appears
    (write it under a name starting with ``.`` or ending in ``.tmp`` and rename it), and
    names must not be reused. Consumed files are deleted (or moved) only when the
    windows that read them are committed; a crash before that leaves them in place.
    With ``PARTITIONS=N`` each partition reads the files whose name hashes to it.

    Args:
        path: the folder (made absolute when the operator is built).
        pattern: a glob on file names, e.g. ``"*.txt"``.
        watch: keep looking for new files forever; False = end the stream once every
            file has been read (a bounded source).
        delete_consumed: delete each file once committed.
        move_consumed_to: instead of deleting, move each committed file to this folder.
        bytes_per_window: read at most about this many bytes per streaming window (whole
            lines; None = as fast as possible), to spread input over windows.
        read_bytes: bytes read from a file per call at most.

    Example:
        >>> DirectorySource("incoming", pattern="*.log", delete_consumed=True).pattern
        '*.log'
    """

    output = OutputPort(LINE_SCHEMA)
    SPLITS_INPUT = True

    NON_STATE: ClassVar[tuple[str, ...]] = (*FileRangeSource.NON_STATE, "_file")

    def __init__(self, path: str | os.PathLike[str], pattern: str = "*", watch: bool = False,
                 delete_consumed: bool = False,
                 move_consumed_to: str | os.PathLike[str] | None = None,
                 bytes_per_window: int | None = None, read_bytes: int = 1 << 20) -> None:
        if bytes_per_window is not None and bytes_per_window <= 0:
            raise ValueError(f"bytes_per_window must be positive or None, not {bytes_per_window}")
        if read_bytes <= 0:
            raise ValueError(f"read_bytes must be positive, not {read_bytes}")
        if delete_consumed and move_consumed_to is not None:
            raise ValueError("DirectorySource: choose delete_consumed or move_consumed_to, "
                             "not both")
        self.path = os.path.abspath(os.fspath(path))
        self.pattern = pattern
        self._init_position(watch)
        self.delete_consumed = delete_consumed
        self.move_consumed_to = (os.path.abspath(os.fspath(move_consumed_to))
                                 if move_consumed_to is not None else None)
        self.bytes_per_window = bytes_per_window
        self.read_bytes = read_bytes
        self.lines_read = 0
        self.to_release: list[tuple[str, int]] = []  # (file read to the end, in window)
        self.reset_non_state()

    def reset_non_state(self) -> None:
        super().reset_non_state()
        self._file: BinaryIO | None = None

    # -- runtime hooks -------------------------------------------------------------
    def setup(self, context: OperatorContext) -> None:
        if not os.path.isdir(self.path):
            raise FileNotFoundError(f"operator {context.name!r}: DirectorySource folder "
                                    f"{self.path!r} does not exist; create it or fix the path")
        if self.move_consumed_to is not None:
            os.makedirs(self.move_consumed_to, exist_ok=True)
        self.partition = (context.partition_index, context.partition_count)
        self.reset_non_state()
        super().setup(context)

    # -- FileRangeSource: bytes of the files -----------------------------------------
    def read_step(self) -> int:
        return self.read_bytes

    def window_limit(self) -> int | None:
        return self.bytes_per_window

    def _read_more(self, want: int) -> None:
        assert self.current is not None
        data = self._handle().read(want)
        if not data:
            self._record(self.current, self.offset, self.offset, finished=True)
            return
        if len(data) == want and b"\n" in data:
            data = data[:data.rindex(b"\n") + 1]  # whole lines; the rest comes next
        elif len(data) == want:  # one line longer than the budget: take it whole
            data += self._handle().readline()
        self._window_units += len(data)
        self._handle().seek(self.offset + len(data))
        self._emit(self.current, data)
        self._record(self.current, self.offset, self.offset + len(data), finished=False)

    def _finished(self, name: str) -> None:
        self.to_release.append((name, self._window_id))

    def release(self, window_id: int) -> None:
        due = [name for name, window in self.to_release if window <= window_id]
        self.to_release = [(n, w) for n, w in self.to_release if w > window_id]
        for name in due:
            source = os.path.join(self.path, name)
            try:
                if self.move_consumed_to is not None:
                    os.replace(source, os.path.join(self.move_consumed_to, name))
                elif self.delete_consumed:
                    os.remove(source)
            except FileNotFoundError:
                _LOGGER.warning("DirectorySource: consumed file %s was already gone", source)

    # -- reading ---------------------------------------------------------------------
    def _next_file(self) -> str | None:
        if self.watch and time.monotonic() < self._next_scan:
            return None  # the folder was empty a moment ago: do not list it in a busy loop
        done = set(self.done)
        names = sorted(n for n in os.listdir(self.path)
                       if fnmatch.fnmatch(n, self.pattern) and not n.startswith(".")
                       and not n.endswith(".tmp") and n not in done and self._mine(n)
                       and os.path.isfile(os.path.join(self.path, n)))
        if not names:
            self._next_scan = time.monotonic() + _SCAN_S
        return names[0] if names else None

    def _handle(self) -> BinaryIO:
        assert self.current is not None
        if self._file is None:
            path = os.path.join(self.path, self.current)
            try:
                self._file = open(path, "rb")  # noqa: SIM115 - kept open across windows
            except FileNotFoundError:
                raise FileNotFoundError(
                    f"DirectorySource: {path} disappeared while it was being read; files in "
                    f"{self.path} are freed only after commit, so something else removed it"
                ) from None
            self._file.seek(self.offset)
        return self._file

    def _read_range(self, name: str, start: int, end: int, finished: bool) -> None:
        """Reads ``name[start:end]`` again (a replayed window), exactly."""
        if self.current != name or self.offset != start:
            self._close()
            self.current, self.offset = name, start
        handle = self._handle()
        handle.seek(start)
        data = handle.read(end - start)
        if len(data) != end - start:
            raise RuntimeError(f"DirectorySource: {os.path.join(self.path, name)} is shorter "
                               f"than when window was first read (bytes {start}..{end}); input "
                               "files must not change once they are in the folder")
        if data:
            self._emit(name, data)
        self._record(name, start, end, finished)

    def _emit(self, name: str, data: bytes) -> None:
        lines = _lines(data, os.path.join(self.path, name), self.lines_read)
        self.output.emit(pa.record_batch([lines], schema=LINE_SCHEMA))
        self.lines_read += len(lines)

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

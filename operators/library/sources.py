"""Ready-made sources: a text file read line by line, and a synthetic event generator."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import BinaryIO, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from weir.operators.operator import InputOperator, OperatorContext, TransientNonState
from weir.operators.ports import OutputPort
from weir.storage.replayable import ReplayableSource

__all__ = ["EVENT_SCHEMA", "LINE_SCHEMA", "EventGenerator", "TextFileSource"]

_LOGGER = logging.getLogger(__name__)

LINE_SCHEMA = pa.schema([("line", pa.string())])
EVENT_SCHEMA = pa.schema([
    ("key", pa.string()),
    ("value", pa.int64()),
    ("event_time_ms", pa.int64()),
])


class TextFileSource(ReplayableSource):
    """Emits the lines of a UTF-8 text file, then ends the stream (a bounded source).

    Use it for demos and batch-like jobs over a file. Lines lose their line break
    (``\\n`` or ``\\r\\n``). The read position (``position``, a byte offset, and
    ``line_number``, lines emitted) is the operator's state, and each window's byte range
    is logged (``ReplayableSource``): a restored operator re-reads exactly the windows
    after its checkpoint, then carries on. With ``PARTITIONS=N`` partition i reads the
    i-th of N byte ranges of the file, each cut at a line start (Hadoop's input splits).

    Args:
        path: the file (made absolute when the operator is built).
        lines_per_window: emit at most this many lines per streaming window (None = as
            fast as possible), to spread a small file over several windows.
        batch_lines: lines per emitted batch at most.
        read_bytes: bytes read from the file per call at most.

    Example:
        >>> src = TextFileSource("book.txt", lines_per_window=1000)
        >>> src.output.spec.schema
        line: string
    """

    output = OutputPort(LINE_SCHEMA)
    SPLITS_INPUT = True

    NON_STATE: ClassVar[tuple[str, ...]] = (*ReplayableSource.NON_STATE, "_file", "_buffer",
                                            "_newlines", "_next_nl", "_start", "_eof",
                                            "_window_start")

    def __init__(self, path: str | os.PathLike[str], lines_per_window: int | None = None,
                 batch_lines: int = 10_000, read_bytes: int = 1 << 20) -> None:
        if lines_per_window is not None and lines_per_window <= 0:
            raise ValueError(f"lines_per_window must be positive or None, not {lines_per_window}")
        if batch_lines <= 0 or read_bytes <= 0:
            raise ValueError(f"batch_lines and read_bytes must be positive, not {batch_lines} "
                             f"and {read_bytes}")
        self.read_bytes = read_bytes
        self.path = os.path.abspath(os.fspath(path))
        self.lines_per_window = lines_per_window
        self.batch_lines = batch_lines
        self.position = 0
        self.line_number = 0
        self.end: int | None = None  # a partition's end (byte offset); None = the file's
        self._window_lines = 0
        self.reset_non_state()

    def reset_non_state(self) -> None:
        super().reset_non_state()
        self._file: BinaryIO | None = None
        self._reset_buffer()

    def setup(self, context: OperatorContext) -> None:
        if not os.path.isfile(self.path):
            raise FileNotFoundError(
                f"operator {context.name!r}: TextFileSource file {self.path!r} does not exist "
                "(or is not a file); check the path given to TextFileSource"
            )
        if context.partition_count > 1 and self.end is None:  # first start of a partition
            points = split_points(self.path, context.partition_count)
            self.position = points[context.partition_index]
            self.end = points[context.partition_index + 1]
        self._file = open(self.path, "rb")  # noqa: SIM115 - kept open across windows
        self._file.seek(self.position)
        self._reset_buffer()
        super().setup(context)

    def begin_window(self, window_id: int) -> None:
        self._window_lines = 0
        self._window_start = self.position
        super().begin_window(window_id)

    def window_record(self) -> list[int]:
        return [self._window_start, self.position]

    def read(self, limit: list[int] | None) -> bool:
        if limit is not None:
            return self._read_range(*limit)
        want = self.batch_lines
        if self.lines_per_window is not None:
            want = min(want, self.lines_per_window - self._window_lines)
            if want <= 0:
                return True
        data, count = self._take(want)
        if count:
            self.output.emit(pa.record_batch([_lines(data, self.path, self.line_number)],
                                             schema=LINE_SCHEMA))
            self.position += len(data)
            self.line_number += count
            self._window_lines += count
        return not (self._eof and self._start >= len(self._buffer))

    def teardown(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        super().teardown()

    def _read_range(self, start: int, end: int) -> bool:
        """Re-reads bytes ``start..end`` (a replayed window) and emits their lines."""
        if self._file is None:
            raise RuntimeError("TextFileSource: setup() was not called")
        if start != self.position:
            raise RuntimeError(f"TextFileSource: the window log replays bytes {start}..{end} "
                               f"of {self.path} but the read position is {self.position}")
        self._file.seek(start)
        data = self._file.read(end - start)
        if len(data) != end - start:
            raise RuntimeError(f"TextFileSource: {self.path} is shorter than when this window "
                               f"was first read (bytes {start}..{end}); it must not change")
        self._reset_buffer()
        if data:
            lines = _lines(data, self.path, self.line_number)
            for offset in range(0, len(lines), self.batch_lines):
                self.output.emit(pa.record_batch([lines.slice(offset, self.batch_lines)],
                                                 schema=LINE_SCHEMA))
            self.line_number += len(lines)
        self.position = end
        return True

    # -- reading -----------------------------------------------------------------------
    def _reset_buffer(self) -> None:
        self._buffer = b""
        self._newlines = np.empty(0, dtype=np.int64)  # positions of b"\n" in _buffer
        self._next_nl = 0  # index into _newlines of the first unconsumed line's end
        self._start = 0  # offset in _buffer of the first unconsumed byte
        self._eof = False

    def _take(self, n: int) -> tuple[bytes, int]:
        """Up to ``n`` whole lines (with their line breaks) and how many they are."""
        if self._file is None:
            raise RuntimeError("TextFileSource: setup() was not called")
        while len(self._newlines) - self._next_nl < n and not self._eof:
            self._fill()
        available = len(self._newlines) - self._next_nl
        if available >= n:
            end = int(self._newlines[self._next_nl + n - 1]) + 1
            count = n
        elif available:
            end = int(self._newlines[-1]) + 1
            count = available
        elif self._start < len(self._buffer):  # the last line has no line break
            end = len(self._buffer)
            count = 1
        else:
            return b"", 0
        data = self._buffer[self._start:end]
        self._next_nl += min(count, available)
        self._start = end
        return data, count

    def _fill(self) -> None:
        assert self._file is not None
        want = self.read_bytes if self.end is None else min(self.read_bytes,
                                                        self.end - self._file.tell())
        chunk = self._file.read(max(0, want))
        if not chunk:
            self._eof = True
            return
        rest = self._buffer[self._start:]
        self._buffer = rest + chunk
        self._newlines = np.flatnonzero(np.frombuffer(self._buffer, dtype=np.uint8) == 10)
        self._next_nl = 0
        self._start = 0


def split_points(path: str, count: int) -> list[int]:
    r"""``count + 1`` byte offsets cutting the file into ``count`` ranges of about equal
    size, each starting at a line start: partition i reads ``[points[i], points[i+1])``.

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile("wb", delete=False) as f:
    ...     _ = f.write(b"aa\nbb\ncc\ndd\n")
    >>> split_points(f.name, 2), split_points(f.name, 3)
    ([0, 6, 12], [0, 6, 9, 12])
    """
    size = os.path.getsize(path)
    points = [0]
    with open(path, "rb") as file:
        for i in range(1, count):
            guess = size * i // count
            if guess > 0:
                file.seek(guess - 1)
                file.readline()  # to the start of the first line at or after ``guess``
                guess = file.tell()
            points.append(max(points[-1], guess))
    return [*points, size]


def _lines(data: bytes, path: str, first_line: int) -> pa.Array:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = first_line + 1 + data[:exc.start].count(b"\n")
        raise ValueError(
            f"TextFileSource: {path!r} is not valid UTF-8 at line {line}: {exc.reason}"
        ) from None
    if text.endswith("\n"):
        text = text[:-1]
    lines = pa.array(text.split("\n"), pa.string())
    if "\r" in text:
        lines = pc.replace_substring_regex(lines, pattern="\r$", replacement="")
    return lines


class EventGenerator(TransientNonState, InputOperator):
    """Emits synthetic events ``(key, value, event_time_ms)``, deterministic for a seed.

    Use it to load-test a DAG or to check one end to end: events come in blocks of
    ``batch_rows`` rows, block ``i`` drawn from ``numpy.random.default_rng([seed, i])``,
    so the sequence does not depend on timing; ``expected_counts()`` recomputes the
    per-key count and sum of the first ``total`` events. Keys are ``k0000``..; values are
    uniform in 0..99; ``event_time_ms`` is the wall clock when the batch is emitted.

    Args:
        rate_per_second: events per second, spread over the streaming windows; None = as
            fast as possible.
        keys: number of distinct keys, drawn uniformly.
        total: events to emit before ending the stream; None = unbounded.
        batch_rows: rows per emitted batch at most (and per generated block).
        seed: the random seed.

    Example:
        >>> gen = EventGenerator(keys=10, total=1000, seed=7)
        >>> sum(count for count, _ in gen.expected_counts().values())
        1000
    """

    output = OutputPort(EVENT_SCHEMA)

    NON_STATE: ClassVar[tuple[str, ...]] = ("_keys", "_block", "_block_index")

    def __init__(self, rate_per_second: float | None = None, keys: int = 10_000,
                 total: int | None = None, batch_rows: int = 65_536, seed: int = 0) -> None:
        if rate_per_second is not None and rate_per_second <= 0:
            raise ValueError(f"rate_per_second must be positive or None, not {rate_per_second}")
        if keys <= 0 or batch_rows <= 0:
            raise ValueError("keys and batch_rows must be positive")
        if total is not None and total < 0:
            raise ValueError(f"total must be >= 0 or None, not {total}")
        self.rate_per_second = rate_per_second
        self.keys = keys
        self.total = total
        self.batch_rows = batch_rows
        self.seed = seed
        self.emitted = 0
        self._allowance = 0.0
        self._window_seconds = 0.5
        self.reset_non_state()

    def setup(self, context: OperatorContext) -> None:
        self._window_seconds = context.window_size_millis / 1000

    def begin_window(self, window_id: int) -> None:
        if self.rate_per_second is not None:
            # keep the fraction of an event; an unused backlog does not pile up
            self._allowance = (self._allowance % 1.0) + (
                self.rate_per_second * self._window_seconds)

    def emit_tuples(self) -> bool:
        n = self.batch_rows - self.emitted % self.batch_rows  # stay within one block
        if self.total is not None:
            n = min(n, self.total - self.emitted)
        if self.rate_per_second is not None:
            n = min(n, int(self._allowance))
        if n > 0:
            self.output.emit(self._batch(self.emitted, n, time.time_ns() // 1_000_000))
            self.emitted += n
            if self.rate_per_second is not None:
                self._allowance -= n
        return self.total is None or self.emitted < self.total

    def expected_counts(self, n: int | None = None) -> dict[str, tuple[int, int]]:
        """``{key: (count, sum of value)}`` over the first ``n`` events (default ``total``)."""
        n = self.total if n is None else n
        if n is None:
            raise ValueError("EventGenerator is unbounded (total=None): pass n")
        counts = np.zeros(self.keys, dtype=np.int64)
        sums = np.zeros(self.keys, dtype=np.int64)
        for start in range(0, n, self.batch_rows):
            keys, values = _block(self.seed, start // self.batch_rows, self.batch_rows, self.keys)
            keys, values = keys[:n - start], values[:n - start]
            counts += np.bincount(keys, minlength=self.keys)
            sums += np.bincount(keys, weights=values, minlength=self.keys).astype(np.int64)
        names = self._key_names().to_pylist()
        return {names[i]: (int(counts[i]), int(sums[i])) for i in np.flatnonzero(counts)}

    def batches(self, n: int | None = None, event_time_ms: int = 0) -> Iterator[pa.RecordBatch]:
        """The first ``n`` events (default ``total``) as record batches, without pacing.

        The same events the operator emits, for feeding another system the same input
        (benchmarks) or checking results; ``event_time_ms`` fills that column.
        """
        n = self.total if n is None else n
        if n is None:
            raise ValueError("EventGenerator is unbounded (total=None): pass n")
        for start in range(0, n, self.batch_rows):
            yield self._batch(start, min(self.batch_rows, n - start), event_time_ms)

    def _batch(self, start: int, n: int, event_time_ms: int) -> pa.RecordBatch:
        """Events ``start .. start + n`` (within one block) as a record batch."""
        keys, values = self._rows(start, n)
        return pa.record_batch(
            [self._key_names().take(pa.array(keys)), pa.array(values, pa.int64()),
             pa.array(np.full(n, event_time_ms, dtype=np.int64))],
            schema=EVENT_SCHEMA)

    def reset_non_state(self) -> None:
        self._keys: pa.Array | None = None
        self._block: tuple[np.ndarray, np.ndarray] | None = None
        self._block_index = -1

    def _key_names(self) -> pa.Array:
        if self._keys is None:
            width = max(4, len(str(self.keys - 1)))
            self._keys = pa.array([f"k{i:0{width}d}" for i in range(self.keys)], pa.string())
        return self._keys

    def _rows(self, start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Key indices and values of events ``start .. start + n`` (within one block)."""
        index, offset = divmod(start, self.batch_rows)
        if self._block is None or self._block_index != index:
            self._block = _block(self.seed, index, self.batch_rows, self.keys)
            self._block_index = index
        keys, values = self._block
        return keys[offset:offset + n], values[offset:offset + n]


def _block(seed: int, index: int, rows: int, keys: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, index])
    return rng.integers(0, keys, rows, dtype=np.int64), rng.integers(0, 100, rows, dtype=np.int64)

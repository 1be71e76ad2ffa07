"""``WindowJoin``: rows of two streams with equal keys in the same event-time window.

Window joins are batch-shaped: every row of a window meets the other side's rows of the
same window at once, when the watermark passes its end. So the rows wait in the keyed
store as Arrow, a chunk per side, window and streaming window (written once, never
rewritten), and a window that closes is one vectorised hash join of its chunks
(pyarrow's), then its chunks go. Measured on Nexmark's q8 shape (200,000 rows, 20
streaming windows, 2 cores): the per-key form (a row at a time through ``KeyedProcess``
state) took 5.9 s; this form takes a fraction of that (see docs/benchmarks.md).

Everything else is ``JoinSides``'s: the ports, the output's columns, late rows to
``late``. Keys that are null never match (as in SQL).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import pyarrow as pa

from weir.operators.library.join_sides import SIDES, JoinSides
from weir.operators.operator import Operator, OperatorContext
from weir.operators.partitioning import PartitionFilter
from weir.operators.watermarks import END_OF_TIME, NO_WATERMARK, event_times_ms

__all__ = ["WindowJoin"]

_OFFSET = 2**63
_CHUNK = b"w"


def chunk_row(start: int, side: str, window_id: int, partition: int) -> bytes:
    """The store key of one chunk: ordered by window start, so the windows that closed
    are a range."""
    return (_CHUNK + struct.pack(">Q", start + _OFFSET) + side[:1].encode()
            + struct.pack(">QI", window_id, partition))


def _parse(row: bytes) -> tuple[int, str]:
    (start,) = struct.unpack(">Q", row[1:9])
    return start - _OFFSET, {"l": "left", "r": "right"}[row[9:10].decode()]


def _to_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_bytes(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


class WindowJoin(JoinSides):
    """Joins ``left`` and ``right`` rows with equal ``keys`` in the same event-time window
    (an inner join). Give the inputs event time upstream (``EVENT_TIME_COLUMN`` on their
    sources); the watermark closes windows as in ``EventTimeWindows``.

    Output: the key columns, the left row's other columns, the right row's (a name the
    left side has too gets ``right_prefix``), ``window_start`` and ``window_end`` (epoch
    ms). One output row per pair, in each window once.

    Args:
        keys: the join key column(s), on both sides (or only the left's, with
            ``right_keys``).
        time_column: each side's event-time column (a name, or (left, right)).
        size_ms: the window's length.
        slide_ms: a sliding window's step (None: tumbling windows).
        right_prefix: put before a right column whose name the left side has too.
        right_keys: the right side's key columns, when named otherwise (they are left
            out of the output: the left's have the same values).

    Example:
        >>> WindowJoin(keys="seller", time_column="ts", size_ms=10_000).windows_of(12_345)
        [10000]
    """

    EXTRA_FIELDS: ClassVar[tuple[pa.Field, ...]] = (pa.field("window_start", pa.int64()),
                                                    pa.field("window_end", pa.int64()))
    METRICS: ClassVar[tuple[str, ...]] = ("late_rows", "windows_joined")

    def __init__(self, keys: str | Sequence[str], time_column: str | tuple[str, str],
                 size_ms: int, slide_ms: int | None = None, right_prefix: str = "right_",
                 right_keys: str | Sequence[str] | None = None) -> None:
        super().__init__(keys, time_column, right_prefix, None, right_keys)
        slide = size_ms if slide_ms is None else slide_ms
        if size_ms <= 0 or slide <= 0 or slide > size_ms:
            raise ValueError(f"WindowJoin: size_ms must be positive and slide_ms in "
                             f"(0, size_ms]; got size_ms={size_ms}, slide_ms={slide_ms}")
        self.size_ms, self.slide_ms = size_ms, slide
        self.windows_joined = 0

    def windows_of(self, ts: int) -> list[int]:
        """The starts of the windows holding event time ``ts``."""
        last = ts - ts % self.slide_ms
        return list(range(last, ts - self.size_ms, -self.slide_ms))[::-1]

    def closed(self, side: str, ms: np.ndarray) -> np.ndarray:
        """Rows whose last window ended before this window's rows came."""
        return ms - ms % self.slide_ms + self.size_ms <= self.fired_watermark

    # -- the store ------------------------------------------------------------------------
    def setup(self, context: OperatorContext) -> None:
        self.check_partition_key(context, self.keys)
        self._batches = {}
        handle = self.__dict__.get("state")
        share = handle.seed.share if handle is not None and handle.seed is not None else None
        self.open_store(context, owns=lambda cut: lambda rows: np.ones(len(rows), bool))
        if share is not None:  # a new partition: keep its keys' rows of the old chunks
            self._keep_share(PartitionFilter.from_json(share))

    def _keep_share(self, share: PartitionFilter) -> None:
        """Cuts every chunk copied from the old partitions to the keys ``share`` owns
        (again on a retried deployment: cutting a cut chunk changes nothing)."""
        position = self.keys.index(share.column) if share.column in self.keys else 0
        items = []
        for row, data in self.store.scan(_CHUNK, _CHUNK + b"\xff"):
            table = _from_bytes(data)
            side = _parse(row)[1]
            column = (self.keys if side == "left" else self.right_keys)[position]
            keep = pa.array(np.asarray(share.owns(table.column(column)), bool))
            kept = table.filter(keep)
            if kept.num_rows != table.num_rows:
                items.append((row, _to_bytes(kept) if kept.num_rows else None))
        if items:
            self.store.rewrite(items)

    def repartitioned(self, partitions: Sequence[Operator],
                      share: PartitionFilter | None) -> Operator:
        self.state = self.seed_handle(partitions, share)
        schemas = [p.__dict__.get("schemas") or {} for p in partitions]
        self.schemas = {side: s[side] for s in schemas for side in SIDES if side in s}
        return self

    # -- one window -----------------------------------------------------------------------
    def end_window(self) -> None:
        window_id: int = self._window_id
        context: OperatorContext = self._context
        partition = context.partition_index
        batches, self._batches = self._batches, {}
        changes: dict[bytes, bytes | None] = {}
        for side in SIDES:
            if not batches.get(side):
                continue
            rows = self.arrived(side, pa.Table.from_batches(batches[side]))
            for start, chunk in self._by_window(side, rows):
                changes[chunk_row(start, side, window_id, partition)] = _to_bytes(chunk)
        watermark = self.watermark
        if watermark != NO_WATERMARK:
            last = END_OF_TIME if watermark >= END_OF_TIME - self.size_ms else (
                watermark - self.size_ms)  # windows ending at or before the watermark
            due = dict(self.store.scan(_CHUNK, _CHUNK + struct.pack(">Q", last + _OFFSET)
                                       + b"\xff"))
            due.update({row: data for row, data in changes.items()
                        if data is not None and _parse(row)[0] <= last})
            self._fire(due, changes)
        if changes:
            context.check_fence()  # a replaced deployment must not write the store
            self.store.put(window_id, [(row, changes[row], False) for row in sorted(changes)])
            self.store_applied(window_id)
        self._rows = None
        self.fired_watermark = max(self.fired_watermark, watermark)

    def _by_window(self, side: str, rows: pa.Table) -> list[tuple[int, pa.Table]]:
        """The rows by the start of each window they fall in (a sliding window's row is
        in each of its windows)."""
        if not rows.num_rows:
            return []
        ms = event_times_ms(rows.column(self.time_columns[side])).to_numpy()
        last = ms - ms % self.slide_ms
        index, starts = [], []
        for back in range(0, self.size_ms, self.slide_ms):
            inside = np.flatnonzero(last - back > ms - self.size_ms)
            index.append(inside)
            starts.append(last[inside] - back)
        at, start_of = np.concatenate(index), np.concatenate(starts)
        return [(int(start), rows.take(pa.array(at[start_of == start])))
                for start in np.unique(start_of)]

    def _fire(self, due: dict[bytes, bytes], changes: dict[bytes, bytes | None]) -> None:
        """Joins each closed window's chunks and emits the pairs; the chunks go."""
        windows: dict[int, dict[str, list[pa.Table]]] = {}
        for row, data in due.items():
            start, side = _parse(row)
            windows.setdefault(start, {"left": [], "right": []})[side].append(
                _from_bytes(data))
            changes[row] = None
        parts = []
        for start in sorted(windows):
            sides = windows[start]
            self.windows_joined += 1
            if not sides["left"] or not sides["right"]:
                continue
            joined = self._join(pa.concat_tables(sides["left"]),
                                pa.concat_tables(sides["right"]))
            if joined.num_rows:
                n = joined.num_rows
                parts.append(joined.append_column("window_start", pa.array(
                    np.full(n, start, np.int64))).append_column(
                    "window_end", pa.array(np.full(n, start + self.size_ms, np.int64))))
        if parts:
            self.output.emit(pa.concat_tables(parts).cast(self.output_schema()))

    def _join(self, left: pa.Table, right: pa.Table) -> pa.Table:
        names = [n if n in self.right_keys else self._right_name(n) for n in right.column_names]
        right = right.rename_columns(names)
        joined = left.join(right, keys=list(self.keys), right_keys=list(self.right_keys),
                           join_type="inner", coalesce_keys=True)
        schema = self.output_schema()
        return joined.select(schema.names[:-len(self.EXTRA_FIELDS)])

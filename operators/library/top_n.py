"""``TopN``: the first ``n`` rows of each key and event-time window by a column.

The window's rows wait in the keyed store as Arrow chunks (``window_chunks``), each cut
to its own top ``n`` per key when written (the top of a window is the top of its
chunks' tops), so the state is at most ``n`` rows per key, window and streaming window.
When the watermark passes a window's end, its chunks are ranked once per key (Flink's
``ROW_NUMBER() ... <= n``: ties keep arrival order) and go out with ``rank``,
``window_start`` and ``window_end``. A row whose every window closed before it came goes
to ``late`` with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from weir.operators.library.keyed_process import KeyedProcess, key_starts
from weir.operators.library.window_chunks import WindowChunks, with_window
from weir.operators.operator import Operator, OperatorContext
from weir.operators.partitioning import PartitionFilter
from weir.operators.ports import OutputPort, SchemaMismatch
from weir.operators.watermarks import NO_WATERMARK, split_late

__all__ = ["TopN"]


class TopN(KeyedProcess):
    """The ``n`` rows of each key with the highest (``descending``) or lowest
    ``order_by`` per event-time window. Give the input event time upstream.

    Args:
        keys: the column(s) to rank within (none: one ranking per window).
        order_by: the column to rank by.
        n: how many rows per key and window.
        time_column: the rows' event-time column.
        size_ms, slide_ms: the windows (``slide_ms`` None: tumbling).
        descending: highest first (False: lowest first).

    Example:
        >>> TopN(keys="auction", order_by="price", n=10, time_column="ts",
        ...      size_ms=10_000).n
        10
    """

    late = OutputPort()

    KEYS_REQUIRED = False
    STATE: ClassVar[dict[str, Any]] = {}
    METRICS: ClassVar[tuple[str, ...]] = ("late_rows", "windows_ranked")
    COLUMNS_READ: ClassVar[tuple[str, ...]] = ("keys", "order_by", "time_column")
    EXTRA_FIELDS: ClassVar[tuple[pa.Field, ...]] = (
        pa.field("rank", pa.int64()), pa.field("window_start", pa.int64()),
        pa.field("window_end", pa.int64()))

    def __init__(self, keys: str | Sequence[str] | None, order_by: str, n: int,
                 time_column: str, size_ms: int, slide_ms: int | None = None,
                 descending: bool = True) -> None:
        super().__init__(keys or ())
        slide = size_ms if slide_ms is None else slide_ms
        if n < 1 or size_ms <= 0 or slide <= 0 or slide > size_ms:
            raise ValueError(f"TopN: n must be at least 1, size_ms positive and slide_ms in "
                             f"(0, size_ms]; got n={n}, size_ms={size_ms}, "
                             f"slide_ms={slide_ms}")
        self.order_by, self.n, self.time_column = order_by, n, time_column
        self.size_ms, self.slide_ms, self.descending = size_ms, slide, descending
        self.schema: pa.Schema | None = None  # the input's, from its first rows
        self.fired_watermark = NO_WATERMARK
        self.late_rows = 0
        self.windows_ranked = 0

    @property
    def _chunks(self) -> WindowChunks:
        return WindowChunks(self.size_ms, self.slide_ms)

    def output_schema(self) -> pa.Schema:
        if self.schema is None:
            raise SchemaMismatch("TopN: no rows came yet, so its output columns are not "
                                 "known")
        return pa.schema([*self.schema, *self.EXTRA_FIELDS])

    def setup(self, context: OperatorContext) -> None:
        self.check_partition_key(context, self.keys)
        self._batches = {}
        self._chunks.open(self, context, lambda cut, tag: cut.column)

    def repartitioned(self, partitions: Sequence[Operator],
                      share: PartitionFilter | None) -> Operator:
        self.state = self.seed_handle(partitions, share)
        self.schema = next((p.__dict__["schema"] for p in partitions
                            if p.__dict__.get("schema") is not None), None)
        return self

    def _top(self, rows: pa.Table) -> pa.Table:
        """Each key's first ``n`` rows by ``order_by``, with their ``rank`` (from 1)."""
        order = "descending" if self.descending else "ascending"
        rows = rows.take(pc.sort_indices(rows, [*((k, "ascending") for k in self.keys),
                                                (self.order_by, order)]))
        n = rows.num_rows
        starts = key_starts(rows, self.keys)
        first = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
        rank = np.arange(n) - first + 1
        keep = rank <= self.n
        return rows.filter(pa.array(keep)).append_column("rank", pa.array(rank[keep]))

    def end_window(self) -> None:
        window_id: int = self._window_id
        context: OperatorContext = self._context
        batches, self._batches = self._batches, {}
        changes: dict[bytes, bytes | None] = {}
        chunks = self._chunks
        if batches.get("input"):
            rows = pa.Table.from_batches(batches["input"])
            if self.schema is None:
                for column in (self.time_column, self.order_by):
                    if column not in rows.column_names:
                        raise SchemaMismatch(f"TopN: its input has no column {column!r}; "
                                             f"its columns are {rows.column_names}")
                self.schema = rows.schema
            rows = self._without_late(rows.select(self.schema.names).cast(self.schema))
            chunks.stage(changes, "i", rows, self.time_column, window_id,
                         context.partition_index,
                         reduce=lambda chunk: self._top(chunk).drop_columns(["rank"]))
        parts = []
        for start, tags in sorted(chunks.take_closed(self.store, changes,
                                                     self.watermark).items()):
            self.windows_ranked += 1
            top = self._top(pa.concat_tables(tags["i"]))
            parts.append(with_window(top, start, start + self.size_ms))
        self.commit_window(window_id, changes)
        if any(p.num_rows for p in parts):
            self.output.emit(pa.concat_tables(parts).cast(self.output_schema()))
        self.fired_watermark = max(self.fired_watermark, self.watermark)

    def _without_late(self, rows: pa.Table) -> pa.Table:
        kept, late = split_late(
            rows, self.time_column,
            lambda ms: self._chunks.closed(ms, self.fired_watermark),
            "its windows ended before it came")
        if late.num_rows:
            self.late_rows += late.num_rows
            self.late.emit(late)
        return kept

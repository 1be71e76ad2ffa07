"""Rows waiting for their event-time windows as Arrow chunks in the keyed store.

For window operators that act on all of a window's rows at once when the watermark passes
its end (``WindowJoin``, ``TopN``): each streaming window writes, per input (``tag``) and
event-time window, one chunk of the rows that fall in it (Arrow IPC, written once, never
rewritten); a closed window is the concatenation of its chunks, which then go. Store keys
sort by window start, so the closed windows are one range read. A chunk's key also holds
the streaming window and the partition that wrote it, so a new partition made by a
repartition can copy every old partition's chunks and cut them to its own keys.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from weir.operators.partitioning import PartitionFilter
from weir.operators.state_store import KeyedStore
from weir.operators.watermarks import END_OF_TIME, NO_WATERMARK, event_times_ms

__all__ = ["WindowChunks", "with_window"]

_OFFSET = 2**63
_CHUNK = b"w"


def chunk_row(start: int, tag: str, window_id: int, partition: int) -> bytes:
    return (_CHUNK + struct.pack(">Q", start + _OFFSET) + tag[:1].encode()
            + struct.pack(">QI", window_id, partition))


def parse_chunk_row(row: bytes) -> tuple[int, str]:
    """(window start, tag) of a chunk's store key."""
    (start,) = struct.unpack(">Q", row[1:9])
    return start - _OFFSET, row[9:10].decode()


def to_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_bytes(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def with_window(table: pa.Table, start: int, end: int) -> pa.Table:
    """``table`` with the window's ``window_start`` and ``window_end`` (epoch ms)."""
    n = table.num_rows
    return table.append_column("window_start", pa.array(np.full(n, start, np.int64))) \
        .append_column("window_end", pa.array(np.full(n, end, np.int64)))


class WindowChunks:
    """Tumbling (``slide_ms == size_ms``) or sliding windows of ``size_ms``."""

    def __init__(self, size_ms: int, slide_ms: int) -> None:
        self.size_ms, self.slide_ms = size_ms, slide_ms

    def windows_of(self, ts: int) -> list[int]:
        """The starts of the windows holding event time ``ts``."""
        last = ts - ts % self.slide_ms
        return list(range(last, ts - self.size_ms, -self.slide_ms))[::-1]

    def closed(self, ms: np.ndarray, watermark: int) -> np.ndarray:
        """Which event times' every window ended at or before ``watermark``."""
        return ms - ms % self.slide_ms + self.size_ms <= watermark

    def stage(self, changes: dict[bytes, bytes | None], tag: str, rows: pa.Table,
              time_column: str, window_id: int, partition: int,
              reduce: Callable[[pa.Table], pa.Table] | None = None) -> None:
        """Adds to ``changes`` one chunk per window ``rows`` fall in (a sliding window's
        row is in each of its windows); ``reduce`` may shrink a chunk before it is kept."""
        if not rows.num_rows:
            return
        ms = event_times_ms(rows.column(time_column)).to_numpy()
        last = ms - ms % self.slide_ms
        index, starts = [], []
        for back in range(0, self.size_ms, self.slide_ms):
            inside = np.flatnonzero(last - back > ms - self.size_ms)
            index.append(inside)
            starts.append(last[inside] - back)
        at, start_of = np.concatenate(index), np.concatenate(starts)
        for start in np.unique(start_of):
            chunk = rows.take(pa.array(at[start_of == start]))
            changes[chunk_row(int(start), tag, window_id, partition)] = to_bytes(
                reduce(chunk) if reduce is not None else chunk)

    def take_closed(self, store: KeyedStore, changes: dict[bytes, bytes | None],
                    watermark: int) -> dict[int, dict[str, list[pa.Table]]]:
        """The windows that ended at or before ``watermark``: their chunks (stored, or
        staged in ``changes``) by start and tag, in ``changes`` as deleted."""
        if watermark == NO_WATERMARK:
            return {}
        last = END_OF_TIME if watermark >= END_OF_TIME - self.size_ms else (
            watermark - self.size_ms)
        due = dict(store.scan(_CHUNK, _CHUNK + struct.pack(">Q", last + _OFFSET) + b"\xff"))
        due.update({row: data for row, data in changes.items()
                    if data is not None and parse_chunk_row(row)[0] <= last})
        windows: dict[int, dict[str, list[pa.Table]]] = {}
        for row in sorted(due):
            start, tag = parse_chunk_row(row)
            windows.setdefault(start, {}).setdefault(tag, []).append(from_bytes(due[row]))
            changes[row] = None
        return windows

    def open(self, operator: Any, context: Any, column_of: Callable[[PartitionFilter, str], str]
             ) -> None:
        """Opens ``operator``'s keyed store (a ``StoreBacked``) for chunks: a new partition
        copies every old partition's chunks, then cuts them to its keys;
        ``column_of(share, tag)`` names a chunk's key column."""
        handle = operator.__dict__.get("state")
        share = handle.seed.share if handle is not None and handle.seed is not None else None
        operator.open_store(context, owns=lambda cut: lambda rows: np.ones(len(rows), bool))
        if share is not None:
            cut = PartitionFilter.from_json(share)
            self.keep_share(operator.store, cut, lambda tag: column_of(cut, tag))

    def keep_share(self, store: KeyedStore, share: PartitionFilter,
                   column_of: Callable[[str], str]) -> None:
        """Cuts every chunk copied from old partitions to the keys ``share`` owns (again
        on a retried deployment: cutting a cut chunk changes nothing); ``column_of(tag)``
        names the chunk's key column."""
        items = []
        for row, data in store.scan(_CHUNK, _CHUNK + b"\xff"):
            table = from_bytes(data)
            column = column_of(parse_chunk_row(row)[1])
            kept = table.filter(pa.array(np.asarray(share.owns(table.column(column)), bool)))
            if kept.num_rows != table.num_rows:
                items.append((row, to_bytes(kept) if kept.num_rows else None))
        if items:
            store.rewrite(items)

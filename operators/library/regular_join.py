"""``RegularJoin``: every pair of left and right rows with equal keys, with no time bound.

Each window at once, as Arrow: the window's left rows meet the right rows kept for their
keys and the window's right rows; the window's right rows meet the left rows kept for
theirs (so each pair meets once, when its second row comes); then the window's rows join
their keys' kept rows. A key's kept rows are one row of the keyed store (each side's
columns as value lists), read once per window it is touched in. Nothing bounds the state
but ``ttl_millis``: a key's rows are forgotten once no row of that key came for that
long on the application's clock (Flink's state TTL), so it is required. Rows with a null
key match nothing (as in SQL) and are not kept.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from weir.operators.library.join_sides import SIDES, JoinSides
from weir.operators.library.key_state import state_row
from weir.operators.library.keyed_process import group_by_key, no_gc_pauses

__all__ = ["RegularJoin"]


class RegularJoin(JoinSides):
    """An unbounded inner join of ``left`` and ``right`` on ``keys``, its state bounded by
    ``ttl_millis``. Output: the key columns, the left row's other columns, the right
    row's (a name the left has too gets ``right_prefix``).

    Args:
        keys: the join key column(s) (or only the left's, with ``right_keys``).
        ttl_millis: forget a key's rows when no row of the key came for this long.
        right_prefix, right_keys: as for ``WindowJoin``.

    Example:
        >>> RegularJoin("user", ttl_millis=3_600_000).ttl_millis
        3600000
    """

    STATE: ClassVar[dict[str, Any]] = {}  # a key's row: {side: [column values lists]}

    def __init__(self, keys: str | Sequence[str], ttl_millis: int,
                 right_prefix: str = "right_",
                 right_keys: str | Sequence[str] | None = None) -> None:
        if not isinstance(ttl_millis, int) or ttl_millis < 1:
            raise ValueError("RegularJoin: ttl_millis is required (a positive number of "
                             "milliseconds): without it the state grows for ever")
        super().__init__(keys, None, right_prefix, ttl_millis, right_keys)

    def closed(self, side: str, ms: np.ndarray) -> np.ndarray:
        return np.zeros(len(ms), dtype=bool)

    def end_window(self) -> None:
        window_id: int = self._window_id
        batches, self._batches = self._batches, {}
        new: dict[str, pa.Table] = {}
        for side in SIDES:
            if batches.get(side):
                rows = self.arrived(side, pa.Table.from_batches(batches[side]))
                keyed = pc.invert(_any_null(rows, self.keys_of(side)))
                rows = rows.filter(keyed) if not pc.all(keyed).as_py() else rows
                if rows.num_rows:
                    new[side] = rows
        changes: dict[bytes, bytes | None] = {}
        with no_gc_pauses():
            pairs = [p for p in (self._join(new, window_id, changes) if new else [])
                     if p.num_rows]
        if pairs:
            schema = self.output_schema()
            self.output.emit(pa.concat_tables([p.select(schema.names).cast(schema)
                                               for p in pairs]))
        self.commit_window(window_id, changes, expires=lambda row: row[:1] == b"s")

    def _join(self, new: dict[str, pa.Table], window_id: int,
              changes: dict[bytes, bytes | None]) -> list[pa.Table]:
        """The window's pairs; each touched key's kept rows, with the window's added, into
        ``changes``."""
        grouped = {side: group_by_key(rows, self.keys_of(side)) for side, rows in new.items()}
        keys = list(dict.fromkeys(k for _, groups in grouped.values() for k, _, _ in groups))
        rows_of = {key: state_row(key) for key in keys}
        stored = self.store.fetch(list(rows_of.values()), window_id)
        kept = {key: pickle.loads(stored[row]) if row in stored else {}
                for key, row in rows_of.items()}
        parts = []
        if "left" in new and "right" in self.schemas:
            partners = self._kept("right", [k for k, _, _ in grouped["left"][1]], kept)
            if "right" in new:
                partners = pa.concat_tables([partners, new["right"]])
            parts.append(self._pairs(new["left"], partners))
        if "right" in new and "left" in self.schemas:
            parts.append(self._pairs(
                self._kept("left", [k for k, _, _ in grouped["right"][1]], kept), new["right"]))
        for side, (table, groups) in grouped.items():
            columns = [_plain(table.column(n)).to_pylist() for n in self.schemas[side].names]
            for key, start, length in groups:
                mine = kept[key].setdefault(side, [[] for _ in columns])
                for values, column in zip(mine, columns, strict=True):
                    values.extend(column[start:start + length])
        for key, row in rows_of.items():
            changes[row] = pickle.dumps(kept[key], protocol=5)
        return parts

    def _kept(self, side: str, keys: list[tuple[Any, ...]],
              kept: dict[tuple[Any, ...], dict[str, list[list[Any]]]]) -> pa.Table:
        """The rows of ``side`` kept for ``keys``, as a table of the side's schema."""
        schema = self.schemas[side]
        columns: list[list[Any]] = [[] for _ in schema]
        for key in keys:
            for values, stored in zip(columns, kept[key].get(side, ()), strict=False):
                values.extend(stored)
        return pa.Table.from_arrays([pa.array(v, f.type) for v, f in
                                     zip(columns, schema, strict=True)], schema=schema)

    def _pairs(self, left: pa.Table, right: pa.Table) -> pa.Table:
        """Every pair of ``left`` and ``right`` rows with equal keys, in the output's
        column names."""
        if not (left.num_rows and right.num_rows):
            return left.slice(0, 0)
        right = right.rename_columns([n if n in self.right_keys else self._right_name(n)
                                      for n in right.column_names])
        return left.join(right, list(self.keys), right_keys=list(self.right_keys),
                         join_type="inner", use_threads=False)


def _plain(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Times as their integers: Python values made and pickled ten times faster than
    datetimes (``pa.array`` makes the type again from them)."""
    kind = column.type
    if pa.types.is_timestamp(kind) or pa.types.is_duration(kind) or pa.types.is_time(kind):
        return column.cast(pa.int64())
    if pa.types.is_date(kind):
        return column.cast(pa.int32() if pa.types.is_date32(kind) else pa.int64())
    return column


def _any_null(rows: pa.Table, keys: Sequence[str]) -> pa.ChunkedArray | pa.Array:
    """Which rows have a null in any of ``keys``."""
    nulls = pc.is_null(rows.column(keys[0]))
    for name in keys[1:]:
        nulls = pc.or_(nulls, pc.is_null(rows.column(name)))
    return nulls

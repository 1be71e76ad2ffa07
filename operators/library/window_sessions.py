"""Partial aggregates per session: how ``EventTimeWindows`` keeps session windows whose
aggregations are decomposable (``count``, ``sum``, ``min``, ``max``, ``avg`` of a row
expression), as ``window_panes`` keeps tumbling and sliding ones.

Two rows of a key less than the gap apart share a session, so the rows of a key in one
stretch of ``gap_ms`` of event time (``t - t mod gap``) always share one: Spark aggregates
the new rows per key and stretch (a hash aggregation, no sort) into fragments with their
first and last event time; Arrow merges the fragments with the open sessions of the state
(per key, by start: a fragment or session that starts less than the gap after the latest
end before it joins that session) and merges their partials. The state is then a row per
key and open session, not the open sessions' rows, and a window's job costs its new rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from weir.operators.library.window_panes import TOUCHED, Partial, partial_merges, partial_values

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["FIRST", "LAST", "Sessions"]

FIRST = "__weir_first_ms"  # a session's (or fragment's) first event time, epoch ms
LAST = "__weir_last_ms"  # its last event time: it ends ``gap_ms`` after
_SESSION = "__weir_session_index"


class Sessions:
    """The session arithmetic and merges of one operator's windows (no state of its own).

    Args:
        keys: the key columns.
        partials: from ``window_panes.decompose``.
        gap_ms: a session ends this long after its last row.
    """

    def __init__(self, keys: Sequence[str], partials: Sequence[Partial], gap_ms: int) -> None:
        self.keys = list(keys)
        self.partials = tuple(partials)
        self.gap_ms = gap_ms
        self.slot_ms = gap_ms  # the stretch whose rows Spark aggregates together
        self.columns = [column for p in self.partials for column in p.columns()]

    def spark_partials(self, df: DataFrame, time_column: str) -> DataFrame:
        """The rows' fragments: per key and stretch of ``gap_ms``, the first and last event
        time and the partials (run by Spark)."""
        from pyspark.sql import functions as F  # noqa: N812 - the usual name

        time = F.col(time_column)
        stretch = (time - F.pmod(time, F.lit(self.gap_ms))).alias("__weir_stretch")
        return df.groupBy(*[F.col(k) for k in self.keys], stretch).agg(
            F.min(time).alias(FIRST), F.max(time).alias(LAST),
            *[F.expr(aggregate).alias(name) for name, aggregate, _ in self.columns]
        ).drop("__weir_stretch")

    def merge(self, state: pa.Table | None, new: pa.Table) -> pa.Table:
        """``new`` fragments (from Spark, marked touched) merged into ``state``'s sessions."""
        new = new.append_column(TOUCHED, pa.repeat(True, new.num_rows))
        if state is not None and state.num_rows:
            new = pa.concat_tables([state, new.cast(state.schema)])
        return self._sessions(new)

    def windows(self, state: pa.Table) -> pa.Table:
        """The sessions are the windows."""
        return state

    def window_ends(self, windows: pa.Table) -> pa.Array:
        return pc.add(windows.column(LAST), self.gap_ms)

    def a_window_ended(self, state: pa.Table, before: int, now: int) -> bool:
        ends = state.column(LAST).to_numpy() + self.gap_ms
        return bool(np.any((ends > before) & (ends <= now)))

    def results(self, windows: pa.Table) -> pa.Table:
        """The output rows: keys, ``window_start`` (the first row's time),
        ``window_end`` (the last row's plus the gap) and each aggregation's value."""
        ts = pa.timestamp("ms", tz="UTC")
        columns = {k: windows.column(k) for k in self.keys}
        columns["window_start"] = windows.column(FIRST).cast(ts)
        columns["window_end"] = self.window_ends(windows).cast(ts)
        columns.update(partial_values(self.partials, windows))
        return pa.table(columns)

    def kept(self, state: pa.Table, after_ms: int) -> pa.Table:
        """The sessions that end after ``after_ms``, untouched from now on."""
        kept = state.filter(pc.greater(self.window_ends(state), after_ms))
        index = kept.schema.get_field_index(TOUCHED)
        return kept.set_column(index, TOUCHED, pa.repeat(False, kept.num_rows))

    def rows_in(self, sessions: pa.Table, rows: pa.Table, time_column: str) -> np.ndarray:
        """Which of ``rows`` (with the key columns and their event time in ms) fall in one
        of ``sessions`` of their key (meant for few: a dictionary of the sessions)."""
        spans: dict[tuple, list[tuple[int, int]]] = {}
        for row in sessions.select([*self.keys, FIRST, LAST]).to_pylist():
            key = tuple(row[k] for k in self.keys)
            spans.setdefault(key, []).append((row[FIRST], row[LAST]))
        times = rows.column(time_column).to_pylist()
        keys = list(zip(*(rows.column(k).to_pylist() for k in self.keys), strict=True)) \
            if self.keys else [()] * len(times)
        return np.array([any(first <= t <= last for first, last in spans.get(key, ()))
                         for key, t in zip(keys, times, strict=True)], dtype=bool)

    def _sessions(self, table: pa.Table) -> pa.Table:
        """``table``'s sessions and fragments merged into sessions: per key, by first event
        time, each starts a new session unless it starts less than the gap after the
        latest last event time before it."""
        table = table.take(pc.sort_indices(
            table, [*((k, "ascending") for k in self.keys), (FIRST, "ascending")]))
        first = table.column(FIRST).to_numpy()
        last = table.column(LAST).to_numpy()
        new_key = _key_changes(table, self.keys)
        latest = _running_max_per_key(last, np.cumsum(new_key))
        starts = new_key.copy()
        starts[1:] |= first[1:] >= latest[:-1] + self.gap_ms
        index = np.cumsum(starts) - 1
        heads = np.flatnonzero(starts)
        merges = partial_merges(self.columns)
        grouped = table.select([name for name, _ in merges]).append_column(
            _SESSION, pa.array(index)).group_by(_SESSION, use_threads=False).aggregate(merges)
        grouped = grouped.take(pc.sort_indices(grouped, [(_SESSION, "ascending")]))
        columns = {k: table.column(k).take(pa.array(heads)) for k in self.keys}
        columns[FIRST] = pa.array(first[heads])
        columns[LAST] = pa.array(np.maximum.reduceat(last, heads) if len(heads) else heads)
        for name, merge in merges:
            columns[name] = grouped.column(f"{name}_{merge}")
        return pa.table(columns).cast(table.schema)


def _key_changes(table: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """Per row of ``table`` (sorted by ``keys``), whether its key differs from the row
    before's (the first row's does; nulls equal nulls, as in a grouping)."""
    changes = np.zeros(table.num_rows, dtype=bool)
    if table.num_rows:
        changes[0] = True
    for key in keys:
        column = table.column(key)
        here, before = column.slice(1), column.slice(0, max(table.num_rows - 1, 0))
        same = pc.or_(pc.fill_null(pc.equal(here, before), False),
                      pc.and_(pc.is_null(here), pc.is_null(before)))
        changes[1:] |= ~np.asarray(same.to_numpy(zero_copy_only=False), dtype=bool)
    return changes


def _running_max_per_key(values: np.ndarray, key_number: np.ndarray) -> np.ndarray:
    """The running maximum of ``values`` that starts again at each key (``key_number``:
    1, 1, 2, 2, 2, 3...): each key's values are lifted above every earlier key's, so one
    running maximum over all of them never carries one key's into the next."""
    if len(values) == 0:
        return values
    low, span = int(values.min()), int(values.max() - values.min()) + 1
    if int(key_number[-1]) * span < 2**62:
        lift = (key_number.astype(np.int64) - 1) * span - low
        return np.maximum.accumulate(values + lift) - lift
    out = np.empty_like(values)  # too many keys over too long a stretch to lift: per key
    bounds = np.flatnonzero(np.diff(key_number, prepend=0))
    for begin, end in zip(bounds, [*bounds[1:], len(values)], strict=True):
        out[begin:end] = np.maximum.accumulate(values[begin:end])
    return out

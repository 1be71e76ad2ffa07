"""Partial aggregates per key and pane: how ``EventTimeWindows`` keeps tumbling and sliding
windows whose aggregations are decomposable (``count``, ``sum``, ``min``, ``max``, ``avg``
of a row expression).

A pane is a stretch of event time of gcd(size, slide) ms: every window is a whole number
of panes and every row is in exactly one. Spark aggregates the rows per key and pane (one
group per row, where assigning each row to all the sliding windows it falls in, as
Spark's own ``window`` does, multiplies the rows by size/slide first); Arrow merges those
partials into the state per key and pane, and a window's result is the merge of its
panes' partials ("No pane, no gain", Li et al., SIGMOD Record 2005; Flink's sliding
windows share partials the same way). The state is then a row per key and open pane, not
the open windows' rows.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Panes", "Partial", "decompose", "partial_merges", "partial_values",
           "referenced_columns"]

PANE = "__weir_pane"  # a pane's start (epoch ms)
TOUCHED = "__weir_touched"  # the pane took rows since its windows last went out
_START = "__weir_window_start"

_CALL = re.compile(r"^\s*(count|sum|min|max|avg|mean)\s*\((.*)\)\s*$",
                   re.IGNORECASE | re.DOTALL)
_IDENTIFIER = re.compile(r"`([^`]+)`|([A-Za-z_][A-Za-z0-9_]*)")
_MERGE = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}


@dataclasses.dataclass(frozen=True)
class Partial:
    """One output column as a decomposable aggregate of a row expression."""

    name: str
    function: str  # count, sum, min, max or avg
    argument: str  # the row expression, SQL (``*`` for ``count(*)``)

    def columns(self) -> list[tuple[str, str, str]]:
        """Its state columns: (name, Spark aggregate over rows, Arrow merge of partials)."""
        column = f"__weir_{self.name}"
        if self.function == "avg":  # a sum and a count; the mean only at the end
            return [(f"{column}_sum", f"sum({self.argument})", "sum"),
                    (f"{column}_n", f"count({self.argument})", "sum")]
        return [(column, f"{self.function}({self.argument})", _MERGE[self.function])]


def decompose(aggregations: Mapping[str, str]) -> tuple[Partial, ...] | None:
    """The aggregations as partials, or None if one is not ``count``, ``sum``, ``min``,
    ``max`` or ``avg`` of a row expression (``count(DISTINCT x)``, ``percentile(...)``,
    ``sum(a) / count(b)``): those windows keep their rows instead.

    >>> [p.function for p in decompose({"n": "count(*)", "m": "AVG(price * 2)"})]
    ['count', 'avg']
    >>> decompose({"d": "count(DISTINCT user)"}) is None
    True
    >>> decompose({"r": "sum(a) / count(b)"}) is None
    True
    """
    partials = []
    for name, expression in aggregations.items():
        match = _CALL.match(expression)
        if match is None:
            return None
        function, argument = match.group(1).lower(), match.group(2).strip()
        if not argument or not _balanced(argument) or \
                argument.lower().startswith("distinct"):
            return None
        partials.append(Partial(name, "avg" if function == "mean" else function, argument))
    return tuple(partials)


def _balanced(text: str) -> bool:
    """Parentheses open and close in order: ``a) / count(b`` is two calls, not one."""
    depth = 0
    for char in text:
        depth += (char == "(") - (char == ")")
        if depth < 0:
            return False
    return depth == 0


def referenced_columns(partials: Sequence[Partial], names: Sequence[str]) -> list[str]:
    """The input columns the aggregations may read (any name that appears in them; Spark
    matches names without regard to case), so the rest need not be handed to Spark.

    >>> referenced_columns(decompose({"n": "count(*)", "p": "max(Price)"}), ["price", "url"])
    ['price']
    """
    words: set[str] = set()
    for partial in partials:
        for match in _IDENTIFIER.finditer(partial.argument):
            words.add((match.group(1) or match.group(2)).lower())
    return [name for name in names if name.lower() in words]


class Panes:
    """The pane arithmetic and merges of one operator's windows (no state of its own).

    Args:
        keys: the key columns.
        partials: from ``decompose``.
        size_ms, slide_ms: the windows' length and start interval (tumbling: equal).
    """

    def __init__(self, keys: Sequence[str], partials: Sequence[Partial], size_ms: int,
                 slide_ms: int) -> None:
        self.keys = list(keys)
        self.partials = tuple(partials)
        self.size_ms, self.slide_ms = size_ms, slide_ms
        self.pane_ms = math.gcd(size_ms, slide_ms)
        self.slot_ms = self.pane_ms  # the stretch whose rows Spark aggregates together
        self.columns = [column for p in self.partials for column in p.columns()]

    def spark_partials(self, df: DataFrame, time_column: str) -> DataFrame:
        """The rows' partials per key and pane (run by Spark)."""
        from pyspark.sql import functions as F  # noqa: N812 - the usual name

        time = F.col(time_column)
        pane = (time - F.pmod(time, F.lit(self.pane_ms))).alias(PANE)
        return df.groupBy(*[F.col(k) for k in self.keys], pane).agg(
            *[F.expr(aggregate).alias(name) for name, aggregate, _ in self.columns])

    def merge(self, state: pa.Table | None, new: pa.Table) -> pa.Table:
        """``new`` partials (from Spark, marked touched) merged into ``state``."""
        new = new.append_column(TOUCHED, pa.repeat(True, new.num_rows))
        if state is None or state.num_rows == 0:
            return new
        both = pa.concat_tables([state, new.cast(state.schema)])
        return self._grouped(both, [*self.keys, PANE], PANE)

    def windows(self, state: pa.Table) -> pa.Table:
        """Every window with a pane in ``state``: the keys, the window's start (ms, in
        the ``__weir_window_start`` column), its partials merged and whether it was
        touched."""
        panes = state.column(PANE).to_numpy()
        last = panes - np.mod(panes, self.slide_ms)  # the latest window start a pane is in
        copies = -(-self.size_ms // self.slide_ms)  # windows a pane may be in, at most
        if copies == 1:
            return state.append_column(_START, pa.array(last))
        index = np.repeat(np.arange(len(panes)), copies)
        starts = np.repeat(last, copies) - np.tile(np.arange(copies), len(panes)) \
            * self.slide_ms
        inside = starts > np.repeat(panes, copies) - self.size_ms
        expanded = state.take(pa.array(index[inside])).append_column(
            _START, pa.array(starts[inside]))
        return self._grouped(expanded.drop_columns([PANE]), [*self.keys, _START], _START)

    def a_window_ended(self, state: pa.Table, before: int, now: int) -> bool:
        """Whether a window of ``state``'s panes ends in (before, now], from the panes
        alone: a pane's windows end every slide from its first window's end to its last's."""
        panes = state.column(PANE).to_numpy()
        last_end = panes - np.mod(panes, self.slide_ms) + self.size_ms
        first_end = last_end - (last_end - panes - 1) // self.slide_ms * self.slide_ms
        lowest = np.maximum(first_end, before + 1)  # (before may be NO_WATERMARK)
        after = first_end + -(-(lowest - first_end) // self.slide_ms) * self.slide_ms
        return bool(np.any(after <= np.minimum(now, last_end)))

    def window_ends(self, windows: pa.Table) -> pa.Array:
        return pc.add(windows.column(_START), self.size_ms)

    def results(self, windows: pa.Table) -> pa.Table:
        """The output rows of ``windows``: keys, ``window_start``, ``window_end``
        (timestamps, ms, UTC) and each aggregation's value."""
        start = windows.column(_START)
        ts = pa.timestamp("ms", tz="UTC")
        columns = {k: windows.column(k) for k in self.keys}
        columns["window_start"] = start.cast(ts)
        columns["window_end"] = pc.add(start, self.size_ms).cast(ts)
        columns.update(partial_values(self.partials, windows))
        return pa.table(columns)

    def kept(self, state: pa.Table, after_ms: int) -> pa.Table:
        """The panes in a window that ends after ``after_ms``, untouched from now on."""
        panes = state.column(PANE).to_numpy()
        last_end = panes - np.mod(panes, self.slide_ms) + self.size_ms  # (floor mod)
        kept = state.filter(pa.array(last_end > after_ms))
        index = kept.schema.get_field_index(TOUCHED)
        return kept.set_column(index, TOUCHED, pa.repeat(False, kept.num_rows))

    def _grouped(self, table: pa.Table, by: list[str], dropped: str) -> pa.Table:
        """``table``'s partials merged per ``by``; the columns in the state's order."""
        merges = partial_merges(self.columns)
        grouped = table.group_by(by, use_threads=False).aggregate(merges)
        arrow_names = {f"{name}_{merge}": name for name, merge in merges}  # Arrow's names
        grouped = grouped.rename_columns([arrow_names.get(n, n) for n in grouped.column_names])
        return grouped.select([*self.keys, dropped, *(name for name, _ in merges)])


def partial_merges(columns: Sequence[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """The Arrow aggregations that merge partials (``Partial.columns``) and their marks."""
    return [(name, merge) for name, _, merge in columns] + [(TOUCHED, "any")]


def partial_values(partials: Sequence[Partial], merged: pa.Table) -> dict[str, pa.Array]:
    """Each aggregation's value from its merged partials in ``merged`` (an average: the
    sum over the count, null for no rows)."""
    values = {}
    for partial in partials:
        column = f"__weir_{partial.name}"
        if partial.function != "avg":
            values[partial.name] = merged.column(column)
            continue
        total = pc.cast(merged.column(f"{column}_sum"), pa.float64())
        count = merged.column(f"{column}_n")
        values[partial.name] = pc.if_else(
            pc.equal(count, 0), pa.scalar(None, pa.float64()),
            pc.divide(total, pc.cast(count, pa.float64())))
    return values

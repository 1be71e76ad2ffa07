"""Exact checks of a system's output against the reference answer.

A system's output is first put in the query's canonical columns (``reference.CANONICAL``)
by the runner that read it; here both are compared as multisets of rows: equal, or a
detail of how many rows are missing, unexpected or repeated.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from bench.nexmark.reference import sort_all

__all__ = ["check"]


def _counted(table: pa.Table) -> pa.Table:
    """Each distinct row with how many times it is there (``n``)."""
    return table.group_by(table.column_names).aggregate([([], "count_all")]).rename_columns(
        [*table.column_names, "n"])


def check(got: pa.Table, expected: pa.Table) -> tuple[bool, str]:
    """Whether ``got`` holds exactly the rows of ``expected``, each as many times.

    Both must have the same columns (``got`` is cast to ``expected``'s types).

    >>> t = pa.table({"a": [1, 2, 2]})
    >>> check(t, t)
    (True, '3 rows, exact')
    >>> check(pa.table({"a": [1, 2, 3]}), t)[1]
    'WRONG: 3 rows, 3 expected; 0 distinct rows missing, 1 unexpected, 1 with another count'
    """
    try:
        got = got.select(expected.column_names).cast(expected.schema)
    except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        return False, (f"WRONG: output columns {got.column_names} do not make "
                       f"{expected.column_names}: {exc}")
    if got.num_rows == expected.num_rows and sort_all(got).equals(sort_all(expected)):
        return True, f"{expected.num_rows:,} rows, exact"
    keys = expected.column_names
    mine, theirs = _counted(got), _counted(expected)
    missing = theirs.join(mine, keys, join_type="left anti").num_rows
    extra = mine.join(theirs, keys, join_type="left anti").num_rows
    both = theirs.join(mine, keys, join_type="inner", right_suffix="_got")
    recounted = pc.sum(pc.not_equal(both["n"], both["n_got"])).as_py() or 0 \
        if both.num_rows else 0
    return False, (f"WRONG: {got.num_rows:,} rows, {expected.num_rows:,} expected; "
                   f"{missing:,} distinct rows missing, {extra:,} unexpected, "
                   f"{recounted:,} with another count")


def _milli(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A decimal (Spark's and Flink's ``0.908 * price``) or float as integer thousandths.

    Decimals are scaled exactly (to scale 3, times 1000); a float is rounded, which
    would hide an error below a thousandth, so systems should give decimals.
    """
    if pa.types.is_decimal(column.type):
        exact = column.cast(pa.decimal128(30, 3))
        scaled = pc.multiply(exact, pa.scalar(1000, pa.decimal128(4, 0)))  # scale 3, .000
        return scaled.cast(pa.decimal128(scaled.type.precision, 0)).cast(pa.int64())
    return pc.round(pc.multiply(column.cast(pa.float64()), 1000.0)).cast(pa.int64())


def canonical(query: str, table: pa.Table) -> pa.Table:
    """A system's output (its own column types: timestamps, decimals) in the query's
    canonical columns (``reference.CANONICAL``): times as epoch ms, q1's price in
    thousandths."""
    from bench.nexmark.reference import CANONICAL, epoch_ms

    schema = CANONICAL[query]
    if query == "q4":  # an updating result: each category's last row is its answer
        table = _last_per_key(table, "category", "auctions")
    columns = []
    for name in schema.names:
        if name == "price_milli":
            columns.append(_milli(table["price"]))
        elif name in ("date_time", "window_start", "window_end", "expires", "bid_date_time"):
            columns.append(epoch_ms(table[name]))
        else:
            columns.append(table[name])
    return pa.table(columns, names=schema.names).cast(schema)


def _last_per_key(table: pa.Table, key: str, grows: str) -> pa.Table:
    """The row of each ``key`` with the highest ``grows`` (a count that rises with each
    update): an updating result's final rows."""
    last = table.group_by(key).aggregate([(grows, "max")]).rename_columns([key, grows])
    return table.join(last, [key, grows], join_type="inner")

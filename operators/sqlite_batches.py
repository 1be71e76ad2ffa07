"""Many rows through sqlite3 at once, for the keyed store (``operators.state_store``):
Python's sqlite3 binds and steps once per row of ``executemany``, a cost the store paid
per key of every window."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any

__all__ = ["insert_rows", "sorted_keys"]

_ROWS_PER_INSERT = 2_000  # rows per ``INSERT ... VALUES`` of ``insert_rows`` (at most)


def insert_rows(db: sqlite3.Connection, table: str, width: int,
                 rows: Iterable[Sequence[Any]]) -> None:
    """Inserts ``rows`` (each ``width`` values) into ``table`` (with its columns), many
    rows per statement: measured on 293,000 rows, 0.25-0.30 s where ``executemany`` (a
    bind and a step per row) took 0.51 s."""
    flat = list(chain.from_iterable(rows))
    if len(flat) % width:
        raise ValueError(f"rows of {width} values expected for {table}")
    count = min(_ROWS_PER_INSERT, db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width)
    row = f"({','.join('?' * width)})"
    full = f"INSERT INTO {table} VALUES " + ",".join([row] * count)
    for at in range(0, len(flat), count * width):
        chunk = flat[at:at + count * width]
        sql = full if len(chunk) == count * width else \
            f"INSERT INTO {table} VALUES " + ",".join([row] * (len(chunk) // width))
        db.execute(sql, chunk)


def sorted_keys(keys: Iterable[Any]) -> list[Any]:
    """The keys in order (neighbours in the B-tree read together), or as given if they
    do not compare (keys of several types)."""
    keys = list(keys)
    try:
        return sorted(keys)
    except TypeError:
        return keys

"""``LookupJoin``: each row enriched with a PostgreSQL table's row of its key, cached.

For slowly changing reference data (products, customers) that lives in a database
rather than in a stream. Each window, the keys the window's rows have and the cache does
not hold (or holds for longer than ``cache_ttl_ms`` of the application's clock) are
fetched in one query, ``WHERE key = ANY(...)``; then the rows are joined with the cached
rows in Arrow. The cache is not state: a restarted operator asks again. As with any
lookup join (Flink's too), a replayed window sees the table as it is at the replay.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import pyarrow as pa
import pyarrow.compute as pc

from weir.operators.library.postgres_sql import connect, identifier, psycopg_module
from weir.operators.operator import Operator, OperatorContext
from weir.operators.ports import InputPort, OutputPort, SchemaMismatch
from weir.operators.windows import window_end_millis

__all__ = ["LookupJoin"]

_MISSING = object()  # cached: the table has no row for the key


class LookupJoin(Operator):
    """Joins each input row with the row of ``table`` whose ``table_key`` equals the row's
    ``key``.

    Output: the input's columns, then ``columns`` of the table (a name the input has too
    gets ``table_prefix``), typed as Arrow reads PostgreSQL's values.

    Args:
        dsn: the PostgreSQL connection string.
        table: the table (``name`` or ``schema.name``).
        key: the input's key column.
        columns: the table's columns to add.
        table_key: the table's key column (default: ``key``).
        how: ``"inner"`` (a row without a table row goes to ``unmatched``) or ``"left"``
            (it goes out with nulls).
        cache_ttl_ms: how long a looked-up row (or its absence) is trusted.
        cache_rows: the most rows the cache holds (least recently used go first).

    Example:
        >>> LookupJoin("dbname=shop", "products", key="product", columns=["name"]).how
        'inner'
    """

    input = InputPort()
    output = OutputPort()
    unmatched = OutputPort()

    NON_STATE: ClassVar[tuple[str, ...]] = ("_conn", "_context", "_cache", "_batches",
                                            "_types", "_as_text")
    COLUMNS_READ: ClassVar[tuple[str, ...]] = ("key",)
    METRICS: ClassVar[tuple[str, ...]] = ("lookups", "cache_hits", "unmatched_rows")

    def __init__(self, dsn: str, table: str, key: str, columns: Sequence[str],
                 table_key: str | None = None, how: Literal["inner", "left"] = "inner",
                 table_prefix: str = "table_", cache_ttl_ms: int = 60_000,
                 cache_rows: int = 100_000) -> None:
        if how not in ("inner", "left"):
            raise ValueError(f"LookupJoin: how is 'inner' or 'left', not {how!r}")
        if not columns or isinstance(columns, str):
            raise ValueError("LookupJoin: columns is a non-empty list of the table's columns")
        if cache_ttl_ms < 0 or cache_rows < 1:
            raise ValueError("LookupJoin: cache_ttl_ms must be >= 0 and cache_rows >= 1")
        self.dsn, self.table, self.key = dsn, table, key
        self.columns = list(columns)
        self.table_key = table_key or key
        self.how, self.table_prefix = how, table_prefix
        self.cache_ttl_ms, self.cache_rows = cache_ttl_ms, cache_rows
        self.lookups = self.cache_hits = self.unmatched_rows = 0

    def setup(self, context: OperatorContext) -> None:
        self._context = context
        self._conn = connect(self.dsn, context, "LookupJoin")
        self._cache: collections.OrderedDict[Any, tuple[int, Any]] = collections.OrderedDict()
        self._batches: list[pa.RecordBatch] = []
        self._types = self._column_types()

    def _column_types(self) -> pa.Schema:
        """The looked-up columns' Arrow types, from an empty query (a wrong table or
        column fails here, at setup, with PostgreSQL's message)."""
        sql = psycopg_module().sql
        names = [self.table_key, *self.columns]
        try:
            cursor = self._conn.execute(sql.SQL("SELECT {} FROM {} LIMIT 0").format(
                sql.SQL(", ").join(map(sql.Identifier, names)), identifier(self.table)))
        except psycopg_module().Error as exc:
            raise SchemaMismatch(f"operator {self._context.name!r}: LookupJoin cannot read "
                                 f"{names} of {self.table!r}: {' '.join(str(exc).split())}"
                                 ) from None
        self._as_text = {d.name for d in cursor.description if d.type_code not in _ARROW}
        return pa.schema([(d.name, _ARROW.get(d.type_code, pa.string()))
                          for d in cursor.description])

    def begin_window(self, window_id: int) -> None:
        self._window_id = window_id
        self._batches = []

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        if self.key not in batch.schema.names:
            raise SchemaMismatch(f"operator {self._context.name!r}: no key column "
                                 f"{self.key!r}; its columns are {batch.schema.names}")
        if batch.num_rows:
            self._batches.append(batch)

    def end_window(self) -> None:
        if not self._batches:
            return
        rows, self._batches = pa.Table.from_batches(self._batches), []
        now = window_end_millis(self._window_id, self._context.window_size_millis)
        found = self._rows_for(rows.column(self.key).unique().to_pylist(), now)
        names = [self.table_key, *self.columns]
        table = pa.Table.from_pylist(
            [dict(zip(names, (key, *row), strict=True)) for key, row in found.items()],
            schema=self._types)
        table = table.cast(self._types.set(0, pa.field(self.table_key,
                                                      rows.schema.field(self.key).type)))
        renamed = [n if n == self.table_key else
                   (self.table_prefix + n if n in rows.column_names else n) for n in names]
        table = table.rename_columns(renamed)
        joined = rows.join(table, keys=self.key, right_keys=self.table_key,
                           join_type="left outer" if self.how == "left" else "inner")
        joined = joined.select([*rows.column_names, *renamed[1:]])
        if self.how == "inner":
            matched = pc.is_in(rows.column(self.key), value_set=table.column(self.table_key))
            missed = rows.filter(pc.invert(pc.fill_null(matched, False)))
            if missed.num_rows:
                self.unmatched_rows += missed.num_rows
                self.unmatched.emit(missed)
        if joined.num_rows:
            self.output.emit(joined)

    def _rows_for(self, keys: list[Any], now: int) -> dict[Any, tuple[Any, ...]]:
        """The table's row of each of ``keys`` that has one, from the cache or one query."""
        cache = self._cache
        wanted = [k for k in keys if k is not None and (
            k not in cache or now - cache[k][0] > self.cache_ttl_ms)]
        self.cache_hits += len(keys) - len(wanted)
        if wanted:
            self.lookups += 1
            sql = psycopg_module().sql
            selected = [sql.SQL("CAST({} AS text)").format(sql.Identifier(n))
                        if n in self._as_text else sql.Identifier(n)
                        for n in [self.table_key, *self.columns]]
            fetched = {row[0]: tuple(row[1:]) for row in self._conn.execute(
                sql.SQL("SELECT {} FROM {} WHERE {} = ANY(%s)").format(
                    sql.SQL(", ").join(selected), identifier(self.table),
                    sql.Identifier(self.table_key)), (wanted,))}
            for key in wanted:
                cache[key] = (now, fetched.get(key, _MISSING))
        out = {}
        for key in keys:
            if key in cache:
                cache.move_to_end(key)
                if cache[key][1] is not _MISSING:
                    out[key] = cache[key][1]
        while len(cache) > self.cache_rows:
            cache.popitem(last=False)
        return out

    def teardown(self) -> None:
        conn = self.__dict__.pop("_conn", None)
        if conn is not None:
            conn.close()


# PostgreSQL's type oids -> Arrow (others, numeric say, are read as their text)
_ARROW = {16: pa.bool_(), 20: pa.int64(), 21: pa.int16(), 23: pa.int32(),
          700: pa.float32(), 701: pa.float64(), 25: pa.string(), 1043: pa.string(),
          1082: pa.date32(), 1114: pa.timestamp("us"), 1184: pa.timestamp("us", tz="UTC")}

"""``TableJoin``: a stream enriched from a table that changes (a stream-table join).

The table arrives as a changelog on the ``table`` port: each row is the key's new value
(an upsert), or, with ``delete_column`` true, its removal (a compacted Kafka topic, CDC
from a database, any source of upserts and deletes). A ``KeyedProcess``: each key keeps
its latest table row in the keyed store (on disk, not held in memory, exactly once,
moved by a repartition). Each window, the table's changes apply first, then each
``stream`` row goes out joined with its key's table row as of then; with
``how="left"`` a stream row whose key has no table row goes out with nulls, with
``how="inner"`` to the ``unmatched`` port (never dropped).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import pyarrow as pa

from weir.operators.library.key_state import KeyContext, ValueState
from weir.operators.library.keyed_process import KeyedProcess
from weir.operators.ports import InputPort, OutputPort, SchemaMismatch

__all__ = ["TableJoin"]


class TableJoin(KeyedProcess):
    """Joins each ``stream`` row with the latest ``table`` row of its key.

    Output: the stream row's columns, then the table row's other columns (a name the
    stream has too gets ``table_prefix``).

    Args:
        keys: the stream's key column(s).
        table_keys: the table's (default: the same names).
        how: ``"inner"`` (a stream row without a table row goes to ``unmatched``) or
            ``"left"`` (it goes out with nulls).
        delete_column: a boolean column of the table's rows: true removes the key.
        table_prefix: put before a table column whose name the stream has too.
        ttl_millis: forget a table row no window touched for this long.

    Example:
        >>> TableJoin(keys="product", how="left").how
        'left'
    """

    table = InputPort()
    stream = InputPort()
    unmatched = OutputPort()

    STATE: ClassVar[dict[str, Any]] = {"row": ValueState(None)}
    NON_STATE: ClassVar[tuple[str, ...]] = (*KeyedProcess.NON_STATE, "_rows", "_layout")
    COLUMNS_READ: ClassVar[tuple[str, ...]] = ()
    COLUMNS_READ_BY_PORT: ClassVar[dict[str, tuple[str, ...]]] = {
        "stream": ("keys",), "table": ("table_keys",)}
    METRICS: ClassVar[tuple[str, ...]] = ("unmatched_rows",)

    def __init__(self, keys: str | Sequence[str], table_keys: str | Sequence[str] | None = None,
                 how: Literal["inner", "left"] = "inner", delete_column: str | None = None,
                 table_prefix: str = "table_", ttl_millis: int | None = None) -> None:
        super().__init__(keys, ttl_millis)
        self.table_keys = self.keys if table_keys is None else (
            (table_keys,) if isinstance(table_keys, str) else tuple(table_keys))
        if len(self.table_keys) != len(self.keys):
            raise ValueError(f"TableJoin: table_keys {list(self.table_keys)} must pair with "
                             f"keys {list(self.keys)}, one column each")
        if how not in ("inner", "left"):
            raise ValueError(f"TableJoin: how is 'inner' or 'left', not {how!r}")
        self.how = how
        self.delete_column = delete_column
        self.table_prefix = table_prefix
        self.schemas: dict[str, pa.Schema] = {}
        self.unmatched_rows = 0

    def keys_of(self, port: str) -> tuple[str, ...]:
        return self.table_keys if port == "table" else self.keys

    def _kept(self) -> list[str]:
        """The table's columns that go into the output."""
        return [n for n in self.schemas["table"].names
                if n not in self.table_keys and n != self.delete_column]

    def _table_layout(self) -> tuple[int | None, list[int]]:
        """Where a table row's delete flag is, and which of its values are kept (once:
        the table's schema is fixed by its first rows)."""
        layout = self.__dict__.get("_layout")
        if layout is None:
            names = self.schemas["table"].names
            layout = self._layout = (
                names.index(self.delete_column) if self.delete_column else None,
                [names.index(n) for n in self._kept()])
        return layout

    def output_schema(self) -> pa.Schema:
        if "stream" not in self.schemas or "table" not in self.schemas:
            raise SchemaMismatch("TableJoin: its output columns are known once both the "
                                 "table and the stream have sent rows")
        table = self.schemas["table"]
        stream = self.schemas["stream"]
        return pa.schema([*stream, *(table.field(n).with_name(
            self.table_prefix + n if n in stream.names else n) for n in self._kept())])

    def arrived(self, port: str, rows: pa.Table) -> pa.Table:
        schema = self.schemas.get(port)
        if schema is None:
            if port == "table" and self.delete_column and \
                    self.delete_column not in rows.column_names:
                raise SchemaMismatch(f"TableJoin: delete_column {self.delete_column!r} is "
                                     f"not among the table's columns {rows.column_names}")
            self.schemas[port] = schema = rows.schema
        elif rows.schema != schema:
            rows = rows.select(schema.names).cast(schema)
        return rows

    def process_group(self, key: Any, table: pa.Table, start: int, length: int,
                      ctx: KeyContext) -> None:
        cached = self.__dict__.get("_rows")
        if cached is None or cached[0] is not table:
            names = self.schemas[ctx.port or ""].names
            cached = self._rows = (table, list(zip(*(table.column(n).to_pylist()
                                                     for n in names), strict=True)))
        rows = cached[1][start:start + length]
        if ctx.port == "table":
            self._apply(rows, ctx)
        else:
            self._enrich(rows, table.slice(start, length), ctx)

    def _apply(self, rows: list[tuple[Any, ...]], ctx: KeyContext) -> None:
        """The key's changes, in arrival order: the last one stands."""
        deleted, keep = self._table_layout()
        for row in rows:
            if deleted is not None and row[deleted]:
                ctx.state.row.clear()
            else:
                ctx.state.row.update(tuple(row[i] for i in keep))

    def _enrich(self, rows: list[tuple[Any, ...]], arrow: pa.Table, ctx: KeyContext) -> None:
        found = ctx.state.row.value
        if found is None and self.how == "inner":
            self.unmatched_rows += len(rows)
            self.unmatched.emit(arrow)
            return
        extra = found if found is not None else (None,) * len(self._table_layout()[1])
        for row in rows:
            ctx.emit_values(*row, *extra)

    def end_window(self) -> None:
        super().end_window()
        self._rows = None

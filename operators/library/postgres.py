"""An exactly-once PostgreSQL sink: each window's rows and a watermark in one transaction.

The way Apex's ``JdbcTransactionalStore`` does it. A watermark table keeps, per sink
partition, the id of the last window written. Every window is written in one transaction
that locks that partition's watermark row, skips the window if the watermark already
covers it (it was committed before a crash and is being replayed now), else copies the
rows in and moves the watermark, and commits. Rows and watermark become visible together
or not at all, so a window replayed after a recovery is never written twice, whatever
point the crash came at. The row also keeps the generation of the deployment that moved
it last: a deployment of the same run finding a newer one there was replaced, and its
transaction is refused (``Fenced``), the database's own fencing token.

With ``upsert_keys`` the rows are merged instead of appended (``INSERT ... ON CONFLICT``
through a temporary table), so a result emitted again, updated, replaces its old version:
how event-time windows re-emitted after late rows land.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
import pyarrow.csv as pacsv

from weir.operators.library.postgres_sql import (
    PostgresUnreachableAtStart,
    connect,
    identifier,
    mask_dsn,
    plain_columns,
    postgres_type,
    psycopg_module,
    quoted,
)
from weir.operators.library.sinks import _WindowBuffer
from weir.operators.operator import OperatorContext, TransientNonState
from weir.operators.windows import format_window_id, window_base_seconds
from weir.storage.fence import Fenced

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresSink", "PostgresUnreachableAtStart", "mask_dsn", "postgres_type"]

_LOGGER = logging.getLogger(__name__)

_COPY_CHUNK_ROWS = 65_536
_STAGING = "__weir_upsert_window"  # the temporary table an upsert window is copied into
_ROW = "__weir_row"  # a row's position in its window, in the staging table


class PostgresSink(TransientNonState, _WindowBuffer):
    """Writes each window's rows into a PostgreSQL table, exactly once.

    Use it to keep results in a database that survives any failure of the application
    without duplicates or gaps. Each application window is one transaction: lock this
    partition's row in ``watermark_table``; if it already holds this window id or a later
    one, the window was written before a crash and is skipped; otherwise the rows go in
    with ``COPY`` and the row is set to the window id; commit. Windows without rows write
    nothing. Rows land when their window ends, not when it is committed.

    With ``upsert_keys`` each window keeps only the latest row per key instead of adding
    rows: the rows are copied into a temporary table (dropped at commit, in the same
    transaction as the watermark) with their position in the window, and merged with
    ``INSERT INTO table SELECT DISTINCT ON (keys) ... ORDER BY keys, position DESC ON
    CONFLICT (keys) DO UPDATE SET`` every other column of the window. So a key twice in
    one window keeps the row that arrived last (the order of the window's batches, then
    rows; PostgreSQL's equality decides what is the same key), and a key written by an
    earlier window is overwritten. A created table gets ``PRIMARY KEY (keys)``; an
    existing one needs a primary key or unique index on exactly those columns (ON
    CONFLICT needs it), checked at setup. Use it for results that are emitted again when
    updated, such as ``EventTimeWindows``' with allowed lateness: keys plus
    ``window_start`` and ``window_end``. Columns of the table that the rows lack keep
    their value on update.

    The watermark row's key is ``<table>/<sink_id or the operator name>/<operator id>``,
    so each partition of a sink has its own. Two applications that write one table
    through one database with sinks of the same name share those rows and skip each
    other's windows: give them different ``sink_id``.

    Args:
        dsn: libpq connection string (``"host=db dbname=app user=weir"``) or URI
            (``"postgresql://weir@db/app"``); without ``connect_timeout`` 10 s is used.
        table: target table, optionally schema-qualified (``"reports.counts"``).
        create_table: create the table from the first window's Arrow schema if it is
            missing (columns as in the rows, see ``postgres_type``); else it must exist.
        watermark_table: where the watermarks live (created if missing).
        sink_id: the watermark key's middle part instead of the operator name.
        upsert_keys: columns identifying a row: keep the latest row per key (above)
            instead of appending; None appends.

    Example:
        >>> PostgresSink("host=localhost dbname=app", "counts").table
        'counts'
        >>> PostgresSink("dbname=app", "per_minute",
        ...              upsert_keys=["user", "window_start", "window_end"]).upsert_keys
        ('user', 'window_start', 'window_end')
    """

    SETTINGS: ClassVar[tuple[str, ...]] = ("dsn",)  # the deployment's: never checkpointed
    NON_STATE: ClassVar[tuple[str, ...]] = (*SETTINGS, "_conn", "_context", "_key",
                                            "_table_ready")

    def __init__(self, dsn: str, table: str, create_table: bool = True,
                 watermark_table: str = "weir_sink_watermarks",
                 sink_id: str | None = None,
                 upsert_keys: Sequence[str] | None = None) -> None:
        for label, name in (("table", table), ("watermark_table", watermark_table)):
            if not name or not all(part.strip() for part in name.split(".")) \
                    or name.count(".") > 1:
                raise ValueError(f"PostgresSink {label} {name!r} is not 'name' or "
                                 "'schema.name'")
        self.dsn = dsn
        self.table = table
        self.create_table = create_table
        self.watermark_table = watermark_table
        self.sink_id = sink_id
        self.upsert_keys = _checked_keys(upsert_keys)
        self.windows_written = 0
        self.windows_skipped = 0
        self.rows_written = 0
        self.reset_non_state()

    def reset_non_state(self) -> None:
        self._conn: psycopg.Connection[Any] | None = None
        self._context: OperatorContext | None = None
        self._key = ""
        self._table_ready = False

    def repartition_refusal(self) -> str | None:
        return ("PostgresSink keeps each partition's watermark under its operator id; new "
                "partitions would not know which windows the old ones wrote")

    @property
    def sink_key(self) -> str:
        """This partition's key in the watermark table (known after ``setup``)."""
        return self._key

    # -- lifecycle -------------------------------------------------------------------
    def setup(self, context: OperatorContext) -> None:
        """Connects and makes sure this partition's watermark row exists."""
        psycopg = psycopg_module()
        self._context = context
        self._key = f"{self.table}/{self.sink_id or context.name}/{context.operator_id}"
        self._table_ready = False
        conn = self._conn = connect(self.dsn, context, "PostgresSink")
        sql = psycopg.sql
        watermarks = identifier(self.watermark_table)
        try:
            with conn.transaction():
                self._lock_name(self.watermark_table)
                conn.execute(sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (sink TEXT PRIMARY KEY, window_id BIGINT "
                    "NOT NULL, updated_at TIMESTAMPTZ NOT NULL DEFAULT now())"
                ).format(watermarks))
                conn.execute(sql.SQL(  # the deployment that moved it last (fencing)
                    "ALTER TABLE {} ADD COLUMN IF NOT EXISTS generation BIGINT NOT NULL "
                    "DEFAULT 0").format(watermarks))
                conn.execute(sql.SQL(
                    "INSERT INTO {} (sink, window_id) VALUES (%s, -1) "
                    "ON CONFLICT (sink) DO NOTHING").format(watermarks), (self._key,))
            if self.upsert_keys is not None:  # fail at deploy, not at the first window
                self._check_unique_key(must_exist=False)
        except BaseException:
            self.teardown()  # a failed setup gets no teardown from the runtime
            raise
        _LOGGER.info("PostgresSink %s writes into %s at %s (watermark %s)", context.name,
                     self.table, mask_dsn(self.dsn), self._key)

    def end_window(self) -> None:
        """Writes the window's rows and moves the watermark in one transaction."""
        data = self.window_table()
        if data is None:
            return
        if getattr(self, "_conn", None) is None or self._context is None:
            raise RuntimeError("PostgresSink.end_window before setup()")
        name = self._context.name
        try:
            columns = [postgres_type(f) for f in data.schema]
        except TypeError as exc:
            raise TypeError(f"operator {name!r}: {exc}") from None
        keys = self.upsert_keys
        if keys is not None and (missing := [k for k in keys if k not in data.schema.names]):
            raise ValueError(
                f"operator {name!r}: PostgresSink upsert_keys {missing} are not columns of "
                f"the rows it gets (columns: {data.schema.names}); name columns of the "
                "input in upsert_keys")
        if not self._table_ready:
            self._prepare_table(data.schema, columns)
        sql = psycopg_module().sql
        window_id = self.window_id
        with self._conn.transaction():
            mark = self._conn.execute(sql.SQL(
                "SELECT window_id, generation FROM {} WHERE sink = %s FOR UPDATE"
            ).format(identifier(self.watermark_table)), (self._key,)).fetchone()
            if mark is None:
                raise RuntimeError(f"operator {name!r}: the watermark row {self._key!r} in "
                                   f"{self.watermark_table} is gone; was it deleted by hand?")
            generation = self._context.generation
            same_run = window_base_seconds(mark[0]) == window_base_seconds(window_id)
            if same_run and generation and mark[1] > generation:
                # a newer deployment of this sink moved the watermark: this one was replaced
                raise Fenced(generation, mark[1], f"operator {name!r}")
            if window_id <= mark[0]:
                if window_base_seconds(window_id) != window_base_seconds(mark[0]):
                    _LOGGER.warning(
                        "PostgresSink %s: window %s is at or below watermark %s of another "
                        "application run and is skipped; if another application writes with "
                        "key %r, give the sinks different sink_id", name,
                        format_window_id(window_id), format_window_id(mark[0]), self._key)
                _LOGGER.debug("PostgresSink %s: window %s is at or below the watermark %s: "
                              "written before, skipped", name, format_window_id(window_id),
                              format_window_id(mark[0]))
                self.windows_skipped += 1
                return
            if keys is None:
                self._copy(data, identifier(self.table))
            rows = data.num_rows if keys is None else self._upsert(data, keys)
            self._conn.execute(sql.SQL(
                "UPDATE {} SET window_id = %s, generation = %s, updated_at = now() "
                "WHERE sink = %s"
            ).format(identifier(self.watermark_table)), (window_id, generation, self._key))
            self._context.crash_point("postgres.before_commit")
        self.windows_written += 1
        self.rows_written += rows
        _LOGGER.debug("PostgresSink %s: window %s, %d rows into %s", name,
                      format_window_id(window_id), rows, self.table)

    def teardown(self) -> None:
        conn = getattr(self, "_conn", None)
        if conn is not None:
            conn.close()
            self._conn = None

    # -- helpers ---------------------------------------------------------------------
    def _lock_name(self, name: str) -> None:
        """Serialises creating ``name`` among partitions (CREATE IF NOT EXISTS can race)."""
        assert self._conn is not None
        self._conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"weir:{name}",))

    def _prepare_table(self, schema: pa.Schema, types: list[str]) -> None:
        """Creates the table from the schema, or checks that it exists."""
        assert self._conn is not None and self._context is not None
        sql = psycopg_module().sql
        with self._conn.transaction():
            if self.create_table:
                self._lock_name(self.table)
                columns = [sql.SQL("{} {}").format(sql.Identifier(f.name), sql.SQL(t))
                           for f, t in zip(schema, types, strict=True)]
                if self.upsert_keys is not None:
                    columns.append(sql.SQL("PRIMARY KEY ({})").format(
                        sql.SQL(", ").join(map(sql.Identifier, self.upsert_keys))))
                self._conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                    identifier(self.table), sql.SQL(", ").join(columns)))
            else:
                found = self._conn.execute("SELECT to_regclass(%s)",
                                           (quoted(self.table),)).fetchone()
                if found is None or found[0] is None:
                    raise RuntimeError(
                        f"operator {self._context.name!r}: table {self.table!r} does not exist; "
                        "create it or build the PostgresSink with create_table=True")
            if self.upsert_keys is not None:  # a table found, not made, may lack the key
                self._check_unique_key(must_exist=True)
        self._table_ready = True

    def _check_unique_key(self, must_exist: bool) -> None:
        """Refuses a table without a primary key or unique index on exactly the keys.

        ``ON CONFLICT (keys)`` needs one to merge on: immediate, valid, without a
        predicate or expressions; more columns would make it another key.
        """
        assert self._conn is not None and self._context is not None
        assert self.upsert_keys is not None
        psycopg = psycopg_module()
        found = self._conn.execute("SELECT to_regclass(%s)::oid", (quoted(self.table),)
                                   ).fetchone()
        if found is None or found[0] is None:
            if must_exist:
                raise RuntimeError(f"operator {self._context.name!r}: table {self.table!r} "
                                   "is gone")
            return  # created from the first window, with the primary key
        names = dict(self._conn.execute(
            "SELECT attnum, attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 "
            "AND NOT attisdropped", (found[0],)).fetchall())
        unique = [sorted(names[n] for n in indkey[:key_count]) for indkey, key_count in
                  self._conn.execute(
                      "SELECT indkey::int2[], indnkeyatts FROM pg_index WHERE indrelid = %s "
                      "AND indisunique AND indimmediate AND indisvalid AND indpred IS NULL "
                      "AND indexprs IS NULL", (found[0],)).fetchall()]
        if sorted(self.upsert_keys) in unique:
            return
        sql = psycopg.sql
        fix = sql.SQL("ALTER TABLE {} ADD PRIMARY KEY ({})").format(
            identifier(self.table),
            sql.SQL(", ").join(map(sql.Identifier, self.upsert_keys))).as_string(self._conn)
        there = ("its unique keys are " + ", ".join(f"({', '.join(u)})" for u in unique)
                 if unique else "it has no primary key or unique index")
        raise RuntimeError(
            f"operator {self._context.name!r}: PostgresSink upsert_keys "
            f"{list(self.upsert_keys)} need a primary key or unique index on exactly those "
            f"columns of table {self.table!r} (INSERT ... ON CONFLICT needs one), but "
            f"{there}; add it with: {fix}")

    def _upsert(self, data: pa.Table, keys: tuple[str, ...]) -> int:
        """Merges the window's rows into the table, the last row per key winning.

        Returns:
            The rows inserted or updated (one per distinct key).
        """
        assert self._conn is not None
        sql = psycopg_module().sql
        column_list = sql.SQL(", ").join(map(sql.Identifier, data.column_names))
        key_list = sql.SQL(", ").join(map(sql.Identifier, keys))
        staging, row = sql.Identifier(_STAGING), sql.Identifier(_ROW)
        # the table's own column types, so values parse exactly as a direct COPY's would
        self._conn.execute(sql.SQL(
            "CREATE TEMPORARY TABLE {} ON COMMIT DROP AS SELECT {}, 0::BIGINT AS {} FROM {} "
            "WITH NO DATA").format(staging, column_list, row, identifier(self.table)))
        self._copy(data.append_column(_ROW, pa.array(range(data.num_rows), pa.int64())),
                   staging)
        others = [c for c in data.column_names if c not in keys]
        action = sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
            sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in others)) \
            if others else sql.SQL("DO NOTHING")
        merged = self._conn.execute(sql.SQL(
            "INSERT INTO {} ({}) SELECT DISTINCT ON ({}) {} FROM {} ORDER BY {}, {} DESC "
            "ON CONFLICT ({}) {}").format(
                identifier(self.table), column_list, key_list, column_list, staging,
                key_list, row, key_list, action))
        return max(merged.rowcount, 0)

    def _copy(self, data: pa.Table, target: Any) -> None:
        """Streams the rows in with ``COPY ... (FORMAT csv)``, encoded by Arrow's CSV writer.

        Arrow quotes every string and leaves nulls empty, which is what PostgreSQL's CSV
        format reads as text and NULL; the encoding runs in C++, not per row in Python.
        """
        assert self._conn is not None
        sql = psycopg_module().sql
        data = plain_columns(data)
        statement = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv)").format(
            target,
            sql.SQL(", ").join(sql.Identifier(n) for n in data.column_names))
        options = pacsv.WriteOptions(include_header=False, quoting_style="needed")
        with self._conn.cursor() as cursor, cursor.copy(statement) as copy:
            for batch in data.to_batches(max_chunksize=_COPY_CHUNK_ROWS):
                chunk = io.BytesIO()
                pacsv.write_csv(batch, chunk, options)
                copy.write(chunk.getbuffer())


def _checked_keys(keys: Sequence[str] | None) -> tuple[str, ...] | None:
    """``upsert_keys`` as a tuple; ValueError for anything but distinct column names."""
    if keys is None:
        return None
    if isinstance(keys, str | bytes) or not isinstance(keys, Sequence):
        hint = f" (write [{keys!r}])" if isinstance(keys, str) else ""
        raise ValueError(f"PostgresSink upsert_keys must be a list of column names, not "
                         f"{keys!r}{hint}")
    if not keys:
        raise ValueError("PostgresSink upsert_keys is empty: name the columns that identify "
                         "a row, or pass None to append rows")
    bad = [k for k in keys if not isinstance(k, str) or not k]
    if bad:
        raise ValueError(f"PostgresSink upsert_keys must be non-empty column names (strings); "
                         f"got {bad!r} in {list(keys)!r}")
    twice = sorted({k for k in keys if list(keys).count(k) > 1})
    if twice:
        raise ValueError(f"PostgresSink upsert_keys names {twice} more than once: "
                         f"{list(keys)!r}")
    return tuple(keys)

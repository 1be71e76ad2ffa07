"""A replayable source over Parquet, Arrow IPC, JSON-lines or CSV files, in a folder or any
``pyarrow.fs`` filesystem: columnar input reaches the DAG as the record batches it is
stored in; text files are parsed by Arrow's readers, a file at a time."""

from __future__ import annotations

import bisect
import fnmatch
import os
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.ipc as ipc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from weir.operators.library.file_ranges import FileRangeSource
from weir.operators.operator import OperatorContext
from weir.operators.ports import OutputPort

__all__ = ["CsvSource", "JsonLinesSource", "ParquetSource"]

_SCAN_S = 0.1  # a watched folder found empty is listed again after this long at most
_FORMATS = ("parquet", "arrow", "jsonl", "csv")
_TEXT_CHUNK_ROWS = 65_536  # a parsed text file's rows per chunk (its replay unit)


class _FileChunks:
    """A file as numbered chunks with row counts (Parquet row groups, IPC record batches):
    what lets a replayed window read rows ``start..end`` without reading the file from the
    top. The newest chunk is cached, so reading a chunk in several slices reads it once."""

    def __init__(self, fs: pafs.FileSystem, path: str, fmt: str,
                 columns: list[str] | None, schema: pa.Schema | None = None) -> None:
        self.path = path
        self._handle = fs.open_input_file(path)
        self._columns = columns
        self._text: pa.Table | None = None  # a parsed JSON-lines or CSV file
        try:
            if fmt in ("jsonl", "csv"):
                self._parquet, self._ipc = None, None
                self._text = _parse_text(self._handle, fmt, schema)
                schema = self._text.schema
                self.count = -(-self._text.num_rows // _TEXT_CHUNK_ROWS)
            elif fmt == "parquet":
                self._parquet: pq.ParquetFile | None = pq.ParquetFile(self._handle)
                self._ipc: ipc.RecordBatchFileReader | None = None
                schema = self._parquet.schema_arrow
                self.count = self._parquet.metadata.num_row_groups
            else:
                self._parquet, self._ipc = None, ipc.open_file(self._handle)
                schema = self._ipc.schema
                self.count = self._ipc.num_record_batches
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
            self._handle.close()
            raise ValueError(f"ParquetSource: {path} is not a readable {fmt} file ({exc}); "
                             f"check format= or remove the file") from exc
        missing = [c for c in columns or () if c not in schema.names]
        if missing:
            self._handle.close()
            raise ValueError(f"ParquetSource: {path} has no column(s) {missing} (it has "
                             f"{schema.names}); fix columns= or the file")
        self.schema = pa.schema([schema.field(c) for c in columns]) if columns else schema
        self._starts = [0]  # the first row of chunks 0..len-1, learnt in order
        self._cached: tuple[int, pa.Table] | None = None

    def chunk(self, index: int) -> pa.Table:
        """Chunk ``index``'s rows (the selected columns)."""
        if self._text is not None:
            table = self._text.slice(index * _TEXT_CHUNK_ROWS, _TEXT_CHUNK_ROWS)
            return table.select(self._columns) if self._columns else table
        if self._cached is None or self._cached[0] != index:
            if self._parquet is not None:
                table = self._parquet.read_row_group(index, columns=self._columns)
            else:
                assert self._ipc is not None
                batch = self._ipc.get_batch(index)
                table = pa.Table.from_batches(
                    [batch.select(self._columns) if self._columns else batch])
            self._cached = (index, table)
        return self._cached[1]

    def rows(self, index: int) -> int:
        if self._text is not None:
            return min(_TEXT_CHUNK_ROWS, self._text.num_rows - index * _TEXT_CHUNK_ROWS)
        if self._parquet is not None:
            return self._parquet.metadata.row_group(index).num_rows
        return self.chunk(index).num_rows  # IPC: the footer has no row counts

    def locate(self, row: int) -> tuple[int, int]:
        """(chunk, row in it) of file row ``row``; ``(count, 0)`` at or past the end."""
        while len(self._starts) <= self.count and self._starts[-1] <= row:
            self._starts.append(self._starts[-1] + self.rows(len(self._starts) - 1))
        index = bisect.bisect_right(self._starts, row) - 1  # skips empty chunks
        if index >= self.count:
            return self.count, 0
        return index, row - self._starts[index]

    def close(self) -> None:
        self._handle.close()


class ParquetSource(FileRangeSource):
    """Emits the rows of the Parquet (or Arrow IPC, JSON-lines, CSV) files in a folder,
    file by file in name order, as record batches with the files' schema.

    Use it for input that is already columnar: a folder filled by another job, a data
    lake prefix (any ``pyarrow.fs`` URI: ``file://``, ``s3://``, ``hdfs://``, ``gs://``).
    Nothing is parsed: a Parquet row group or an IPC record batch is sliced into batches
    as it is. The read position (the files read, the current file and a row offset in it)
    is checkpointed and each window's row ranges are logged, so a recovered source
    re-reads exactly the same windows (random access by row group / record batch): with
    an exactly-once sink, every row is counted once whatever fails. A file must be
    complete when it appears (write it under a name starting with ``.`` or ending in
    ``.tmp`` and rename it) and must not change afterwards; names must not be reused.
    All files must have the same schema (after selecting ``columns``). With
    ``PARTITIONS=N`` each partition reads the files whose name hashes to it.

    The output port has no declared schema (a port's schema is fixed by its class):
    it is taken from the first batch; ``schema`` holds the files' schema once read.

    Args:
        path: a folder, a single file, or a ``pyarrow.fs`` URI of either (local paths are
            made absolute when the operator is built).
        format: ``"parquet"``, ``"arrow"`` (the Arrow IPC file format, Feather v2),
            ``"jsonl"`` (one JSON object per line) or ``"csv"`` (a header line, then rows).
        file_schema: a text file's columns and types (JSON-lines, CSV): they are
            inferred from each file otherwise, so a column that is all null in one file,
            or all integers in one and decimals in the next, would differ between files.
            Timestamps parse from ISO-8601 text; JSON fields not in it are not read. Not
            for Parquet or Arrow files.
        pattern: a glob on file names in the folder, e.g. ``"*.parquet"``.
        columns: the columns to read (None = all), in this order.
        rows_per_window: emit at most about this many rows per streaming window (None =
            as fast as possible): how a window's size is bounded.
        batch_rows: rows per emitted batch at most.
        watch: keep looking for new files forever; False = end the stream once every
            file has been read (a bounded source: the application finishes).

    Example:
        >>> src = ParquetSource("events/", columns=["user", "amount"], rows_per_window=100_000)
        >>> src.columns, src.format
        (['user', 'amount'], 'parquet')
    """

    output = OutputPort()
    SPLITS_INPUT = True
    METRICS: ClassVar[tuple[str, ...]] = ("rows_read", "files_read")

    NON_STATE: ClassVar[tuple[str, ...]] = (*FileRangeSource.NON_STATE, "_fs", "_prefix",
                                            "_single", "_file", "_pending")

    def __init__(self, path: str | os.PathLike[str],
                 format: Literal["parquet", "arrow", "jsonl", "csv"] = "parquet",
                 pattern: str = "*", columns: Sequence[str] | None = None,
                 rows_per_window: int | None = None, batch_rows: int = 65_536,
                 watch: bool = False, file_schema: pa.Schema | None = None) -> None:
        if format not in _FORMATS:
            raise ValueError(f"format must be one of {_FORMATS}, not {format!r}")
        if file_schema is not None and format not in ("jsonl", "csv"):
            raise ValueError(f"file_schema= is for JSON-lines and CSV files; {format} files "
                             "carry their own schema (use columns= to pick columns)")
        if rows_per_window is not None and rows_per_window <= 0:
            raise ValueError(f"rows_per_window must be positive or None, not {rows_per_window}")
        if batch_rows <= 0:
            raise ValueError(f"batch_rows must be positive, not {batch_rows}")
        if columns is not None and (isinstance(columns, str) or not columns):
            raise ValueError(f"columns must be a non-empty list of names or None, not "
                             f"{columns!r}")
        path = os.fspath(path)
        self.path = path if "://" in path else os.path.abspath(path)
        self.format = format
        self.file_schema = file_schema
        self.pattern = pattern
        self.columns = list(columns) if columns is not None else None
        self.rows_per_window = rows_per_window
        self.batch_rows = batch_rows
        self._init_position(watch)  # ``offset``: the next row of ``current``
        self.schema: pa.Schema | None = None  # the files' schema, from the first one read
        self.rows_read = 0
        self.files_read = 0
        self.reset_non_state()

    def reset_non_state(self) -> None:
        super().reset_non_state()
        self._fs: pafs.FileSystem | None = None
        self._prefix = ""  # the folder (of the single file) in ``_fs``, with its "/"
        self._single: str | None = None  # the file's name when ``path`` is one file
        self._file: _FileChunks | None = None
        self._pending: list[str] = []  # listed, not read yet, in name order

    # -- runtime hooks -------------------------------------------------------------
    def setup(self, context: OperatorContext) -> None:
        self.reset_non_state()
        self._fs, self._prefix, self._single = self._open_path(context.name)
        self.partition = (context.partition_index, context.partition_count)
        super().setup(context)

    def emitted_schema(self) -> pa.Schema | None:
        """The columns it will emit, known before it runs: ``file_schema``, or the first
        local Parquet or Arrow file's footer. None for a folder without files yet, text
        files without ``file_schema`` (inferred as they are read) and remote URIs (the
        submitting machine may lack the containers' credentials, and a submit must not
        wait on a store)."""
        schema = self.file_schema
        local = "://" not in self.path or self.path.startswith("file://")
        if schema is None and self.format in ("parquet", "arrow") and local:
            fs, prefix, single = self._open_path("ParquetSource")
            files = self._list_files(fs, prefix, single)
            if not files:
                return None
            with fs.open_input_file(prefix + files[0]) as handle:
                schema = (pq.read_schema(handle) if self.format == "parquet"
                          else ipc.open_file(handle).schema)
        if schema is not None and self.columns:
            schema = pa.schema([schema.field(c) for c in self.columns if c in schema.names])
        return schema

    # -- FileRangeSource: rows of the files -------------------------------------------
    def read_step(self) -> int:
        return self.batch_rows

    def window_limit(self) -> int | None:
        return self.rows_per_window

    def _finished(self, name: str) -> None:
        self.files_read += 1

    def _read_more(self, want: int) -> None:
        assert self.current is not None
        chunks = self._chunks(self.current)
        index, skip = chunks.locate(self.offset)
        if index == chunks.count:
            self._record(self.current, self.offset, self.offset, finished=True)
            return
        rows = chunks.chunk(index).slice(skip, want)  # never past this chunk
        self._emit(rows)
        end = self.offset + rows.num_rows
        last = index == chunks.count - 1 and skip + rows.num_rows == chunks.rows(index)
        self._record(self.current, self.offset, end, finished=last)

    # -- reading ---------------------------------------------------------------------
    def _open_path(self, name: str) -> tuple[pafs.FileSystem, str, str | None]:
        """(filesystem, folder with its "/", single file name or None) of ``path``."""
        try:
            if "://" in self.path:
                fs, where = pafs.FileSystem.from_uri(self.path)
            else:
                fs, where = pafs.LocalFileSystem(), self.path
            where = where.rstrip("/") or where  # "/" stays "/"
            info = fs.get_file_info(where)
        except (pa.ArrowInvalid, OSError) as exc:
            raise FileNotFoundError(f"operator {name!r}: ParquetSource cannot open "
                                    f"{self.path!r}: {exc}; fix the path or URI") from exc
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"operator {name!r}: ParquetSource path {self.path!r} "
                                    "does not exist; create the folder or fix the path")
        if info.type == pafs.FileType.File:
            cut = where.rfind("/") + 1
            return fs, where[:cut], where[cut:]
        return fs, where.rstrip("/") + "/", None

    def _next_file(self) -> str | None:
        done = set(self.done)
        self._pending = [n for n in self._pending if n not in done]
        if not self._pending:
            if time.monotonic() < self._next_scan:
                return None  # listed a moment ago: do not list it in a busy loop
            self._pending = [n for n in self._list() if n not in done]
            if not self._pending:
                self._next_scan = time.monotonic() + _SCAN_S
                return None
        return self._pending.pop(0)

    def _list(self) -> list[str]:
        """The names of the input files of this partition, in name order."""
        assert self._fs is not None
        return self._list_files(self._fs, self._prefix, self._single)

    def _list_files(self, fs: pafs.FileSystem, prefix: str, single: str | None) -> list[str]:
        if single is not None:
            return [single]
        infos = fs.get_file_info(pafs.FileSelector(prefix.rstrip("/") or "/"))
        return sorted(i.base_name for i in infos
                      if i.type == pafs.FileType.File and fnmatch.fnmatch(i.base_name, self.pattern)
                      and not i.base_name.startswith(".") and not i.base_name.endswith(".tmp")
                      and self._mine(i.base_name))

    def _chunks(self, name: str) -> _FileChunks:
        """The open file ``name``, its schema checked against the files before it."""
        if self._file is not None and self._file.path == self._file_path(name):
            return self._file
        self._close()
        assert self._fs is not None
        path = self._file_path(name)
        try:
            chunks = _FileChunks(self._fs, path, self.format, self.columns, self.file_schema)
        except FileNotFoundError:
            raise FileNotFoundError(f"ParquetSource: {path} disappeared; input files must "
                                    "stay in place until the application is done") from None
        if chunks.count == 0 and self.format in ("jsonl", "csv"):
            pass  # a text file without rows has no types to hold the others to
        elif self.schema is None:
            self.schema = chunks.schema
        elif not chunks.schema.equals(self.schema):
            chunks.close()
            raise ValueError(f"ParquetSource: {path} has another schema than the files read "
                             f"before it: {_difference(self.schema, chunks.schema)}; every "
                             "file must have the same schema (rewrite the file, move it "
                             "elsewhere, or read common columns with columns=[...])")
        self._file = chunks
        return chunks

    def _file_path(self, name: str) -> str:
        return self._prefix + name

    def _read_range(self, name: str, start: int, end: int, finished: bool) -> None:
        """Reads rows ``start..end`` of ``name`` again (a replayed window), exactly."""
        chunks = self._chunks(name)
        row = start
        while row < end:
            index, skip = chunks.locate(row)
            if index == chunks.count:
                raise RuntimeError(
                    f"ParquetSource: {self._file_path(name)} has {row} rows, fewer than when "
                    f"the window was first read (rows {start}..{end}); input files must not "
                    "change once they are in the folder")
            rows = chunks.chunk(index).slice(skip, end - row)
            self._emit(rows)
            row += rows.num_rows
        self.current, self.offset = name, start
        self._record(name, start, end, finished)

    def _emit(self, rows: pa.Table) -> None:
        for batch in rows.to_batches(max_chunksize=self.batch_rows):
            if batch.num_rows:
                self.output.emit(batch)
        self.rows_read += rows.num_rows
        self._window_units += rows.num_rows

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _parse_text(handle: pa.NativeFile, fmt: str, schema: pa.Schema | None) -> pa.Table:
    """A JSON-lines or CSV file as a table, with ``schema``'s types where given."""
    if handle.size() == 0:  # Arrow's readers refuse an empty file: no rows, no columns
        return schema.empty_table() if schema is not None else pa.table({})
    if fmt == "jsonl":
        options = pajson.ParseOptions(explicit_schema=schema,
                                      unexpected_field_behavior="ignore" if schema else "infer")
        return pajson.read_json(handle, parse_options=options)
    convert = pacsv.ConvertOptions(column_types=schema) if schema is not None else None
    table = pacsv.read_csv(handle, convert_options=convert)
    if schema is None:
        return table
    missing = [name for name in schema.names if name not in table.column_names]
    if missing:
        raise pa.ArrowInvalid(f"no column(s) {missing} in its header {table.column_names}")
    return table.select(schema.names).cast(schema)


def _difference(expected: pa.Schema, found: pa.Schema) -> str:
    """What differs between two schemas, column by column.

    >>> _difference(pa.schema([("a", pa.int64()), ("b", pa.string())]),
    ...             pa.schema([("a", pa.int32()), ("c", pa.string())]))
    'a: int64 there, int32 here; b missing here; c: new here'
    """
    theirs = {f.name: f.type for f in found}
    ours = {f.name: f.type for f in expected}
    parts = [f"{n}: {t} there, {theirs[n]} here" for n, t in ours.items()
             if n in theirs and theirs[n] != t]
    parts += [f"{n} missing here" for n in ours if n not in theirs]
    parts += [f"{n}: new here" for n in theirs if n not in ours]
    if not parts and expected.names != found.names:
        parts.append(f"columns in another order ({found.names} instead of {expected.names})")
    return "; ".join(parts) or f"({found}) instead of ({expected})"


class JsonLinesSource(ParquetSource):
    """``ParquetSource(path, format="jsonl", ...)``: a folder of JSON-lines files (one
    object per line), replayable like every file source. Give ``file_schema`` to fix the
    columns and their types (ISO-8601 text becomes timestamps, so a column can be the
    ``EVENT_TIME_COLUMN``); without it each file's types are inferred.

    Example:
        >>> JsonLinesSource("events/", pattern="*.jsonl").format
        'jsonl'
    """

    def __init__(self, path: str | os.PathLike[str], *, file_schema: pa.Schema | None = None,
                 **options: Any) -> None:
        super().__init__(path, format="jsonl", file_schema=file_schema, **options)


class CsvSource(ParquetSource):
    """``ParquetSource(path, format="csv", ...)``: a folder of CSV files with a header
    line; ``file_schema`` fixes the columns' types (see ``JsonLinesSource``).

    Example:
        >>> CsvSource("rows/").format
        'csv'
    """

    def __init__(self, path: str | os.PathLike[str], *, file_schema: pa.Schema | None = None,
                 **options: Any) -> None:
        super().__init__(path, format="csv", file_schema=file_schema, **options)

"""Ready-made sinks: print each window's rows to the console, or write them to files."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from weir.operators.library.parquet_dictionary import dictionary_columns
from weir.operators.operator import Operator, OperatorContext
from weir.operators.ports import InputPort
from weir.operators.windows import (
    format_window_id,
    make_window_id,
    window_base_seconds,
    window_counter,
)
from weir.storage import AdvanceWatermark, CommitStep, CommitStepStore, PublishFile
from weir.storage.records import sync_folder

__all__ = ["ConsoleSink", "FileSink"]

_LOGGER = logging.getLogger(__name__)


class _WindowBuffer(Operator):
    """Collects an application window's batches; ``window_table()`` hands them over."""

    input = InputPort()

    def begin_window(self, window_id: int) -> None:
        self._window_id = window_id
        self._batches: list[pa.RecordBatch] = []

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        self.__dict__.setdefault("_batches", []).append(batch)

    def window_table(self) -> pa.Table | None:
        """The window's rows (None if there were none); empties the buffer."""
        batches = [b for b in self.__dict__.get("_batches", []) if b.num_rows]
        self._batches = []
        if not batches:
            return None
        schema = batches[0].schema
        if all(b.schema.equals(schema) for b in batches):
            return pa.Table.from_batches(batches, schema=schema)
        return pa.concat_tables([pa.Table.from_batches([b]) for b in batches],
                                promote_options="permissive")

    @property
    def window_id(self) -> int:
        return int(self.__dict__.get("_window_id", -1))


class ConsoleSink(_WindowBuffer):
    """Prints each window's rows as a small table on stdout.

    Use it to watch a DAG run. Prints the first ``limit`` rows of every window with rows
    (after sorting by ``sort_by``, if given). With ``summarize=(key, value)`` it also sums
    ``value`` per ``key`` over all windows (memory: one row per key) and prints the top
    ``limit`` totals at teardown.

    Args:
        limit: rows printed per window (and totals at the end).
        sort_by: column to sort each window's rows by before taking ``limit``.
        descending: sort order for ``sort_by`` and for the totals.
        title: printed in each window's header, e.g. the operator's role.
        summarize: ``(key column, value column)`` to total over the run.

    Example:
        >>> sink = ConsoleSink(limit=5, sort_by="count", summarize=("word", "count"))
    """

    def __init__(self, limit: int = 10, sort_by: str | None = None, descending: bool = True,
                 title: str | None = None, summarize: tuple[str, str] | None = None) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, not {limit}")
        if summarize is not None and len(summarize) != 2:
            raise ValueError("summarize is a (key column, value column) pair")
        self.limit = limit
        self.sort_by = sort_by
        self.descending = descending
        self.title = title
        self.summarize = tuple(summarize) if summarize is not None else None
        self.totals: pa.Table | None = None
        self.rows_seen = 0

    def setup(self, context: OperatorContext) -> None:
        if self.title is None:
            self.title = context.name

    def end_window(self) -> None:
        table = self.window_table()
        if table is None:
            return
        self.rows_seen += table.num_rows
        if self.summarize is not None:
            self._add_totals(table)
        shown = table
        if self.sort_by is not None:
            shown = shown.sort_by([(self.sort_by, self._order)])
        shown = shown.slice(0, self.limit)
        header = f"window {format_window_id(_rows_window(table, self.window_id))}"
        if self.title:
            header = f"{self.title} | {header}"
        more = f", first {shown.num_rows}" if shown.num_rows < table.num_rows else ""
        print(f"-- {header} -- {table.num_rows} rows{more}\n{_format(shown)}", flush=True)

    def teardown(self) -> None:
        if self.summarize is None or self.totals is None:
            return
        key, value = self.summarize
        top = self.totals.sort_by([(value, self._order)]).slice(0, self.limit)
        title = f"{self.title} | " if self.title else ""
        print(f"== {title}total {value} per {key} over {self.rows_seen} rows, top "
              f"{top.num_rows} of {self.totals.num_rows} ==\n{_format(top)}", flush=True)

    @property
    def _order(self) -> str:
        return "descending" if self.descending else "ascending"

    def _add_totals(self, table: pa.Table) -> None:
        key, value = self.summarize  # type: ignore[misc]
        for column in (key, value):
            if column not in table.column_names:
                raise KeyError(f"ConsoleSink summarize: the rows have no column {column!r}; "
                               f"their columns are {table.column_names}")
        part = table.select([key, value])
        if self.totals is not None:
            part = pa.concat_tables([self.totals, part.cast(self.totals.schema)])
        summed = part.group_by(key).aggregate([(value, "sum")])
        self.totals = summed.rename_columns([value if n == f"{value}_sum" else n
                                             for n in summed.column_names])


def _rows_window(table: pa.Table, default: int) -> int:
    """The window the rows say they belong to (a ``window_id`` column with one value, as
    upstream application windows write it), else the window they arrived in."""
    if "window_id" not in table.column_names:
        return default
    ids = pc.unique(table.column("window_id"))
    return int(ids[0].as_py()) if len(ids) == 1 and ids[0].is_valid else default


def _format(table: pa.Table) -> str:
    """A plain text table: a header, a rule and one line per row, numbers right-aligned."""
    names = table.column_names
    columns = [[format_window_id(v) if n == "window_id" and isinstance(v, int) else _cell(v)
                for v in table.column(n).to_pylist()] for n in names]
    numeric = [n != "window_id" and (pa.types.is_integer(t) or pa.types.is_floating(t)
                                     or pa.types.is_decimal(t))
               for n, t in zip(names, table.schema.types, strict=True)]
    widths = [max([len(n), *map(len, col)]) for n, col in zip(names, columns, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(cells, widths, numeric, strict=True)).rstrip()

    out = [line(names), line(["-" * w for w in widths])]
    out += [line([col[i] for col in columns]) for i in range(table.num_rows)]
    return "\n".join(out)


def _cell(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


class FileSink(_WindowBuffer):
    """Writes each window's rows to one file in a folder: JSON lines or Parquet.

    Use it to keep results. The file of window ``w`` is
    ``window-<base seconds>-<counter>.<jsonl|parquet>`` (see ``operators.windows``),
    written under a temporary name, synced and renamed, so readers never see a partial
    file. Windows without rows write nothing.

    By default a window's file appears as soon as the window ends, and a window
    replayed after a failure replaces its file (at least once, idempotent when the
    window is replayed identically). With ``exactly_once=True`` (Gobblin's commit
    steps) a window's file is staged in ``<path>/.staging`` and published only when the
    window is committed: the sink records the steps (publish each staged file, advance
    its high watermark) in its commit-step store, then runs them; a sink that starts
    after a crash finishes a recorded commit before taking new data, and skips windows
    at or below its watermark. Readers then only ever see output that will never be
    taken back, one checkpoint interval later. Needs a local ``STATE_DIR`` and the
    output folder on one filesystem with its staging folder (it is: it is inside it).

    Args:
        path: the folder (created if missing; made absolute when the operator is built).
        format: ``"jsonl"`` (one JSON object per row) or ``"parquet"``.
        exactly_once: stage, then publish at commit (see above).

    Example:
        >>> FileSink("/tmp/counts", format="parquet", exactly_once=True).format
        'parquet'
    """

    FORMATS: ClassVar[tuple[str, ...]] = ("jsonl", "parquet")
    NON_STATE: ClassVar[tuple[str, ...]] = ("_store", "_staged", "_fence")
    #: running totals: files written and the ms spent writing them (synced and renamed)
    METRICS: ClassVar[tuple[str, ...]] = ("files_written", "write_ms")

    def __init__(self, path: str | os.PathLike[str], format: str = "jsonl",  # noqa: A002
                 exactly_once: bool = False) -> None:
        if format not in self.FORMATS:
            raise ValueError(f"FileSink format {format!r} is not one of {self.FORMATS}")
        self.path = os.path.abspath(os.fspath(path))
        self.format = format
        self.exactly_once = exactly_once
        self.files_written = 0
        self.write_ms = 0.0
        self._store: CommitStepStore | None = None
        self._staged: dict[int, str] = {}  # window id -> staged file, not yet published
        self._fence: Callable[[], None] | None = None

    @property
    def staging(self) -> str:
        return os.path.join(self.path, ".staging")

    def setup(self, context: OperatorContext) -> None:
        try:
            os.makedirs(self.staging if self.exactly_once else self.path, exist_ok=True)
        except OSError as exc:
            raise OSError(f"operator {context.name!r}: FileSink cannot create folder "
                          f"{self.path!r}: {exc}") from None
        self._fence = context.check_fence
        if self.exactly_once:
            self._store = CommitStepStore(context.durable_dir("commit-steps"),
                                          context.crash_point, guard=context.check_fence)
            self._store.recover()  # a commit a crash interrupted is finished first
            self._staged = self._adopt_staged(context.recovered_window)

    def repartition_refusal(self) -> str | None:
        if self.exactly_once:
            return ("FileSink(exactly_once=True) keeps its commit steps under each "
                    "partition's own id; they cannot move to new partitions")
        return None

    def file_name(self, window_id: int) -> str:
        """The file name of a window's rows."""
        return (f"window-{window_base_seconds(window_id)}-{window_counter(window_id):010d}"
                f".{self.format}")

    def end_window(self) -> None:
        table = self.window_table()
        if table is None:
            return
        if self._store is None:
            final = os.path.join(self.path, self.file_name(self.window_id))
        elif self.window_id <= self._store.watermark:
            _LOGGER.debug("window %s is published already: skipped",
                          format_window_id(self.window_id))
            return
        else:
            final = os.path.join(self.staging, self.file_name(self.window_id))
            self._staged[self.window_id] = final
        started = time.perf_counter()
        _write_atomically(table, final, self.format, before_rename=self._fence)
        self.write_ms = getattr(self, "write_ms", 0.0) + (time.perf_counter() - started) * 1000
        self.files_written += 1
        _LOGGER.debug("wrote %d rows to %s", table.num_rows, final)

    def committed(self, window_id: int) -> None:
        if self._store is not None:
            self._publish(window_id)

    def teardown(self) -> None:
        # The stream ended: every upstream operator finished, no window can come again.
        if self._store is not None:
            self._publish(max(self._staged, default=self._store.watermark))
            self._store.close()

    def _publish(self, window_id: int) -> None:
        """Publishes the staged windows up to ``window_id`` through the commit-step store."""
        assert self._store is not None
        due = sorted(w for w in self._staged if w <= window_id)
        if not due and window_id <= self._store.watermark:
            return
        steps: list[CommitStep] = [
            PublishFile(self._staged[w], os.path.join(self.path, os.path.basename(
                self._staged[w]))) for w in due]
        self._store.commit([*steps, AdvanceWatermark(window_id)])
        for w in due:
            del self._staged[w]

    def _adopt_staged(self, recovered_window: int) -> dict[int, str]:
        """The staged files still to publish: those of windows the restored state covers.

        Staged files of later windows were written by the lost instance and are written
        again when those windows are replayed; those at or below the watermark are
        published already (left over by a crash between steps): both are removed, and
        so are the temporary files of writes a crash (or a fence) cut short.
        """
        assert self._store is not None
        staged: dict[int, str] = {}
        for name in os.listdir(self.staging):
            path = os.path.join(self.staging, name)
            window_id = _window_of(name)
            if window_id is None:
                if name.startswith(".window-") and name.endswith(".tmp"):
                    os.remove(path)
                continue
            if self._store.watermark < window_id <= max(recovered_window, -1):
                staged[window_id] = path
            else:
                os.remove(path)
        return staged


def _window_of(file_name: str) -> int | None:
    """The window id of a ``FileSink`` file name, or None for any other file."""
    match = re.match(r"^window-(\d+)-(\d{10})\.(jsonl|parquet)$", file_name)
    return make_window_id(int(match.group(1)), int(match.group(2))) if match else None


def _write_atomically(table: pa.Table, final: str, format: str,  # noqa: A002
                      before_rename: Callable[[], None] | None = None) -> None:
    """Writes ``table`` to ``final`` via a synced temporary file and a rename;
    ``before_rename`` may refuse the rename by raising (the operator's fence)."""
    temp = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.{os.getpid()}.tmp")
    try:
        if format == "parquet":
            pq.write_table(table, temp, use_dictionary=dictionary_columns(table))
        else:
            with open(temp, "w", encoding="utf-8") as out:
                for batch in table.to_batches():
                    out.writelines(json.dumps(row, ensure_ascii=False, default=str) + "\n"
                                   for row in batch.to_pylist())
        with open(temp, "rb") as written:
            os.fsync(written.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(temp, final)
        sync_folder(os.path.dirname(final))
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise

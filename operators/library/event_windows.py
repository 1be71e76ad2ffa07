"""Event-time windows: tumbling, sliding and session windows over a timestamp column, closed by
the watermark, with allowed lateness and a ``late`` port.

Streaming windows are processing time; these are the events' own clock's, rows in any order.
Each window's result goes out once the operator's watermark (``operators.watermarks``: the
sources' highest event time minus their delay, in band) passes the window's end. A row
arriving after its window went out but within ``allowed_lateness_ms`` of it updates the
result: the window goes out again, whole, with the same key and bounds (``PostgresSink``
upserts it by them). A row later than that goes to the ``late`` port with the reason, and is
counted; none is dropped.

Windows whose aggregations are all ``count``, ``sum``, ``min``, ``max`` or ``avg`` of a row
expression keep partial aggregates per key and pane (tumbling, sliding: ``window_panes``) or
session (``window_sessions``): the new rows (only the columns the aggregations read) wait in
the state until a window they are in may go out, then one Spark job aggregates them per key
and pane (or stretch of the gap), Arrow merges those partials into the state's, and each
window's result is the merge of its partials. Other windows (``count(DISTINCT ...)``, ...)
keep the rows of windows that may still go out or be updated, and each application window in
which the watermark closes a window, or a late row updates one, runs one job over them.
Either state (Arrow, keyed by ``keys``) follows the open windows, not the stream's history.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from weir.operators.library.window_frames import NEW as _NEW
from weir.operators.library.window_frames import SESSION_END as _SESSION_END
from weir.operators.library.window_frames import TIME as _TIME
from weir.operators.library.window_frames import (
    as_utc_ms,
    live_sessions_frame,
    warm_window_jobs,
    windows_frame,
)
from weir.operators.library.window_panes import Panes, decompose, referenced_columns
from weir.operators.library.window_sessions import Sessions
from weir.operators.operator import OperatorContext
from weir.operators.ports import InputPort, OutputPort
from weir.operators.spark import SparkOperator, SparkSchemaMismatch
from weir.operators.watermarks import (
    END_OF_TIME,
    NO_WATERMARK,
    event_time_error,
    event_times_ms,
    format_watermark,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["EventTimeWindows"]

_KINDS = ("tumbling", "sliding", "session")
_FOLD_ROWS = 1_000_000  # new rows waiting for their windows: aggregated into panes at this


class EventTimeWindows(SparkOperator):
    """Aggregates rows per key over event-time windows; build one with ``tumbling``,
    ``sliding`` or ``session``.

    Output columns: the key columns, ``window_start`` and ``window_end`` (timestamps, ms,
    UTC; a window holds ``window_start <= t < window_end``; a session ends ``gap_ms``
    after its last row) and one column per aggregation. The ``late`` port gets each row
    later than its windows' end plus the allowed lateness, as it came, with a
    ``late_reason`` column.

    Args:
        kind: "tumbling", "sliding" or "session".
        event_time: the event-time column (a timestamp, or integers of epoch ms).
        keys: the key column(s); none = one group.
        aggregations: output column -> Spark SQL aggregate expression over the input's
            columns, e.g. ``{"n": "count(*)", "total": "sum(amount)"}``; default a count.
        size_ms: the window length (tumbling, sliding).
        slide_ms: how often a sliding window starts.
        gap_ms: a session ends after this long without a row of its key.
        allowed_lateness_ms: how long after its end a window still takes late rows.

    Example:
        >>> op = EventTimeWindows.tumbling("ts", size_ms=1_000, keys="user",
        ...                                aggregations={"n": "count(*)"})
        >>> op.kind, op.size_ms, op.slide_ms, sorted(op.output_ports())
        ('tumbling', 1000, 1000, ['late', 'output'])
    """

    input = InputPort()
    output = OutputPort()
    late = OutputPort()

    KEYED_STATE: ClassVar[tuple[str, ...]] = ("pending", "panes")
    COLUMNS_READ: ClassVar[tuple[str, ...]] = ("event_time", "keys", "aggregations")
    METRICS: ClassVar[tuple[str, ...]] = ("late_rows", "open_rows", "windows_out")

    def __init__(self, kind: str, event_time: str, *, keys: str | Sequence[str] = (),
                 aggregations: Mapping[str, str] | None = None, size_ms: int = 0,
                 slide_ms: int = 0, gap_ms: int = 0, allowed_lateness_ms: int = 0) -> None:
        self.kind = kind
        self.event_time = event_time
        self.keys = [keys] if isinstance(keys, str) else list(keys)
        self.aggregations = dict(aggregations or {"count": "count(*)"})
        self.size_ms = int(size_ms)
        self.slide_ms = int(slide_ms or size_ms) if kind != "session" else 0
        self.gap_ms = int(gap_ms)
        self.allowed_lateness_ms = int(allowed_lateness_ms)
        self._check()
        self.pending: pa.Table | None = None  # the rows of windows that may still go out
        self.panes: pa.Table | None = None  # partial aggregates per key and pane/session
        self.fired_watermark = NO_WATERMARK  # the watermark the last results went out at
        self.late_rows = 0
        self.windows_out = 0

    @classmethod
    def tumbling(cls, event_time: str, size_ms: int, **options: object) -> EventTimeWindows:
        """Back-to-back windows of ``size_ms``: each row is in exactly one."""
        return cls("tumbling", event_time, size_ms=size_ms, **options)  # type: ignore[arg-type]

    @classmethod
    def sliding(cls, event_time: str, size_ms: int, slide_ms: int,
                **options: object) -> EventTimeWindows:
        """Windows of ``size_ms`` starting every ``slide_ms``: a row is in size/slide."""
        return cls("sliding", event_time, size_ms=size_ms, slide_ms=slide_ms,
                   **options)  # type: ignore[arg-type]

    @classmethod
    def session(cls, event_time: str, gap_ms: int, **options: object) -> EventTimeWindows:
        """Per key, rows less than ``gap_ms`` apart share a window."""
        return cls("session", event_time, gap_ms=gap_ms, **options)  # type: ignore[arg-type]

    def _check(self) -> None:
        name = f"EventTimeWindows({self.kind!r}, {self.event_time!r})"
        problems = []
        if self.kind not in _KINDS:
            problems.append(f"kind must be one of {', '.join(_KINDS)}")
        if not isinstance(self.event_time, str) or not self.event_time:
            problems.append("event_time must name the event-time column")
        if self.kind in ("tumbling", "sliding") and self.size_ms <= 0:
            problems.append(f"size_ms must be positive, not {self.size_ms}")
        if self.kind == "sliding" and not 0 < self.slide_ms <= self.size_ms:
            problems.append(f"slide_ms must be in (0, size_ms={self.size_ms}], "
                            f"not {self.slide_ms}")
        if self.kind == "session" and self.gap_ms <= 0:
            problems.append(f"gap_ms must be positive, not {self.gap_ms}")
        if self.allowed_lateness_ms < 0:
            problems.append(f"allowed_lateness_ms must be 0 or more, not "
                            f"{self.allowed_lateness_ms} (0 = no late updates)")
        if not self.aggregations:
            problems.append("aggregations must name at least one, e.g. {'n': 'count(*)'}")
        clash = {"window_start", "window_end", *self.keys} & set(self.aggregations)
        if clash:
            problems.append(f"aggregation names {sorted(clash)} clash with the key or "
                            "window columns; rename them")
        if problems:
            raise ValueError(f"{name}: " + "; ".join(problems))

    @property
    def open_rows(self) -> int:
        """Rows held for windows that may still go out: rows, and partials per key and
        pane or session (the state's size)."""
        return sum(t.num_rows for t in (self.pending, self.panes) if t is not None)

    def _pane_rules(self) -> Panes | Sessions | None:
        """How these windows keep partials per pane or session; None: they keep rows."""
        partials = decompose(self.aggregations)
        if partials is None:
            return None
        if self.kind == "session":
            return Sessions(self.keys, partials, self.gap_ms)
        return Panes(self.keys, partials, self.size_ms, self.slide_ms)

    # -- hooks -------------------------------------------------------------------------
    def setup(self, context: OperatorContext) -> None:
        partition_key = context.attributes.get("PARTITION_KEY")
        if partition_key and partition_key not in self.keys:
            raise SparkSchemaMismatch(
                f"operator {context.name!r}: EventTimeWindows keeps its rows by "
                f"{self.keys or 'no key'} but PARTITION_KEY is {partition_key!r}; partition "
                f"it by one of its keys, or not at all")
        super().setup(context)

    def warm_own_query(self, context: OperatorContext) -> bool:
        return warm_window_jobs(self, self._pane_rules(), context.attributes)

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        arrived: list[pa.RecordBatch] = self.__dict__.setdefault("_arrived", [])
        if not arrived:
            problem = event_time_error(batch.schema, self.event_time, repr(self._name))
            missing = [k for k in self.keys if k not in batch.schema.names]
            if problem is None and missing:
                problem = (f"{self._name!r}: key column(s) {missing} are not in its input "
                           f"({', '.join(batch.schema.names)})")
            if problem is not None:
                raise SparkSchemaMismatch(problem)
        arrived.append(batch)

    def end_window(self) -> None:
        arrived: list[pa.RecordBatch] = self.__dict__.get("_arrived") or []
        self._arrived = []
        before, now = self.fired_watermark, self.watermark
        new = self._stamped(arrived)
        if new is not None:
            new = self._without_late(new, before)
        panes = self._pane_rules()
        if panes is not None:
            self._end_window_in_panes(panes, new, before, now)
        elif (pending := self._merge(new)) is None or not self._fires(pending, before, now):
            self.pending = pending
        else:
            with self.spark.job(), self._job_costs().job():
                self._run(pending, before, now)
        self.fired_watermark = max(before, now)

    def teardown(self) -> None:
        self._arrived = []
        super().teardown()

    NON_STATE: ClassVar[tuple[str, ...]] = (*SparkOperator.NON_STATE, "_arrived")
    _TRANSIENT: ClassVar[tuple[str, ...]] = (*SparkOperator._TRANSIENT, "_arrived")

    # -- windows of partials per pane -------------------------------------------------
    def _end_window_in_panes(self, panes: Panes | Sessions, new: pa.Table | None,
                             before: int, now: int) -> None:
        """The new rows wait (the columns the aggregations read); once a window they or
        the panes (sessions) are in may go out, one job folds them into the panes, and
        the windows due go out."""
        maybe_late = None
        if new is not None and new.num_rows:
            if isinstance(panes, Sessions) and before != NO_WATERMARK:
                closed = pc.less_equal(pc.add(new.column(_TIME), self.gap_ms
                                              + self.allowed_lateness_ms), before)
                maybe_late = new.filter(closed) if pc.any(closed).as_py() else None
            names = [n for n in new.schema.names if n not in (_TIME, _NEW)]
            read = referenced_columns(panes.partials, names)
            new = new.select([*self.keys, *(n for n in read if n not in self.keys), _TIME])
            self.pending = new if self.pending is None else pa.concat_tables(
                [self.pending, new], promote_options="permissive")
        if maybe_late is None and not self._pane_due(panes, before, now):
            return
        costs = self._job_costs()
        with self.spark.job(), costs.job():
            if self.pending is not None:
                rows, self.pending = self.pending, None
                costs.rows_in += rows.num_rows
                with costs.phase("handoff"):
                    df = self.spark.to_dataframe(rows.to_batches(), rows.schema)
                with costs.phase("job"):
                    partials = self.spark.to_arrow(panes.spark_partials(df, _TIME))
                self.panes = panes.merge(self.panes, partials)
            if maybe_late is not None:
                self._send_late_from_sessions(panes, maybe_late, before)
            if self.panes is None:
                return
            windows = panes.windows(self.panes)
            end = panes.window_ends(windows)
            fire = pc.and_(pc.less_equal(end, now), pc.or_(pc.greater(end, before), pc.and_(
                windows.column("__weir_touched"),
                pc.greater(pc.add(end, self.allowed_lateness_ms), before))))
            results = panes.results(windows.filter(fire))
            if results.num_rows:
                self.windows_out += results.num_rows
                with costs.phase("emit"):
                    self.output.emit(results)
            kept = None if now == END_OF_TIME else panes.kept(
                self.panes, now - self.allowed_lateness_ms)
            self.panes = kept if kept is not None and kept.num_rows else None

    def _send_late_from_sessions(self, sessions: Sessions, maybe_late: pa.Table,
                                 before: int) -> None:
        """The sessions that, merged, had closed for good by ``before`` hold only new
        rows (``maybe_late`` holds them all): those rows go to the late port, the
        sessions leave the state."""
        ends = sessions.window_ends(self.panes)
        closed = pc.less_equal(pc.add(ends, self.allowed_lateness_ms), before)
        if not pc.any(closed).as_py():
            return
        late = maybe_late.filter(sessions.rows_in(self.panes.filter(closed), maybe_late,
                                                  _TIME))
        self.panes = self.panes.filter(pc.invert(closed))
        self._send_late(late.drop_columns([_NEW]), self._session_late_reason(before))

    def _pane_due(self, panes: Panes, before: int, now: int) -> bool:
        """Whether a window may go out now: the new rows are in one that ended by ``now``
        (a first result or a late update), or a window of the panes ended in (before,
        now]; or the new rows are many (folded to bound the state)."""
        pending = self.pending
        if pending is not None and pending.num_rows >= _FOLD_ROWS:
            return True
        if now == NO_WATERMARK:
            return False
        if pending is not None and pc.min(self._ends(pending.column(_TIME))[0]).as_py() <= now:
            return True
        return self.panes is not None and panes.a_window_ended(self.panes, before, now)

    # -- the window logic ----------------------------------------------------------------
    def _stamped(self, arrived: list[pa.RecordBatch]) -> pa.Table | None:
        """The window's rows with their event time in ms and the new-row mark."""
        rows = [b for b in arrived if b.num_rows]
        if not rows:
            return None
        table = pa.Table.from_batches(rows)
        times = event_times_ms(table.column(self.event_time))
        table = table.append_column(_TIME, times)
        nulls = pc.is_null(times)
        if pc.any(nulls).as_py():  # a row without event time can belong to no window
            self._send_late(table.filter(nulls), "it has no event time")
            table = table.filter(pc.invert(nulls))
        return table.append_column(_NEW, pa.repeat(True, table.num_rows))

    def _last_end(self, times: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        """The end of the latest window each event time belongs to (sessions: the end of
        the session it starts, at least)."""
        if self.kind == "session":
            return pc.add(times, self.gap_ms)
        start = pc.multiply(pc.floor(pc.divide(pc.cast(times, pa.float64()), self.slide_ms)),
                            self.slide_ms)
        return pc.add(pc.cast(start, pa.int64()), self.size_ms)

    def _without_late(self, new: pa.Table, watermark: int) -> pa.Table:
        """``new`` less the rows whose every window closed for good before they came."""
        if watermark == NO_WATERMARK or new.num_rows == 0 or self.kind == "session":
            return new  # a session's late rows are known once merged, in Spark (``_run``)
        closed = pc.less_equal(pc.add(self._last_end(new.column(_TIME)),
                                      self.allowed_lateness_ms), watermark)
        if not pc.any(closed).as_py():
            return new
        self._send_late(new.filter(closed).drop_columns([_NEW]),
                        f"its windows ended more than allowed_lateness_ms="
                        f"{self.allowed_lateness_ms} before the watermark "
                        f"{format_watermark(watermark)}")
        return new.filter(pc.invert(closed))

    def _send_late(self, rows: pa.Table, reason: str) -> None:
        self.late_rows += rows.num_rows
        out = rows.drop_columns([_TIME]).append_column(
            "late_reason", pa.repeat(reason, rows.num_rows).cast(pa.string()))
        self.late.emit(out)

    def _merge(self, new: pa.Table | None) -> pa.Table | None:
        old = self.pending
        if old is not None and old.num_rows:
            old = old.set_column(old.schema.get_field_index(_NEW), _NEW,
                                 pa.repeat(False, old.num_rows))
        parts = [t for t in (old, new) if t is not None and t.num_rows]
        if not parts:
            return None
        return pa.concat_tables(parts, promote_options="permissive").combine_chunks()

    def _ends(self, times: pa.Array | pa.ChunkedArray
              ) -> tuple[pa.Array | pa.ChunkedArray, pa.Array | pa.ChunkedArray]:
        """The end of the earliest and of the latest window each event time is in (a
        session: the end of the one it starts, a lower bound for both)."""
        last_end = self._last_end(times)
        if self.kind == "session":
            return last_end, last_end
        # the windows start every slide after t - size: (last_end - t - 1) // slide
        # earlier ones than the last (size/slide - 1 only when the slide divides the size)
        earlier = pc.divide(pc.subtract(pc.subtract(last_end, times), 1), self.slide_ms)
        return pc.subtract(last_end, pc.multiply(earlier, self.slide_ms)), last_end

    def _fires(self, pending: pa.Table, before: int, now: int) -> bool:
        """Whether a window of ``pending`` may go out now: one ended in (before, now], or
        one that ended by ``now`` took a new row (a late update). A necessary condition:
        the job's filter is the exact one."""
        if now == NO_WATERMARK:
            return False
        first_end, last_end = self._ends(pending.column(_TIME))
        if pc.any(pc.and_(pc.greater(last_end, before),
                          pc.less_equal(first_end, now))).as_py():
            return True
        return bool(pc.any(pc.and_(pending.column(_NEW),
                                   pc.less_equal(first_end, now))).as_py())

    def _job_rows(self, pending: pa.Table, before: int, now: int) -> pa.Table:
        """The open rows the job needs: for tumbling and sliding windows only those of
        windows that may go out now (ended by ``now``, and not closed for good before),
        so a job aggregates about one window's rows, not every open one's; a session
        needs them all (it may merge)."""
        if self.kind == "session":
            return pending
        first_end, last_end = self._ends(pending.column(_TIME))
        needed = pc.and_(pc.less_equal(first_end, now),
                         pc.greater(pc.add(last_end, self.allowed_lateness_ms), before))
        return pending.filter(needed)

    def _run(self, pending: pa.Table, before: int, now: int) -> None:
        rows = self._job_rows(pending, before, now)
        self._job_costs().rows_in += rows.num_rows
        df = self.spark.to_dataframe(rows.to_batches(), rows.schema)
        if self.kind != "session":
            self._fire(df, before, now)
            self.pending = self._kept(pending, self._last_end(pending.column(_TIME)), now)
            return
        # two jobs read the sessions: one brings every open row back with its session's
        # end (the late rows and the rows kept are filtered from it here), one aggregates;
        # the window functions run once, the second job reads the cache
        df = live_sessions_frame(df, self, before).cache()
        try:
            sessions = self.spark.to_arrow(df.select(*pending.schema.names, _SESSION_END))
            ends = sessions.column(_SESSION_END)
            rows = sessions.select(pending.schema.names).cast(pending.schema)
            self._send_late_sessions(rows, ends, before)
            self._fire(df, before, now)
        finally:
            df.unpersist()
        self.pending = self._kept(rows, ends, now)

    def _send_late_sessions(self, rows: pa.Table, ends: pa.ChunkedArray, before: int) -> None:
        """The new rows whose session (ending at ``ends``), merged, had closed for good by
        ``before``."""
        if before == NO_WATERMARK:
            return
        late = rows.filter(pc.less_equal(pc.add(ends, self.allowed_lateness_ms), before))
        if late.num_rows:
            self._send_late(late.drop_columns([_NEW]), self._session_late_reason(before))

    def _session_late_reason(self, before: int) -> str:
        return (f"its session ended more than allowed_lateness_ms="
                f"{self.allowed_lateness_ms} before the watermark {format_watermark(before)}")

    def _fire(self, df: DataFrame, before: int, now: int) -> None:
        """Emits the windows that go out now: a window goes out when the watermark passes
        its end, and again when a new row reaches it within its lateness (a sliding
        window's row may also fall in windows already closed for good: those stay as
        they went out)."""
        from pyspark.sql import functions as F  # noqa: N812 - the usual name

        window = windows_frame(df, self)
        end = F.col("window_end_ms")
        ended = end <= F.lit(now)
        fire = ended & ((end > F.lit(before)) | (
            F.col("touched") & (end + F.lit(self.allowed_lateness_ms) > F.lit(before))))
        results = window.where(fire).drop("window_end_ms", "touched")
        table = as_utc_ms(self.spark.to_arrow(results), ("window_start", "window_end"))
        if table.num_rows:
            self.windows_out += table.num_rows
            self.output.emit(table)

    def _kept(self, rows: pa.Table, ends: pa.Array | pa.ChunkedArray, now: int
              ) -> pa.Table | None:
        """The open rows still needed: those in a window (or session) that may go out or
        be updated, its end (``ends``, per row) plus the allowed lateness after ``now``."""
        if now == END_OF_TIME:
            return None
        kept = rows.filter(pc.greater(ends, now - self.allowed_lateness_ms))
        return kept if kept.num_rows else None

"""Watermarks: how far each operator's input is complete in event time.

A source partition's watermark is the highest event time it has emitted minus a bounded
out-of-orderness (its ``EVENT_TIME_COLUMN`` and ``WATERMARK_DELAY_MILLIS`` attributes);
every other operator's is the minimum over its input ports of the watermark that came
with their END_WINDOW. Either never goes backwards. A port that ended (END_STREAM) holds
nothing back, and a source that ends says ``END_OF_TIME``: every event-time window
closes at the end of a bounded input.

The runtime keeps one ``Watermarks`` on each operator (an instance attribute, so it is
checkpointed with the operator's state): a restored operator goes on from the watermark
of its checkpoint, and a replayed window, having the same rows and the same END_WINDOW
watermarks, gets the same watermark again. Results downstream stay exactly once.

>>> marks = Watermarks(["left", "right"])
>>> marks.saw_input("left", 1_000); marks.saw_input("right", 700)
>>> marks.advance()
700
>>> marks.port_ended("right"); marks.advance()
1000
>>> source = Watermarks([], event_time_column="t", delay_ms=200)
>>> source.saw_event_times(pa.array([900, 1_500, 1_200], pa.int64())); source.advance()
1300
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "END_OF_TIME",
    "IDLE",
    "NO_WATERMARK",
    "WATERMARKS_ATTRIBUTE",
    "Watermarks",
    "event_time_error",
    "event_times_ms",
    "format_watermark",
    "split_late",
]

NO_WATERMARK = -(2**63)
"""The watermark before any event time is known: no event-time window is complete."""

END_OF_TIME = 2**63 - 1
"""The watermark of an input that ended: every event-time window is complete."""

IDLE = -(2**63) + 1
"""What an idle input sends instead of a watermark: it holds nothing back until it sends
one again (a source partition without rows for ``IDLE_TIMEOUT_MILLIS``, or an operator
all of whose inputs are idle)."""

WATERMARKS_ATTRIBUTE = "_weir_watermarks"
"""The operator's instance attribute holding its ``Watermarks`` (state: checkpointed);
prefixed so it cannot hide an operator's own attribute or method."""


class Watermarks:
    """One operator's watermark and what it is made of (see the module docs).

    Idleness is counted in windows, not read off a clock: a source that emitted no row for
    ``idle_windows`` windows in a row is idle, which a replay of the same (empty) windows
    decides the same way.

    Args:
        ports: the input ports connected to it (none for a source).
        event_time_column: a source's event-time column ("" = it has none, and its
            watermark stays ``NO_WATERMARK`` until it ends).
        delay_ms: the out-of-orderness a source allows: its watermark trails the highest
            event time it emitted by this much.
        idle_windows: windows without a row after which a source is idle (0 = never).
        split: a source whose input is made of splits that each deliver in order, but
            not in step (Kafka's partitions): its watermark is then the lowest over the
            splits it has seen (each one's highest event time), less the delay, so a
            split that lags does not see its rows made late by one that runs ahead; a
            split without rows for ``idle_windows`` windows stops holding it back.
    """

    quiet_windows = 0  # (class defaults: checkpoints from before idleness)
    idle_windows = 0
    _rows_this_window = False
    splits: dict[Any, list[int]] | None = None  # split -> [highest event ms, quiet windows]

    def __init__(self, ports: list[str], event_time_column: str = "",
                 delay_ms: int = 0, idle_windows: int = 0, split: bool = False) -> None:
        self.inputs: dict[str, int] = dict.fromkeys(ports, NO_WATERMARK)
        self.splits = {} if split else None
        self.event_time_column = event_time_column
        self.delay_ms = delay_ms
        self.idle_windows = idle_windows
        self.highest_event_ms = NO_WATERMARK
        self.current = NO_WATERMARK

    def connect(self, ports: list[str]) -> None:
        """The input ports connected now (a restored operator may have others, e.g. a
        unifier after a repartition): ports gone are dropped (they would hold it back
        for good), new ones count from no watermark until their first END_WINDOW."""
        self.inputs = {port: self.inputs.get(port, NO_WATERMARK) for port in ports}

    def saw_input(self, port: str, watermark: int) -> None:
        """``port``'s END_WINDOW said ``watermark`` (an unknown port is one that was
        connected after this was made: it counts from now); ``IDLE`` sets it aside until
        it says a watermark again."""
        known = self.inputs.get(port, NO_WATERMARK)
        if watermark == IDLE or watermark > known or known == IDLE:
            self.inputs[port] = watermark

    def port_ended(self, port: str) -> None:
        """``port`` delivered END_STREAM: it holds nothing back any more."""
        self.inputs[port] = END_OF_TIME

    def saw_event_times(self, times_ms: pa.Array | pa.ChunkedArray,
                        splits: pa.Array | pa.ChunkedArray | None = None) -> None:
        """A source emitted rows with these event times (epoch ms; nulls are skipped),
        from these splits (one value per row) if it has them."""
        if len(times_ms) == 0:
            return
        self._rows_this_window = True
        highest = pc.max(times_ms).as_py()
        if highest is not None and highest > self.highest_event_ms:
            self.highest_event_ms = highest
        if self.splits is not None and splits is not None:
            table = pa.table({"split": splits, "t": times_ms}).group_by("split").aggregate(
                [("t", "max")])
            for split, top in zip(table.column("split").to_pylist(),
                                  table.column("t_max").to_pylist(), strict=True):
                known = self.splits.setdefault(split, [NO_WATERMARK, 0])
                known[1] = -1  # rows this window (``advance`` makes it 0)
                if top is not None and top > known[0]:
                    known[0] = top

    def expect_splits(self, splits: Iterable[Any]) -> None:
        """The splits the source reads now: one known but silent holds the watermark back
        (as a Kafka partition that has not delivered yet must) until it delivers or is
        idle."""
        if self.splits is not None:
            for split in splits:
                self.splits.setdefault(split, [NO_WATERMARK, 0])

    def ended(self) -> None:
        """The source is exhausted: nothing older can come any more."""
        self.highest_event_ms = END_OF_TIME
        self.delay_ms = 0

    def advance(self) -> int:
        """The watermark as of the window that ends now (never lower than before)."""
        if not self.inputs:  # a source: was it quiet?
            quiet = not self._rows_this_window
            self.quiet_windows = self.quiet_windows + 1 if quiet else 0
            self._rows_this_window = False
        if self.inputs:
            active = [mark for mark in self.inputs.values() if mark != IDLE]
            candidate = min(active) if active else self.current
        elif self.highest_event_ms in (NO_WATERMARK, END_OF_TIME):
            candidate = self.highest_event_ms
        elif self.splits:
            candidate = self._lowest_split() - self.delay_ms
        else:
            candidate = self.highest_event_ms - self.delay_ms
        if candidate > self.current:
            self.current = candidate
        return self.current


    def _lowest_split(self) -> int:
        """The lowest highest-event-time over the splits that are not idle (the current
        watermark's, plus the delay, when all are)."""
        active = []
        for known in self.splits.values():  # type: ignore[union-attr]
            known[1] += 1  # -1 (rows this window) becomes 0, a quiet window one more
            if not 0 < self.idle_windows <= known[1]:
                active.append(known[0])
        return min(active) if active else self.current + self.delay_ms

    @property
    def idle(self) -> bool:
        """Whether it holds nothing back now: a source quiet for ``idle_windows`` windows,
        or an operator all of whose inputs are idle (never once it reached the end)."""
        if self.current == END_OF_TIME:
            return False
        if self.inputs:
            return all(mark == IDLE for mark in self.inputs.values())
        return bool(self.event_time_column) and 0 < self.idle_windows <= self.quiet_windows

    def outgoing(self) -> int:
        """What goes downstream with END_WINDOW: the watermark, or ``IDLE``."""
        return IDLE if self.idle else self.current


def event_times_ms(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """An event-time column as epoch milliseconds (int64): timestamps of any unit, or
    integers already in milliseconds."""
    if pa.types.is_timestamp(column.type):
        return pc.cast(pc.cast(column, pa.timestamp("ms", tz=column.type.tz)), pa.int64())
    return pc.cast(column, pa.int64())


def event_time_error(schema: pa.Schema, column: str, owner: str) -> str | None:
    """Why ``column`` of ``schema`` cannot be ``owner``'s event time, or None if it can."""
    if column not in schema.names:
        return (f"{owner}: event-time column {column!r} is not in its input "
                f"({', '.join(schema.names) or 'no columns'}); name one of those columns")
    kind = schema.field(column).type
    if not (pa.types.is_timestamp(kind) or pa.types.is_integer(kind)):
        return (f"{owner}: event-time column {column!r} is {kind}, not a timestamp; give a "
                "timestamp column or an integer column of epoch milliseconds")
    return None


def format_watermark(watermark: int) -> str:
    """A watermark for people: an ISO time in UTC, '-' before any, 'end' at the end."""
    if watermark == NO_WATERMARK:
        return "-"
    if watermark == IDLE:
        return "idle"
    if watermark == END_OF_TIME:
        return "end"
    moment = datetime.datetime.fromtimestamp(watermark / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def split_late(rows: pa.Table, time_column: str, closed: Callable[[np.ndarray], np.ndarray],
               reason: str) -> tuple[pa.Table, pa.Table]:
    """``rows`` on time, and the late ones with a ``late_reason`` column: those without
    event time, and those whose event times (epoch ms) ``closed`` picks (``reason``)."""
    times = event_times_ms(rows.column(time_column)).combine_chunks()
    untimed = pc.is_null(times).to_numpy(zero_copy_only=False)
    late = untimed | (closed(pc.fill_null(times, 0).to_numpy()) & ~untimed)
    if not late.any():
        return rows, rows.schema.empty_table().append_column(
            "late_reason", pa.array([], pa.string()))
    reasons = np.where(untimed, f"no {time_column} (event time)", reason)
    return rows.filter(pa.array(~late)), rows.filter(pa.array(late)).append_column(
        "late_reason", pa.array(reasons[late], pa.string()))

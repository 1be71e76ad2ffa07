"""Dead letters of a Spark window job: only the whole job is known to fail, so the rows it
fails on are found by bisecting the window's input with dry runs (``operators.dead_letters``),
set aside, and the job runs once more over the rest.

The cost: a window with ``k`` bad rows among ``n`` runs about ``2 k log2(n)`` extra jobs
(each a few tens of ms on a warm local Spark), and an operator with dead letters keeps
its window's input batches in memory until the window's job ran. Windows without a bad
row cost nothing more. A window with more than ``DEAD_LETTER_MAX_ROWS`` bad rows fails
the operator after about ``2 DEAD_LETTER_MAX_ROWS`` dry runs (the dead letters' breaker).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pyarrow as pa

from weir.operators.dead_letters import DeadLetters, isolate_failures

__all__ = ["is_spark_record_error", "set_aside_bad_rows"]

_LOGGER = logging.getLogger(__name__)

Rerun = Callable[[dict[str, pa.Table], bool], None]
"""Runs the window's job over these rows of each input port; emits its results if told."""


def set_aside_bad_rows(rows: dict[str, list[pa.RecordBatch]], error: BaseException,
                       rerun: Rerun, dead: DeadLetters, window_id: int) -> None:
    """The window's job failed with ``error`` over ``rows``: sets aside the rows it fails
    on (dry runs find them: nothing is emitted, ``collected`` is not called), then runs
    the job for real over the rest. Rows that fail only together (a join's pair) are set
    aside together."""
    space = _RowSpace({port: pa.Table.from_batches(batches)
                       for port, batches in rows.items() if batches})
    bad = isolate_failures(space.total, lambda lo, hi: rerun(space.between(lo, hi), False),
                           is_spark_record_error, together_is_failure=True,
                           whole_error=error, max_rows=dead.max_rows)
    for lo, hi, reason in bad:
        for port, part in space.between(lo, hi).items():
            dead.set_aside(part, reason, port, window_id)
    kept = space.without([(lo, hi) for lo, hi, _ in bad])
    _LOGGER.warning("operator=%s window=%d set %d row(s) aside as dead letters; %d row(s) "
                    "go on", dead.name, window_id, sum(hi - lo for lo, hi, _ in bad),
                    sum(t.num_rows for t in kept.values()))
    if any(table.num_rows for table in kept.values()):
        rerun(kept, True)


def is_spark_record_error(exc: BaseException) -> bool:
    """Whether a window job's error may be its rows' fault: an error Spark raised running
    the query (a cast, a division, ``raise_error``, a Python UDF), not one analysing it
    (no row would pass) nor a lost JVM or connection (retried)."""
    from pyspark.errors.exceptions.captured import (
        AnalysisException,
        CapturedException,
        StreamingQueryException,
    )

    return isinstance(exc, CapturedException) and not isinstance(
        exc, AnalysisException | StreamingQueryException)


class _RowSpace:
    """The rows of a window's input ports numbered as one sequence (port after port), so
    that bisection can split them wherever the bad rows are, across ports too."""

    def __init__(self, tables: dict[str, pa.Table]) -> None:
        self.tables = {port: table for port, table in tables.items() if table.num_rows}
        self.starts: dict[str, int] = {}
        self.total = 0
        for port, table in self.tables.items():
            self.starts[port] = self.total
            self.total += table.num_rows

    def between(self, lo: int, hi: int) -> dict[str, pa.Table]:
        """Each port's rows numbered ``[lo, hi)`` (ports without any left out)."""
        parts = {}
        for port, table in self.tables.items():
            start = self.starts[port]
            first, last = max(lo, start), min(hi, start + table.num_rows)
            if first < last:
                parts[port] = table.slice(first - start, last - first)
        return parts

    def without(self, ranges: list[tuple[int, int]]) -> dict[str, pa.Table]:
        """Every port's rows outside ``ranges``."""
        keep = [True] * self.total
        for lo, hi in ranges:
            keep[lo:hi] = [False] * (hi - lo)
        return {port: table.filter(pa.array(keep[self.starts[port]:
                                                 self.starts[port] + table.num_rows]))
                for port, table in self.tables.items()}

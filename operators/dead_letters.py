"""Dead letters: the rows an operator fails on, set aside with their error, so the rest go on.

With ``ON_ERROR="DEAD_LETTER"`` an operator whose ``process`` (or, for a ``SparkOperator``,
whose window job) raises on some rows does not fail: the rows it fails on leave on its
``errors`` output port, each with the error, the operator, the input port and the window,
and every other row is processed as usual. Windows replay identically, so a replayed
window sets aside the same rows and the dead-letter stream is exactly once like any other.

Only the batch is known to fail, not the row, so the bad rows are found by bisection: a
failing batch is tried again as two halves, each half that fails as two halves again, down
to single rows (``isolate_failures``). ``k`` bad rows among ``n`` cost about
``2 k log2(n)`` extra tries. A Python operator's tries are real (their emits are kept when
they pass); a Spark operator's are dry runs that only find the bad rows, then one job runs
over the rest (``operators.spark``).

A circuit breaker keeps a broken operator from turning its stream into dead letters: when
more than ``DEAD_LETTER_MAX_ROWS`` rows of one batch (a Spark operator: of one window)
fail, or every row of a batch fails with an error of the operator's own code (an
``AttributeError``, ``NameError``, ``TypeError`` or ``ImportError``: a bug), the operator
fails with ``TooManyDeadLetters`` naming the first row's error. Bisection then stops early:
everything failing costs about ``2 DEAD_LETTER_MAX_ROWS`` tries, not ``2 n``.

>>> def attempt(lo, hi):  # an operator failing on row 3
...     if lo <= 3 < hi:
...         raise ValueError("row 3")
>>> bad = isolate_failures(8, attempt, lambda exc: isinstance(exc, ValueError))
>>> [(lo, hi, str(exc)) for lo, hi, exc in bad]
[(3, 4, 'row 3')]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from weir.operators.table_batches import table_batches

__all__ = ["DEAD_LETTER", "ERRORS_PORT", "ERROR_COLUMNS", "FAIL", "DeadLetterPort",
           "DeadLetters", "TooManyDeadLetters", "dead_letters_of", "error_columns",
           "is_record_error", "is_spark_analysis_error", "isolate_failures"]

FAIL = "FAIL"
DEAD_LETTER = "DEAD_LETTER"
ON_ERROR_VALUES = (FAIL, DEAD_LETTER)
ERRORS_PORT = "errors"
COUNT_ATTRIBUTE = "_weir_dead_letters"  # on the operator: checkpointed with its state
METRIC = "dead_letters"
ERROR_COLUMNS = ("weir_error", "weir_operator", "weir_port", "weir_window_id")
_MESSAGE_CHARS = 1000

Attempt = Callable[[int, int], None]
"""Tries rows ``[lo, hi)``; raises what the operator raised on them."""


class TooManyDeadLetters(Exception):
    """The circuit breaker of dead letters: so many rows of one batch fail, or every row
    with an error of the operator's own code, that the cause is not bad data but a bug or
    a wrong setting; the operator fails rather than turn its stream into dead letters.
    Raised from the first row's error, with its traceback (its place is the operator's)."""


BUG_TYPES: tuple[type[BaseException], ...] = (AttributeError, NameError, TypeError,
                                              ImportError)
"""Errors of the operator's own code: on every row of a batch they are a bug, not data."""


def isolate_failures(count: int, attempt: Attempt,
                     is_record_error: Callable[[BaseException], bool], *,
                     together_is_failure: bool = False,
                     whole_error: BaseException | None = None,
                     max_rows: int | None = None,
                     ) -> list[tuple[int, int, BaseException]]:
    """The row ranges ``[lo, hi)`` of ``count`` rows that fail ``attempt``, with the error.

    Bisects: a range that fails is tried as two halves, down to single rows. An error
    that is not about the rows (``is_record_error`` says no: a lost connection, a full
    disk, a query that cannot run at all) is raised at once, as without dead letters.
    Bisection goes depth first, so with ``max_rows`` a batch where every row fails costs
    about ``log2(count) + 2 max_rows`` tries before the breaker trips, not ``2 count``.

    Args:
        count: the rows to try.
        attempt: tries rows ``[lo, hi)``.
        is_record_error: whether an error may be the rows' fault.
        together_is_failure: a range that fails while each half passes is reported whole
            (rows that fail only together, say a join's); otherwise it counts as passed,
            which is right when passing tries are kept (both halves did their work).
        whole_error: what all ``count`` rows already failed with (they are not tried again).
        max_rows: the most failing rows to set aside (``DEAD_LETTER_MAX_ROWS``); one more
            stops the bisection. None: no limit.

    Raises:
        TooManyDeadLetters: more than ``max_rows`` rows fail, or every row fails with an
            error of ``BUG_TYPES``.
        What ``attempt`` raised, when it is not a record error or ``count`` is 0.
    """
    if count == 0:  # no row to blame: the error is the operator's own
        if whole_error is not None:
            raise whole_error
        attempt(0, 0)
        return []
    bad = _Failures(count, max_rows)
    _bisect(0, count, attempt, is_record_error, together_is_failure, bad, known=whole_error)
    bad.check_not_a_bug()
    return bad.ranges


class _Failures:
    """The failing ranges found so far; trips the breaker past ``max_rows`` rows."""

    def __init__(self, count: int, max_rows: int | None) -> None:
        self.count = count
        self.max_rows = max_rows
        self.ranges: list[tuple[int, int, BaseException]] = []
        self.rows = 0

    def add(self, lo: int, hi: int, error: BaseException) -> None:
        self.ranges.append((lo, hi, error))
        self.rows += hi - lo
        if self.max_rows is not None and self.rows > self.max_rows:
            first = self.ranges[0][2]
            raise _tripped(
                f"more than {self.max_rows} of a batch's {self.count} rows fail "
                f"(DEAD_LETTER_MAX_ROWS={self.max_rows}), the first with {describe(first)}; "
                "that many is a bug or a wrong setting rather than bad data: fix it, or "
                "raise DEAD_LETTER_MAX_ROWS if such batches are expected", first) from first

    def check_not_a_bug(self) -> None:
        """Every row failing with an error of the operator's own code is a bug."""
        errors = [error for _, _, error in self.ranges]
        if self.rows == self.count and all(_is_bug(error) for error in errors):
            raise _tripped(
                f"every row of a batch ({self.count}) fails with {describe(errors[0])}; "
                f"{type(errors[0]).__name__} on every row is a bug in the operator, not bad "
                "data, so the rows are not set aside: fix the operator", errors[0]
            ) from errors[0]


def _is_bug(error: BaseException) -> bool:
    return isinstance(error, BUG_TYPES) and not isinstance(error, pa.ArrowException)


def _tripped(message: str, first: BaseException) -> TooManyDeadLetters:
    """The breaker's error, with the first row's traceback (it names the operator's line)."""
    return TooManyDeadLetters(message).with_traceback(first.__traceback__)


def _bisect(lo: int, hi: int, attempt: Attempt, is_record_error: Callable[[BaseException], bool],
            together: bool, bad: _Failures, known: BaseException | None) -> None:
    error = known if known is not None else _try(lo, hi, attempt, is_record_error)
    if error is None:
        return
    if hi - lo <= 1:
        bad.add(lo, hi, error)
        return
    middle = (lo + hi) // 2
    found = len(bad.ranges)
    _bisect(lo, middle, attempt, is_record_error, together, bad, None)
    _bisect(middle, hi, attempt, is_record_error, together, bad, None)
    if together and len(bad.ranges) == found:
        bad.add(lo, hi, error)


def _try(lo: int, hi: int, attempt: Attempt,
         is_record_error: Callable[[BaseException], bool]) -> BaseException | None:
    try:
        attempt(lo, hi)
    except Exception as exc:  # noqa: BLE001 - the predicate decides; others go on up
        if not is_record_error(exc):
            raise
        return exc
    return None


def is_record_error(exc: BaseException) -> bool:
    """Whether ``exc``, raised by ``process``, may be the fault of the rows it was given.

    A batch that does not fit its input port is; a lost connection, a full disk, a
    replaced deployment, state that cannot be pickled or a Spark query that cannot be
    analysed is not: no row would pass, and a retry may (the operator restarts). The
    runtime knows more errors of its own (``runtime.process_calls.rows_may_be_at_fault``).
    """
    import pickle

    from weir.storage import Fenced

    not_the_rows = (OSError, MemoryError, Fenced, pickle.PicklingError,
                    pickle.UnpicklingError)
    return not isinstance(exc, not_the_rows) and not is_spark_analysis_error(exc)


def is_spark_analysis_error(exc: BaseException) -> bool:
    """A Spark query that cannot be analysed (bad SQL, an unknown column): it fails on any
    rows. A missing path (``PATH_NOT_FOUND``) may be there on a retry, so it is not."""
    errors = sys.modules.get("pyspark.errors")  # not loaded: it cannot be a Spark error
    analysis = getattr(errors, "AnalysisException", None) if errors is not None else None
    if analysis is None or not isinstance(exc, analysis):
        return False  # ParseException is an AnalysisException too
    condition = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    try:
        name = condition() if condition is not None else None
    except Exception:  # noqa: BLE001 - an exception without its error class is still one
        name = None
    return name != "PATH_NOT_FOUND"


def error_columns(rows: pa.Table | pa.RecordBatch, error: BaseException, operator: str,
                  port: str, window_id: int) -> pa.Table:
    """``rows`` with the dead-letter columns appended: ``weir_error`` (the error's type and
    first line), ``weir_operator``, ``weir_port`` (the input port, or ``window`` for a
    window job's input) and ``weir_window_id``. Rows that already have them (a dead letter
    failing again in a second operator) get them anew, once: their schema stays the same."""
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_batches([rows])
    table = table.drop_columns([name for name in ERROR_COLUMNS if name in table.column_names])
    n = table.num_rows
    message = describe(error)
    extra = [pa.array([message] * n, pa.string()), pa.array([operator] * n, pa.string()),
             pa.array([port] * n, pa.string()), pa.array([window_id] * n, pa.int64())]
    for name, column in zip(ERROR_COLUMNS, extra, strict=True):
        table = table.append_column(name, column)
    return table


def describe(error: BaseException) -> str:
    """``Type: first line of the message``: Spark's messages carry a plan below it."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    message = lines[0] if lines else ""
    if len(message) > _MESSAGE_CHARS:
        message = message[:_MESSAGE_CHARS - 3] + "..."
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


class DeadLetters:
    """One operator's dead-letter output: emits the rows set aside and counts them.

    The count is kept on the operator (``COUNT_ATTRIBUTE``), so it is checkpointed with
    its state and a replayed window does not count its rows twice. ``max_rows`` is its
    circuit breaker (``isolate_failures``; None: none): ``dead_letters_of`` sets it.
    """

    def __init__(self, operator: Any, name: str, max_rows: int | None = None) -> None:
        self.operator = operator
        self.name = name
        self.max_rows = max_rows

    @property
    def count(self) -> int:
        return int(self.operator.__dict__.get(COUNT_ATTRIBUTE, 0))

    def set_aside(self, rows: pa.Table | pa.RecordBatch, error: BaseException, port: str,
                  window_id: int) -> None:
        """Emits ``rows`` on the ``errors`` port with the error, and counts them."""
        if rows.num_rows == 0:
            return
        table = error_columns(rows, error, self.name, port, window_id)
        self.operator.__dict__[COUNT_ATTRIBUTE] = self.count + table.num_rows
        emit = self.operator.emitter
        for batch in table_batches(table):  # as an output port emits a table
            emit(ERRORS_PORT, batch)


def dead_letters_of(operator: Any, context: Any) -> DeadLetters | None:
    """The dead-letter output of ``operator`` set up with ``context`` (an
    ``OperatorContext``): None unless its ``ON_ERROR`` is ``DEAD_LETTER``."""
    if context.attributes.get("ON_ERROR") != DEAD_LETTER:
        return None
    from weir.operators.attributes import resolve

    return DeadLetters(operator, context.name,
                       resolve("DEAD_LETTER_MAX_ROWS", context.attributes))


class DeadLetterPort:
    """The ``errors`` output every operator has: what ``dag.add_stream(..., op.errors,
    sink.input)`` connects. Not among ``output_ports()``: it exists only with
    ``ON_ERROR="DEAD_LETTER"``, which needs it connected (checked at submit)."""

    kind = "output"
    schema = None
    optional = True
    name = ERRORS_PORT

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        from weir.operators.ports import BoundPort

        return BoundPort(instance, self)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return "DeadLetterPort('errors')"


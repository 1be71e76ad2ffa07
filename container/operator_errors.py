"""What an operator's error says: whether a retry can help, and one line for the master.

A restart replays the same windows into the same code, so some errors (a Spark analysis
error, a batch that does not fit its port, state that cannot be pickled) come back on
every retry; the master fails the application at once for those. The line the master
shows names the operator's own frame, not pyspark's or py4j's.
"""

from __future__ import annotations

import os
import pickle
import traceback
from types import FrameType

from weir.container.lease import LeaseRevoked
from weir.container.port_input import InputClosed
from weir.operators.column_checks import hide_internal_columns
from weir.operators.dead_letters import TooManyDeadLetters, is_spark_analysis_error
from weir.operators.operator import PermanentError
from weir.operators.ports import SchemaMismatch
from weir.runtime.event_time import EventTimeError
from weir.runtime.operator_state import OperatorStateError
from weir.runtime.process_calls import rows_may_be_at_fault
from weir.runtime.spark.java import JavaMissing

__all__ = ["describe_error", "is_fatal", "is_record_error"]

_ERROR_CHARS = 500  # the one-line error the master shows stays readable in `weir apps`

# Errors the same code on the same (replayed) data raises again on every retry.
_FATAL_TYPES: tuple[type[BaseException], ...] = (
    pickle.PicklingError, pickle.UnpicklingError,  # the operator cannot be (un)pickled
    OperatorStateError,  # its state cannot be checkpointed
    SchemaMismatch,  # a batch does not fit its port's schema
    PermanentError,  # the operator says so (a Kafka record that does not decode, ...)
    EventTimeError,  # a source's EVENT_TIME_COLUMN is not in (or not a time of) its output
    TooManyDeadLetters,  # the replayed batch trips the dead letters' breaker again
    JavaMissing,  # Spark cannot start: no Java here (a retry cannot install it)
)
# Frames of these packages are not where an operator's error is: ``describe_error`` names
# the innermost frame outside them.
_LIBRARY_DIRS = frozenset({"pyspark", "py4j"})


def is_fatal(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) cannot succeed on retry.

    A restart replays the same windows into the same code, so an analysis error of a
    Spark query (bad SQL: an unknown column, a syntax error), a batch that does not fit
    its port's schema, or an operator whose state cannot be pickled fails again, each
    time after a cold Spark start: the master fails the application at once instead.
    Anything else (lost connections, full disks, a JVM that died) may pass and is retried.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, _FATAL_TYPES) or is_spark_analysis_error(current):
            return True
        current = current.__cause__  # ``raise X from analysis_error`` keeps it fatal
    return False


def is_record_error(exc: BaseException) -> bool:
    """``runtime.process_calls.rows_may_be_at_fault``, and not the container's own stops (a
    revoked lease, a closed input): whether the rows ``process`` was given may be at
    fault, so that they are set aside as dead letters."""
    return not isinstance(exc, LeaseRevoked | InputClosed) and rows_may_be_at_fault(exc)


def describe_error(exc: BaseException) -> str:
    """``Type: first line of the message (at file:line in function)``, for the master.

    One line, so that ``weir apps`` and ``weir operators`` stay tables: Spark's messages
    carry the query plan on the following lines (the container log has them in full).
    The place is the innermost frame outside pyspark and py4j, and not one that hides
    itself (``__tracebackhide__``, as pytest reads it): the operator's own call.
    """
    lines = [line.strip() for line in hide_internal_columns(str(exc)).splitlines()
             if line.strip()]
    message = lines[0] if lines else ""
    if len(message) > _ERROR_CHARS:
        message = message[:_ERROR_CHARS - 3] + "..."
    frames = [(_source_file(frame), lineno, frame.f_code.co_name)
              for frame, lineno in traceback.walk_tb(exc.__traceback__)
              if not frame.f_locals.get("__tracebackhide__")]  # the SDK's own raise
    own = [f for f in frames if not _LIBRARY_DIRS.intersection(f[0].split(os.sep))]
    place = (own or frames)[-1] if frames else None
    where = f" (at {os.path.basename(place[0])}:{place[1]} in {place[2]})" \
        if place is not None else ""
    return f"{type(exc).__name__}: {message}{where}"


def _source_file(frame: FrameType) -> str:
    """The file a frame's code came from, also for code shipped by value.

    cloudpickle (3.1.3 on) names code it pickles by value ``<dynamic-code>`` so that a
    payload does not depend on where it was built; the function's globals still carry
    the module's ``__file__``, which is the file the user knows.
    """
    filename = frame.f_code.co_filename
    if filename.startswith("<"):
        module_file = frame.f_globals.get("__file__")
        if isinstance(module_file, str) and module_file:
            return module_file
    return filename

"""How a runtime hands a batch to ``process`` (the container's window loop and the local
runner alike): cast to the input port's declared schema and, with
``ON_ERROR="DEAD_LETTER"``, with the rows it fails on set aside.

A failing batch is bisected (``operators.dead_letters``). Each try's emits are held: a try
that failed emits nothing, one that passed emits what it did, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pyarrow as pa

from weir.operators.column_checks import missing_column
from weir.operators.dead_letters import DeadLetters, is_record_error, isolate_failures
from weir.operators.operator import Operator
from weir.operators.ports import SchemaMismatch, conform
from weir.runtime.operator_state import OperatorStateError

__all__ = ["ProcessCalls", "rows_may_be_at_fault"]

Emit = Callable[[str, pa.RecordBatch], None]


def rows_may_be_at_fault(exc: BaseException) -> bool:
    """``operators.dead_letters.is_record_error``, and not the runtime's own errors
    (state that cannot be checkpointed or restored): whether the rows ``process`` was
    given may be at fault, so that they are set aside as dead letters."""
    return not isinstance(exc, OperatorStateError) and is_record_error(exc)


class ProcessCalls:
    """One operator's ``process`` calls.

    Args:
        operator: the operator.
        name: its name, for errors.
        schemas: input port → declared schema (ports without one are not cast).
        dead_letters: where rows it fails on go; None: an error fails the operator.
        record_error: whether an error may be the rows' fault (the runtime may know more
            errors of its surroundings than ``rows_may_be_at_fault``).
    """

    def __init__(self, operator: Operator, name: str, schemas: Mapping[str, pa.Schema],
                 dead_letters: DeadLetters | None,
                 record_error: Callable[[BaseException], bool] = rows_may_be_at_fault,
                 ) -> None:
        self.operator = operator
        self.name = name
        self.schemas = dict(schemas)
        self.dead_letters = dead_letters
        self.record_error = record_error
        self._held: list[tuple[str, pa.RecordBatch]] | None = None
        # the columns it names (COLUMNS_READ) are checked on its one input's first batch
        self._unchecked = set(operator.input_ports()) if len(operator.input_ports()) == 1 \
            else set()

    def hold(self, port: str, batch: pa.RecordBatch) -> bool:
        """Keeps an emit of the try under way (True), or lets it go out now (False)."""
        if self._held is None:
            return False
        self._held.append((port, batch))
        return True

    def process(self, port: str, batch: pa.RecordBatch, window_id: int, emit: Emit) -> None:
        """Hands ``batch`` to ``process``; with dead letters, bisects it on failure.

        Raises:
            SchemaMismatch: the first batch lacks a column the operator names (before
                Spark would fail on it, listing internal columns).
        """
        if port in self._unchecked and batch.num_columns:
            self._unchecked.discard(port)
            problem = missing_column(self.operator, batch.schema.names,
                                     f"its input port {port!r} does not have", port)
            if problem:
                raise SchemaMismatch(f"operator {self.name!r}: {problem}; fix the name, or "
                                     "what feeds it")
        if self.dead_letters is None:
            self.operator.process(port, self.conform(port, batch))
            return

        def attempt(lo: int, hi: int) -> None:
            self._held = []
            try:
                self.operator.process(port, self.conform(port, batch.slice(lo, hi - lo)))
                held = self._held
            finally:
                self._held = None
            for out, emitted in held:
                emit(out, emitted)

        for lo, hi, error in isolate_failures(batch.num_rows, attempt, self.record_error,
                                              max_rows=self.dead_letters.max_rows):
            self.dead_letters.set_aside(batch.slice(lo, hi - lo), error, port, window_id)

    def conform(self, port: str, batch: pa.RecordBatch) -> pa.RecordBatch:
        schema = self.schemas.get(port)
        if schema is None:
            return batch
        return conform(batch, schema, f"operator {self.name!r}, input port {port!r}")

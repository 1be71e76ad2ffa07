"""``SparkSql``: a Spark operator given as one SQL query, warmed on its own query.

When its input's schema is known before the first batch (a source's files, told by the
master; or the port's declared schema), ``activate`` runs the query over rows of that
schema, instead of the container's generic warm-up (a keyed count, of no use to it),
while the sources already read: Spark loads its classes, compiles the plan's code and
the JIT its loops then, not in the first windows. On q1 at 5 M events (one run each,
2 cores) the generic warm-up then this one left the first window at 10.4 s from launch;
this one alone at 7.9 s. Measured on Nexmark's q1 (920,000 bids a
window, ``0.908 * price``, 2 cores, one run): the first three windows' jobs took 5.6, 3.2 and
2.0 s of the JVM's CPU and the later ones 1.3-1.5 s, where the generic warm-up (a keyed
count) had run before them.

It runs the query round after round until its time settles (``run_until_settled``), not
a fixed two: the JIT keeps compiling for several seconds. On q1's shape (1.84 M bids a
window, in a process of its own, 200,000 sample rows a round) the first window took a
median 1,127 ms (1,040-1,215, three runs) after two rounds and 879 ms (774-911, four
runs) after the rounds this rule ran (8 to 13), the warm-up taking about 2 s more.
The sample numbers span nine orders of magnitude, as real ones do: warmed on 1 to 997
only, the second window ran slower than the first (single runs: 1,009 against 689 ms;
code compiled for small numbers, thrown away). A redeployed operator (a recovery) warms
two rounds only: its windows wait meanwhile, and those seconds cost them more than a
cooler first job.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa

from weir.operators.operator import OperatorContext
from weir.operators.spark import SparkOperator
from weir.operators.spark_passthrough import PassThrough, plan_pass_through
from weir.runtime.spark.warm_up import run_until_settled

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SparkSql", "sample_rows"]

_LOGGER = logging.getLogger("weir.operators.spark")

_WARM_ROUNDS_MIN = 2  # the first plans the pass-through, the second runs the planned shape
_WARM_ROUNDS_MAX = 16
_WARM_PATIENCE = 4  # rounds in a row without a new fastest (by 5 %): settled
_WARM_ROWS_MAX = 200_000


class SparkSql(SparkOperator):
    """A Spark operator given as one SQL query over its input ports.

    Each input port is a temporary view named like the port (``input`` by default); the
    named parameter ``:window_id`` is the application window's id. Each ``SparkSql`` gets
    its own Spark session, so views of two operators never meet. A query Spark cannot
    analyse (an unknown column, a syntax error) fails the application at its first window,
    with Spark's message: a restart would only fail the same way.

    Args:
        query: a Spark SQL query.
        output_schema: cast the results to this schema (stable column types).

    Example:
        >>> op = SparkSql("SELECT word, count(*) AS n FROM input GROUP BY word")
        >>> op.query.split()[0]
        'SELECT'
    """

    def __init__(self, query: str, output_schema: pa.Schema | None = None) -> None:
        if not isinstance(query, str) or not query.strip():
            raise ValueError("SparkSql needs a non-empty SQL query, e.g. 'SELECT * FROM input'")
        self.query = query
        self._output_schema = output_schema
        self._sql_session: SparkSession | None = None

    def output_schema(self, port: str) -> pa.Schema | None:
        if self._output_schema is not None:
            return self._output_schema
        return super().output_schema(port)

    def dataframe_session(self) -> SparkSession:
        session = self._sql_session
        if session is None:
            session = self._sql_session = self.spark.session.newSession()
        return session

    # a projection or filter: the columns it copies bypass Spark (``spark_passthrough``)
    _pass_through: PassThrough | None = None
    _planned = False
    _through_rows: ClassVar[list[pa.RecordBatch]] = []  # (replaced per window)
    _through_count = 0  # their rows
    _warmed: ClassVar[dict[str, pa.Schema] | None] = None  # what the warm-up planned for
    NON_STATE: ClassVar[tuple[str, ...]] = (*SparkOperator.NON_STATE, "_pass_through",
                                            "_planned", "_through_rows", "_through_count",
                                            "_warmed")
    _TRANSIENT: ClassVar[tuple[str, ...]] = NON_STATE

    def warm_own_query(self, context: OperatorContext) -> bool:
        return self._warm_query(context)

    def _warm_query(self, context: OperatorContext) -> bool:
        """Runs the query over rows of its inputs' schemas until its time settles or
        ``SPARK_WARMUP_MILLIS`` is spent (see the module docs), when every input's is
        known and the application warms Spark (``SPARK_WARMUP_ROWS``); whether it did.
        A query that fails on those rows is left to fail, or not, on real ones.

        The pass-through planned on those rows stays for the real windows while their
        rows have the same schema: planned again on the first real window, that window
        would hand Spark every column, on code the warm-up did not run (q1, 920,000 bids,
        one in-process run: 6.5 s of the JVM's CPU for that window, 1.0-1.5 s for the
        narrow ones)."""
        rows = min(int(getattr(self.spark, "warmup_rows", 0)), _WARM_ROWS_MAX)
        schemas = {port: spec.schema or context.input_schemas.get(port)
                   for port, spec in type(self).input_ports().items()}
        if not rows or any(schema is None for schema in schemas.values()):
            return False
        self.spark.session  # noqa: B018 - a JVM that cannot start fails the activation
        kept = dict(self._input_schemas)
        samples = {port: sample_rows(schema, rows) for port, schema in schemas.items()
                   if schema is not None}
        try:
            most = _WARM_ROUNDS_MIN if context.redeployed else _WARM_ROUNDS_MAX
            budget_s = int(context.attributes.get("SPARK_WARMUP_MILLIS", 1_000)) / 1000
            run_until_settled(lambda: self.rehearse(samples), max_rounds=most,
                              patience=_WARM_PATIENCE, gain=0.05, min_rounds=_WARM_ROUNDS_MIN,
                              budget_s=budget_s)
            self._warmed = {port: s for port, s in schemas.items() if s is not None}
        except Exception as exc:  # noqa: BLE001 - a warm-up; the real windows say what is wrong
            _LOGGER.info("operator %s: its query could not be warmed on sample rows (%s: %s); "
                         "its first windows run cold", context.name, type(exc).__name__,
                         " ".join(str(exc).split())[:300])
            self._pass_through, self._planned = None, False
        finally:
            self._input_schemas = kept
            self._through_rows, self._through_count = [], 0
        return True

    def begin_window(self, window_id: int) -> None:
        super().begin_window(window_id)
        self._through_rows, self._through_count = [], 0

    def _spark_rows(self, port: str, batch: pa.RecordBatch) -> pa.RecordBatch:
        """With a pass-through, the needed columns and the rows' numbers; the batch is
        kept whole for ``collected``."""
        warmed, self._warmed = self._warmed, None
        if warmed is not None and warmed.get(port) != self._input_schemas.get(port):
            self._pass_through, self._planned = None, False  # the rows plan it again
        through = self._pass_through
        if through is None:
            return batch
        narrow = through.narrow(batch, self._through_count)
        self._through_rows.append(batch)
        self._through_count += batch.num_rows
        return narrow

    def transform(self, inputs: dict[str, DataFrame], window_id: int) -> DataFrame:
        session = self.dataframe_session()
        through = self._pass_through
        for port, df in inputs.items():
            (df if through is None else through.view(df)).createOrReplaceTempView(port)
        args = {"window_id": window_id} if ":window_id" in self.query else None
        result = session.sql(self.query, args=args)
        if through is not None:
            return through.trim(result)
        if not self._planned:  # once per deployment, from the first window's plan
            self._planned = True
            schema = self._input_schemas.get(next(iter(inputs), ""))
            if len(inputs) == 1 and schema is not None and self._dead_letters is None:
                self._pass_through = plan_pass_through(result, next(iter(inputs.values())),
                                                       schema)
        return result

    def collected(self, port: str, table: pa.Table) -> pa.Table:
        rows, self._through_rows = self._through_rows, []
        if self._pass_through is None or not rows:
            return table
        return self._pass_through.restore(table, pa.Table.from_batches(rows))

    def teardown(self) -> None:
        self._through_rows = []
        super().teardown()


def sample_rows(schema: pa.Schema, rows: int) -> pa.RecordBatch:
    """``rows`` rows of ``schema`` for a warm-up: positive numbers of every magnitude from
    1 to about 10^9 (row ``i``: ``(i % 997 + 1) * 10 ** (i % 7)``) cast to each column's
    type (numbers, decimals, times, text, booleans); where they do not fit (a small
    integer or decimal), 1 to 997; nulls where no cast exists (nested types)."""
    index = np.arange(rows, dtype=np.int64)
    small = index % 997 + 1
    bases = (pa.array(small * 10 ** (index % 7)), pa.array(small))
    columns = []
    for field in schema:
        for base in bases:
            try:
                columns.append(_cast(base, field.type))
                break
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                continue
        else:
            columns.append(pa.nulls(rows, field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _cast(values: pa.Array, to: pa.DataType) -> pa.Array:
    """``values`` (int64) as ``to``; a decimal through one wide enough for any int64
    (Arrow casts int64 only to decimals of 19 digits or more before the point)."""
    if pa.types.is_decimal(to):
        values = values.cast(pa.decimal128(38, min(to.scale, 18)))
    return values.cast(to)


"""``SparkSql``: a Spark operator given as one SQL query, warmed on its own query.

When its input's schema is known before the first batch (a source's files, told by the
master; or the port's declared schema), ``setup`` runs the query twice over rows of that
schema, after the container's generic warm-up: Spark compiles the plan's code and the
JIT its loops then, not in the first windows. Measured on Nexmark's q1 (920,000 bids a
window, ``0.908 * price``, 2 cores, one run): the first three windows' jobs took 5.6, 3.2 and
2.0 s of the JVM's CPU and the later ones 1.3-1.5 s, where the generic warm-up (a keyed
count) had run before them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa

from weir.operators.operator import OperatorContext
from weir.operators.spark import SparkOperator
from weir.operators.spark_passthrough import PassThrough, plan_pass_through

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SparkSql", "sample_rows"]

_LOGGER = logging.getLogger("weir.operators.spark")

_WARM_ROUNDS = 2  # the first plans the pass-through, the second runs the planned shape
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

    def setup(self, context: OperatorContext) -> None:
        super().setup(context)
        self._warm_query(context)

    def _warm_query(self, context: OperatorContext) -> None:
        """Runs the query over rows of its inputs' schemas (see the module docs), when
        every input's is known and the application warms Spark (``SPARK_WARMUP_ROWS``).
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
            return
        kept = dict(self._input_schemas)
        try:
            for _ in range(_WARM_ROUNDS):
                self.rehearse({port: sample_rows(schema, rows)
                               for port, schema in schemas.items() if schema is not None})
            self._warmed = {port: s for port, s in schemas.items() if s is not None}
        except Exception as exc:  # noqa: BLE001 - a warm-up; the real windows say what is wrong
            _LOGGER.info("operator %s: its query could not be warmed on sample rows (%s: %s); "
                         "its first windows run cold", context.name, type(exc).__name__,
                         " ".join(str(exc).split())[:300])
            self._pass_through, self._planned = None, False
        finally:
            self._input_schemas = kept
            self._through_rows, self._through_count = [], 0

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
    """``rows`` rows of ``schema`` for a warm-up: small positive numbers (1 to 997) cast to
    each column's type (numbers, decimals, times, text, booleans); nulls where no cast
    exists (nested types)."""
    base = pa.array(np.arange(rows, dtype=np.int64) % 997 + 1)
    columns = []
    for field in schema:
        try:
            columns.append(base.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            columns.append(pa.nulls(rows, field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


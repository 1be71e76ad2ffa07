"""Window logic in Spark: a window's input arrives as DataFrames, its results leave as Arrow.

Nothing here imports pyspark until a window actually runs a job, so building a DAG needs
neither Java nor a SparkSession.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

from weir.operators.dead_letters import DeadLetters, dead_letters_of
from weir.operators.metrics import metric
from weir.operators.operator import Operator, OperatorContext, SparkBridge, without_default_port
from weir.operators.ports import InputPort, OutputPort, SchemaMismatch, conform
from weir.operators.spark_costs import JobCosts
from weir.operators.spark_dead_letters import is_spark_record_error, set_aside_bad_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SparkOperator", "SparkOperatorError", "SparkSchemaMismatch"]


def __getattr__(name: str) -> Any:
    """``SparkSql`` lives in ``operators.spark_sql``; it is found here too, where it was
    first (imports, and operators pickled by earlier versions)."""
    if name == "SparkSql":
        from weir.operators.spark_sql import SparkSql

        return SparkSql
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

_LOGGER = logging.getLogger(__name__)


class SparkOperatorError(RuntimeError):
    """A Spark operator is misused; the message names the operator and the fix."""


class SparkSchemaMismatch(SparkOperatorError, SchemaMismatch):
    """A Spark result does not fit its output port's schema (fatal: retrying cannot help)."""


class SparkOperator(Operator):
    """An operator whose window logic is a Spark job, run once per application window.

    Use it for anything that computes over a window's data (aggregations, joins, SQL):
    override ``transform``. The operator buffers the window's batches per input port; at
    the end of the application window it builds one DataFrame per input port, calls
    ``transform(inputs, window_id)`` and emits the resulting DataFrames' rows. A window
    without input rows runs no Spark job and emits nothing.

    Ports: ``input`` and ``output`` by default. Declaring any input port in a subclass
    replaces the default ``input``; declaring any output port replaces ``output``. An
    input port without data in a window still gets an (empty) DataFrame, with its
    declared schema or the schema it had last. Results are cast to the output port's
    declared schema, if any (see ``output_schema``).

    Subclasses that override ``setup``, ``begin_window``, ``process`` or ``end_window``
    must call ``super()``. ``transform`` must not keep its DataFrames beyond the window:
    keep state as Arrow (an attribute, so it is checkpointed) and hand it to Spark each
    window with ``self.spark.to_dataframe``.

    Example:
        >>> class Distinct(SparkOperator):
        ...     def transform(self, inputs, window_id):
        ...         return inputs["input"].distinct()
        >>> sorted(Distinct.input_ports()), sorted(Distinct.output_ports())
        (['input'], ['output'])
    """

    USES_SPARK: ClassVar[bool] = True

    input = InputPort()
    output = OutputPort()

    #: not checkpointed: the bridge and Spark sessions are recreated in ``setup``; the
    #: cost counters start again with each deployment.
    NON_STATE: ClassVar[tuple[str, ...]] = ("_spark", "_sql_session", "_costs", "_inputs",
                                            "_dead_letters", "_window_rows")
    _TRANSIENT: ClassVar[tuple[str, ...]] = NON_STATE

    # what ``setup`` sets, as class defaults: a subclass need not call ``__init__``, and a
    # restored operator has none of the NON_STATE ones until ``setup``
    _spark: SparkBridge | None = None
    _sql_session: SparkSession | None = None
    _costs: JobCosts | None = None
    _dead_letters: DeadLetters | None = None
    _operator_name = ""
    _window_id = -1
    _inputs: ClassVar[dict[str, Any]] = {}  # (never written: replaced per instance)
    _input_schemas: ClassVar[dict[str, pa.Schema]] = {}
    _window_rows: ClassVar[dict[str, list[pa.RecordBatch]]] = {}

    # -- what subclasses implement ---------------------------------------------------
    def transform(
        self, inputs: dict[str, DataFrame], window_id: int
    ) -> DataFrame | dict[str, DataFrame | None] | None:
        """The window logic.

        Args:
            inputs: one DataFrame per input port, named like the port.
            window_id: the application window's first streaming window id.

        Returns:
            A DataFrame (for the only output port), a dict ``{output port: DataFrame}``,
            or None to emit nothing.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement transform()")

    def output_schema(self, port: str) -> pa.Schema | None:
        """The schema results on ``port`` are cast to; default the port's declared one."""
        spec = type(self).output_ports().get(port)
        return spec.schema if spec is not None else None

    def collected(self, port: str, table: pa.Table) -> pa.Table:
        """A window's result for ``port``, back from Spark, before it is emitted; override
        to keep state from it (then return what goes out)."""
        return table

    def dataframe_session(self) -> SparkSession | None:
        """The session to build input DataFrames in; None = the bridge's session."""
        return None

    # -- ports -------------------------------------------------------------------------
    @classmethod
    def input_ports(cls) -> dict[str, InputPort]:
        return without_default_port(super().input_ports(), "input",
                                    SparkOperator.__dict__["input"])

    @classmethod
    def output_ports(cls) -> dict[str, OutputPort]:
        return without_default_port(super().output_ports(), "output",
                                    SparkOperator.__dict__["output"])

    # -- hooks -------------------------------------------------------------------------
    def setup(self, context: OperatorContext) -> None:
        self._operator_name = context.name
        self._spark = context.spark
        self._dead_letters = dead_letters_of(self, context)
        self._inputs, self._window_rows = {}, {}
        self._input_schemas = dict(self._input_schemas)  # (state: kept by checkpoints)
        if context.spark is None:
            raise SparkOperatorError(self._no_spark_message())

    def activate(self, context: OperatorContext) -> None:
        """Waits for the container's Spark, which began to start as the container did,
        then warms this operator's own query if it can (``warm_own_query``), else jobs of
        the common shape (the bridge's ``warm_up``), bounded by ``SPARK_WARMUP_MILLIS``.
        The sources already run; this operator's input waits upstream meanwhile."""
        if not self.warm_own_query(context):
            self.spark.warm_up()

    def warm_own_query(self, context: OperatorContext) -> bool:
        """Runs this operator's own query over made-up rows (its first window then pays
        neither Spark's class loading nor the cold JIT for it); whether it did. The
        default cannot (False): the common shape is warmed instead."""
        return False

    def begin_window(self, window_id: int) -> None:
        self._window_id = window_id

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        window_input = self._inputs.get(port)
        if window_input is None:
            self.spark  # noqa: B018 - says so if ``setup`` was not called
            spec = type(self).input_ports().get(port)
            schema = (spec.schema if spec is not None else None) or batch.schema
            self._input_schemas[port] = schema
            if batch.num_rows == 0:
                return  # a schema, no rows: nothing to hand to Spark yet
        batch = conform(batch, self._input_schemas[port],
                        f"operator {self._name!r}, input port {port!r}")
        if self._dead_letters is not None:  # kept to isolate bad rows
            self._window_rows.setdefault(port, []).append(batch)
        rows = self._spark_rows(port, batch)
        if window_input is None:
            window_input = self._inputs[port] = self.spark.window_input(rows.schema)
        with self._job_costs().phase("write"):  # while the window's input arrives
            window_input.append(rows)

    def _spark_rows(self, port: str, batch: pa.RecordBatch) -> pa.RecordBatch:
        """What of an arriving batch is handed to Spark (all of it, here)."""
        return batch

    def end_window(self) -> None:
        inputs, self._inputs = self._inputs, {}
        if not any(window_input.num_rows for window_input in inputs.values()):
            for window_input in inputs.values():
                window_input.discard()
            return
        spark = self.spark
        window_id = self._window_id
        costs = self._job_costs()
        rows, self._window_rows = self._window_rows, {}
        try:
            self._run_job(spark, window_id, inputs, costs)
        except Exception as exc:
            dead = self._dead_letters
            if dead is None or not is_spark_record_error(exc):
                raise

            def rerun(tables: dict[str, pa.Table], emit: bool) -> None:
                self._run_job(spark, window_id, self._buffered(tables), costs, emit=emit)

            set_aside_bad_rows(rows, exc, rerun, dead, window_id)
        finally:
            for window_input in inputs.values():  # a job that failed before taking them
                window_input.discard()

    def _buffered(self, tables: dict[str, pa.Table]) -> dict[str, Any]:
        """Window inputs over tables (the rows of a retry), written as a window's are."""
        inputs: dict[str, Any] = {}
        for port, table in tables.items():
            if table.num_rows:
                window_input = inputs[port] = self.spark.window_input(table.schema)
                for batch in table.to_batches():
                    window_input.append(batch)
        return inputs

    def _run_job(self, spark: SparkBridge, window_id: int, inputs: dict[str, Any],
                 costs: JobCosts, *, emit: bool = True) -> None:
        schemas = self._input_schemas
        with spark.job(), costs.job():
            session = self.dataframe_session()
            frames: dict[str, DataFrame] = {}
            for port, spec in type(self).input_ports().items():
                window_input = inputs.pop(port, None)
                with costs.phase("handoff"):
                    if window_input is not None:
                        costs.rows_in += window_input.num_rows
                        frames[port] = window_input.dataframe(session)
                        continue
                    schema = spec.schema or schemas.get(port)
                    if schema is None:
                        raise SparkOperatorError(
                            f"operator {self._name!r}: input port {port!r} has had no data "
                            "yet and declares no schema, so Spark cannot know its columns; "
                            f"declare it as InputPort(pa.schema([...])) in "
                            f"{type(self).__name__}")
                    extra = {} if session is None else {"session": session}
                    frames[port] = spark.to_dataframe([], schema, **extra)
            with costs.phase("job"):  # Spark is lazy: the job runs in to_arrow
                outputs = self._outputs(self.transform(frames, window_id))
                tables = {port: spark.to_arrow(df) for port, df in outputs.items()}
            if not emit:
                return
            with costs.phase("emit"):
                for port, table in tables.items():
                    table = self.collected(port, table)
                    schema = self.output_schema(port)
                    if schema is not None:
                        table = _conform(table, schema,
                                         f"operator {self._name!r}, port {port!r}")
                    if table.num_rows:
                        getattr(self, port).emit(table)

    def rehearse(self, rows: dict[str, pa.RecordBatch]) -> None:
        """Runs one window's job over ``rows`` (by input port) and throws its results
        away: nothing is emitted, counted in ``spark_costs`` or kept. For warming the
        job's own code before the first window (``SparkSql`` does, see ``setup``)."""
        costs, self._costs = self._costs, JobCosts()
        try:
            self.begin_window(-1)
            for port, batch in rows.items():
                self.process(port, batch)
            inputs, self._inputs = self._inputs, {}
            try:
                self._run_job(self.spark, -1, inputs, self._costs, emit=False)
            finally:
                for window_input in inputs.values():
                    window_input.discard()
        finally:
            self._costs, self._inputs, self._window_rows = costs, {}, {}

    def teardown(self) -> None:
        self._sql_session = None
        for window_input in self._inputs.values():
            window_input.discard()  # a window cut short: its file goes
        self._inputs = {}

    def _job_costs(self) -> JobCosts:
        if self._costs is None:
            self._costs = JobCosts()
        return self._costs

    @metric("spark")
    def spark_costs(self) -> dict[str, float]:
        """Where this deployment's window jobs spent their time, as running totals: jobs,
        rows handed to Spark, and ms writing the input as it arrived (``write``), handing
        it over at the window's end (``handoff``), in the job (the transform, run by Spark,
        and its results back as Arrow) and emitting them (``collected`` and out)."""
        return self._costs.figures() if self._costs is not None else {}

    # -- helpers -----------------------------------------------------------------------
    @property
    def spark(self) -> SparkBridge:
        """The container's Spark bridge (available from ``setup`` on)."""
        spark = self._spark
        if spark is None:
            if not self._operator_name:
                raise SparkOperatorError(
                    f"{type(self).__name__}: setup(context) was not called; subclasses that "
                    "override setup must call super().setup(context)"
                )
            raise SparkOperatorError(self._no_spark_message())
        return spark

    @property
    def _name(self) -> str:
        return self._operator_name or type(self).__name__

    def _no_spark_message(self) -> str:
        return (
            f"operator {self._name!r} ({type(self).__name__}) runs its window logic in Spark, "
            "but its context has no Spark bridge (context.spark is None); run it in a "
            "container with Spark, or in tests pass OperatorContext(spark="
            "SparkSessionBridge(...))"
        )

    def _outputs(self, result: Any) -> dict[str, DataFrame]:
        from pyspark.sql import DataFrame

        ports = list(type(self).output_ports())
        if result is None:
            return {}
        if isinstance(result, DataFrame):
            if len(ports) != 1:
                raise SparkOperatorError(
                    f"operator {self._name!r}: transform returned one DataFrame but the "
                    f"operator has output ports {ports}; return a dict {{port: DataFrame}}"
                )
            return {ports[0]: result}
        if isinstance(result, dict):
            outputs: dict[str, DataFrame] = {}
            for port, df in result.items():
                if port not in ports:
                    raise SparkOperatorError(
                        f"operator {self._name!r}: transform returned a result for {port!r}, "
                        f"which is not one of its output ports {ports}"
                    )
                if df is None:
                    continue
                if not isinstance(df, DataFrame):
                    raise SparkOperatorError(
                        f"operator {self._name!r}: transform returned a {type(df).__name__} "
                        f"for port {port!r}; return a Spark DataFrame (or None)"
                    )
                outputs[port] = df
            return outputs
        raise SparkOperatorError(
            f"operator {self._name!r}: transform returned a {type(result).__name__}; return "
            "a Spark DataFrame, a dict {output port: DataFrame}, or None"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in self._TRANSIENT:
            state.pop(name, None)
        return state


def _conform(table: pa.Table, schema: pa.Schema, where: str) -> pa.Table:
    missing = [name for name in schema.names if name not in table.column_names]
    if missing:
        raise SparkSchemaMismatch(
            f"{where}: the result has no column(s) {missing} of the output schema; its "
            f"columns are {table.column_names}: fix the query or the output schema"
        )
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SparkSchemaMismatch(
            f"{where}: the result cannot be cast to the output schema: {exc}"
        ) from None

"""Ready-made Spark window logic: split text into words, count (and sum) per key per window."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar

import pyarrow as pa

from weir.operators.library.key_codes import KeyCodes, encodable
from weir.operators.library.running_count import RunningCount  # here before it had a file
from weir.operators.spark import SparkOperator

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["RunningCount", "Tokenize", "WindowedCount", "WindowedCountUnifier"]

_LOGGER = logging.getLogger(__name__)


class Tokenize(SparkOperator):
    """Splits a text column into lower-case words, one row per word.

    Use it in front of a word count. A word is a run of ASCII letters after lower-casing:
    the same as Python's ``re.findall(r"[a-z]+", text.lower())``. The output has one
    string column, ``output_column``.

    Args:
        column: the input text column.
        output_column: the name of the word column.

    Example:
        >>> Tokenize().output_schema("output")
        word: string
    """

    COLUMNS_READ: ClassVar[tuple[str, ...]] = ("column",)  # checked at submit

    def __init__(self, column: str = "line", output_column: str = "word") -> None:
        self.column = column
        self.output_column = output_column

    def output_schema(self, port: str) -> pa.Schema:
        return pa.schema([(self.output_column, pa.string())])

    def transform(self, inputs: dict[str, DataFrame], window_id: int) -> DataFrame:
        from pyspark.sql import functions as F  # noqa: N812 - the usual name

        word = F.explode(F.split(F.lower(F.col(self.column)), "[^a-z]+"))
        out = self.output_column
        return inputs["input"].select(word.alias(out)).where(F.col(out) != "")


class WindowedCount(SparkOperator):
    """Counts rows per key in each application window (and sums a value column).

    Use it for per-window aggregates; raise ``APPLICATION_WINDOW_COUNT`` to aggregate over
    longer windows (and run fewer, bigger Spark jobs). Output columns: ``key`` (named as
    the key column), ``count`` (int64), ``sum`` (int64, only when ``value`` is given)
    and ``window_id`` (int64, the application window's first streaming window id).

    Args:
        key: the column to group by.
        value: a numeric column to sum, or None.

    Example:
        >>> WindowedCount(key="key", value="value").output_schema("output").names
        ['key', 'count', 'sum', 'window_id']
    """

    #: the window's key codes are not state: a window ends with its job
    NON_STATE: ClassVar[tuple[str, ...]] = (*SparkOperator.NON_STATE, "_codes")
    _TRANSIENT: ClassVar[tuple[str, ...]] = (*SparkOperator._TRANSIENT, "_codes")

    COLUMNS_READ: ClassVar[tuple[str, ...]] = ("key", "value")  # checked at submit

    def __init__(self, key: str = "word", value: str | None = None) -> None:
        self.key = key
        self.value = value

    def output_schema(self, port: str) -> pa.Schema | None:
        key_type = self.__dict__.get("_key_type") or pa.string()
        if pa.types.is_string(key_type) or pa.types.is_large_string(key_type):
            key_type = pa.string()
        elif not (pa.types.is_integer(key_type) or pa.types.is_floating(key_type)
                  or pa.types.is_boolean(key_type)):
            return None  # another key type: as Spark returns it
        fields = [pa.field(self.key, key_type), pa.field("count", pa.int64())]
        if self.value is not None:
            fields.append(pa.field("sum", pa.int64()))
        fields.append(pa.field("window_id", pa.int64()))
        return pa.schema(fields)

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        if "_key_type" not in self.__dict__:
            index = batch.schema.get_field_index(self.key)
            if index >= 0:
                self._key_type = batch.schema.field(index).type
        # Only the columns the aggregation reads go to Spark (zero-copy; less to write).
        needed = [c for c in (self.key, self.value) if c is not None]
        if all(batch.schema.get_field_index(c) >= 0 for c in needed):
            batch = batch.select(needed)
            batch = self._coded(batch)
        super().process(port, batch)

    def _coded(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """String keys as the window's int32 codes: Spark groups integers faster, and the
        codes are mapped back in ``collected`` (see ``operators.library.key_codes``)."""
        index = batch.schema.get_field_index(self.key)
        codes: KeyCodes | None = self.__dict__.get("_codes")
        if codes is None:
            codes = self._codes = KeyCodes()
        if not (codes.enabled and encodable(batch.schema.field(index).type)):
            return batch
        return batch.set_column(index, self.key, codes.encode(batch.column(index)))

    def collected(self, port: str, table: pa.Table) -> pa.Table:
        codes: KeyCodes | None = self.__dict__.get("_codes")
        if codes is None or codes.keys is None:
            return table
        index = table.schema.get_field_index(self.key)
        return table.set_column(index, self.key, codes.decode(table.column(index)))

    def end_window(self) -> None:
        try:
            super().end_window()
        finally:
            codes: KeyCodes | None = self.__dict__.get("_codes")
            if codes is not None:
                codes.reset()

    def unifier(self) -> WindowedCountUnifier:
        """Partitions count their own rows: the unifier adds up their counts per key and
        window (a key split over partitions, when the partition key is another column)."""
        return WindowedCountUnifier(key=self.key, value=self.value)

    def transform(self, inputs: dict[str, DataFrame], window_id: int) -> DataFrame:
        from pyspark.sql import functions as F  # noqa: N812 - the usual name

        aggregates = [F.count(F.lit(1)).cast("long").alias("count")]
        if self.value is not None:
            aggregates.append(F.sum(F.col(self.value)).cast("long").alias("sum"))
        return (inputs["input"].groupBy(F.col(self.key)).agg(*aggregates)
                .withColumn("window_id", F.lit(window_id).cast("long")))


class WindowedCountUnifier(WindowedCount):
    """Adds up the partial counts (and sums) of ``WindowedCount`` partitions per key and
    window, in Spark like the count itself.

    Every partition's port (``input-<i>``) feeds one DataFrame; the output has the
    count's columns. Runs once per streaming window (the master gives unifiers
    ``APPLICATION_WINDOW_COUNT=1``): all partitions emit an application window's counts in
    the same streaming window, so each is added up whole.
    """

    COLUMNS_READ: ClassVar[tuple[str, ...]] = ()  # the count's output, not the user's columns

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        if "_key_type" not in self.__dict__:
            index = batch.schema.get_field_index(self.key)
            if index >= 0:
                self._key_type = batch.schema.field(index).type
        columns = [c for c in (self.key, "count", "sum" if self.value else None,
                               "window_id") if c is not None]
        if all(batch.schema.get_field_index(c) >= 0 for c in columns):
            batch = batch.select(columns)
        SparkOperator.process(self, "input", batch)  # one DataFrame over all partitions

    def unifier(self) -> None:
        return None

    def transform(self, inputs: dict[str, DataFrame], window_id: int) -> DataFrame:
        from pyspark.sql import functions as F  # noqa: N812 - the usual name

        aggregates = [F.sum(F.col("count")).cast("long").alias("count")]
        if self.value is not None:
            aggregates.append(F.sum(F.col("sum")).cast("long").alias("sum"))
        return (inputs["input"].groupBy(F.col(self.key), F.col("window_id")).agg(*aggregates)
                .select(self.key, *(["count", "sum"] if self.value else ["count"]),
                        "window_id"))

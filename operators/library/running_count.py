"""``RunningCount``: a total per key over the whole stream, its state in a local keyed store."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import pyarrow as pa

from weir.operators.operator import Operator, OperatorContext
from weir.operators.partitioning import PartitionFilter
from weir.operators.spark import SparkOperator
from weir.operators.state_store import KeyedStore, StoreError, StoreHandle
from weir.operators.store_backed import StoreBacked

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["RunningCount"]

_LOGGER = logging.getLogger(__name__)

STORE_FILE = "running-count.sqlite"


class RunningCount(StoreBacked, SparkOperator):
    """Counts rows per key over the whole stream: each window emits the new total of every
    key it saw.

    Use it for totals that grow with the stream (words seen so far, events per user).
    Spark counts the window's rows per key; only those counts come back, and a local
    keyed store (``operators.state_store``, sqlite under the operator's ``STATE_DIR``)
    adds them to the totals. A window's cost follows its rows and the keys it touches,
    not every key ever seen, the totals need not fit in memory, and a checkpoint holds
    only the store's handle (an undo log takes the store back to it on recovery). Needs
    a local ``STATE_DIR``. Partition it on its key (``PARTITION_KEY``): a run-time
    repartition moves each key's total to the partition that receives its rows (the old
    stores must be on the new partition's machine). Rows with a null key are not counted.
    Output columns: ``key`` (named as the key column), ``count`` (int64, the total so
    far) and ``window_id`` (int64).

    Args:
        key: the column to count by.
        ttl_windows: forget a key not seen for this many streaming windows (None: never).
        ttl_millis: the same in milliseconds (rounded up to whole streaming windows).

    Example:
        >>> RunningCount(key="user").output_schema("output").names
        ['user', 'count', 'window_id']
    """

    STORE_FILE = STORE_FILE
    NON_STATE: ClassVar[tuple[str, ...]] = (*SparkOperator.NON_STATE,
                                            *StoreBacked.STORE_NON_STATE)
    _TRANSIENT: ClassVar[tuple[str, ...]] = (*SparkOperator._TRANSIENT,
                                             *StoreBacked.STORE_NON_STATE)
    METRICS: ClassVar[tuple[str, ...]] = ("state_keys",)

    COLUMNS_READ: ClassVar[tuple[str, ...]] = ("key",)  # checked at submit

    def __init__(self, key: str = "word", ttl_windows: int | None = None,
                 ttl_millis: int | None = None) -> None:
        if ttl_windows is not None and ttl_windows < 1 or ttl_millis is not None and \
                ttl_millis < 1:
            raise ValueError("RunningCount: ttl_windows and ttl_millis must be at least 1")
        self.key = key
        self.ttl_windows = ttl_windows
        self.ttl_millis = ttl_millis
        self.state: StoreHandle | None = None  # the store's file and last applied window
        self.key_type: pa.DataType | None = None

    def output_schema(self, port: str) -> pa.Schema | None:
        key_type = self.__dict__.get("key_type") or pa.string()
        if pa.types.is_large_string(key_type):
            key_type = pa.string()
        return pa.schema([pa.field(self.key, key_type), pa.field("count", pa.int64()),
                          pa.field("window_id", pa.int64())])

    @property
    def state_keys(self) -> int:
        """How many keys the store holds (the state's size)."""
        store: KeyedStore | None = self.__dict__.get("_store")
        return store.keys if store is not None else 0

    # -- lifecycle -------------------------------------------------------------------
    def setup(self, context: OperatorContext) -> None:
        self.check_partition_key(context, [self.key])  # its totals could not be split
        super().setup(context)
        legacy = self.__dict__.pop("totals", None)  # a checkpoint from before the store
        store = self.open_store(context, ttl_windows=self.ttl_windows,
                                ttl_millis=self.ttl_millis)
        if isinstance(legacy, pa.Table):
            store.load(context.recovered_window, zip(legacy.column(self.key).to_pylist(),
                                                     legacy.column("count").to_pylist(),
                                                     strict=True))
            self.store_applied(store.applied)

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        index = batch.schema.get_field_index(self.key)
        if index >= 0:
            if self.__dict__.get("key_type") is None:
                self.key_type = batch.schema.field(index).type
            batch = batch.select([index])
        super().process(port, batch)

    def transform(self, inputs: dict[str, DataFrame], window_id: int) -> DataFrame:
        from pyspark.sql import functions as F  # noqa: N812 - the usual name

        return (inputs["input"].where(F.col(self.key).isNotNull()).groupBy(F.col(self.key))
                .agg(F.count(F.lit(1)).cast("long").alias("count")))

    def collected(self, port: str, table: pa.Table) -> pa.Table:
        """Adds the window's counts to the store; emits the new totals of its keys."""
        window_id = int(self.__dict__.get("_window_id", -1))
        context: OperatorContext = self._context
        context.check_fence()  # a replaced deployment must not write the store
        table = table.sort_by(self.key)  # the store's B-tree in order: fewer page visits
        keys, totals = self.store.apply(window_id, table.column(self.key).to_pylist(),
                                        table.column("count").to_pylist())
        self.store_applied(window_id)
        key_type = table.schema.field(self.key).type
        return pa.table({self.key: pa.array(keys, key_type),
                         "count": pa.array(totals, pa.int64()),
                         "window_id": pa.array([window_id] * len(keys), pa.int64())})

    def checkpointed(self, window_id: int) -> None:
        self.store_checkpointed()

    def committed(self, window_id: int) -> None:
        self.store_committed(window_id)

    def teardown(self) -> None:
        super().teardown()
        self.close_store()

    # -- repartitioning --------------------------------------------------------------
    def repartitioned(self, partitions: Sequence[Operator],
                      share: PartitionFilter | None) -> Operator:
        """The new partition's handle names the old stores and its share of the keys
        (``StoreBacked.seed_handle``)."""
        if any(old.__dict__.get("totals") is not None for old in partitions):
            raise StoreError("RunningCount: an old partition's checkpoint predates the "
                             "keyed store (its totals are in memory); let it checkpoint "
                             "once on this version before repartitioning")
        self.state = self.seed_handle(partitions, share)
        key_types = [t for t in (p.__dict__.get("key_type") for p in partitions) if t]
        self.key_type = key_types[0] if key_types else None
        return self

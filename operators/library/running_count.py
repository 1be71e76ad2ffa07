"""``RunningCount``: a total per key over the whole stream, its state in a local keyed store."""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import pyarrow as pa

from weir.operators.operator import Operator, OperatorContext
from weir.operators.partitioning import PartitionFilter
from weir.operators.spark import SparkOperator, SparkSchemaMismatch
from weir.operators.state_store import KeyedStore, StoreError, StoreHandle, StoreSeed

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["RunningCount"]

_LOGGER = logging.getLogger(__name__)

STORE_FILE = "running-count.sqlite"


class RunningCount(SparkOperator):
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

    NON_STATE: ClassVar[tuple[str, ...]] = (*SparkOperator.NON_STATE, "_store", "_context",
                                            "_scratch")
    _TRANSIENT: ClassVar[tuple[str, ...]] = (*SparkOperator._TRANSIENT, "_store", "_context",
                                             "_scratch")
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
        partition_key = context.attributes.get("PARTITION_KEY")
        if partition_key and partition_key != self.key:  # its totals could not be split
            raise SparkSchemaMismatch(
                f"operator {context.name!r}: RunningCount(key={self.key!r}) keeps its totals "
                f"by {self.key!r} but PARTITION_KEY is {partition_key!r}; partition it by "
                f"its key: -D {context.name}.PARTITION_KEY={self.key}")
        path = self._store_path(context)
        super().setup(context)
        self._context = context
        ttl = self.ttl_windows
        if self.ttl_millis is not None:
            ttl = math.ceil(self.ttl_millis / context.window_size_millis)
        store = self._store = KeyedStore(path, ttl)
        handle: StoreHandle | None = self.__dict__.get("state")
        legacy = self.__dict__.pop("totals", None)  # a checkpoint from before the store
        if handle is not None and handle.seed is not None:
            share = handle.seed.share
            cut = PartitionFilter.from_json(share) if share is not None else None
            store.seed_from(handle.seed.sources, cut.owns if cut is not None else None)
        if isinstance(legacy, pa.Table):
            store.load(context.recovered_window, zip(legacy.column(self.key).to_pylist(),
                                                     legacy.column("count").to_pylist(),
                                                     strict=True))
        elif context.recovered_window < 0 and (handle is None or handle.seed is None):
            store.reset()  # fresh: nothing of an earlier run counts
        else:
            store.restore_to(context.recovered_window)
            if handle is not None and store.applied < handle.applied:
                raise StoreError(
                    f"operator {context.name!r}: its store {path} holds windows up to "
                    f"{store.applied}, but its checkpoint counts on {handle.applied} (the "
                    "machine lost writes that were not yet synced); the totals cannot be "
                    "recovered exactly")
        self.state = StoreHandle(path, store.applied)

    def _store_path(self, context: OperatorContext) -> str:
        """The store's file under the operator's own folder (the same for each instance)."""
        if context.state_dir:
            return os.path.join(context.durable_dir(), STORE_FILE)
        state_dir = str(context.attributes.get("STATE_DIR") or "")
        if state_dir:
            raise StoreError(
                f"operator {context.name!r}: RunningCount keeps its totals in a local store "
                f"(sqlite) under STATE_DIR, but STATE_DIR is {state_dir!r}, not a local path; "
                "set STATE_DIR to a local path (or file://...) for this application")
        # no runtime folder at all (unit tests): a scratch one, gone at teardown
        scratch = self._scratch = tempfile.mkdtemp(prefix="weir-running-count-")
        _LOGGER.warning("operator %s: no STATE_DIR; its totals go to %s and are not durable",
                        context.name, scratch)
        return os.path.join(scratch, STORE_FILE)

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
        keys, totals = self._store.apply(window_id, table.column(self.key).to_pylist(),
                                         table.column("count").to_pylist())
        self.state = StoreHandle(self._store.path, window_id)
        key_type = table.schema.field(self.key).type
        return pa.table({self.key: pa.array(keys, key_type),
                         "count": pa.array(totals, pa.int64()),
                         "window_id": pa.array([window_id] * len(keys), pa.int64())})

    def checkpointed(self, window_id: int) -> None:
        """The windows the checkpoint counts on reach the disk (see ``StoreHandle``:
        a power loss before this is found at recovery, never silently wrong)."""
        store: KeyedStore | None = self.__dict__.get("_store")
        if store is not None:
            store.sync()

    def committed(self, window_id: int) -> None:
        store: KeyedStore | None = self.__dict__.get("_store")
        if store is not None:
            store.committed(window_id)

    def teardown(self) -> None:
        super().teardown()
        store: KeyedStore | None = self.__dict__.pop("_store", None)
        if store is not None:
            store.close()
        scratch = self.__dict__.pop("_scratch", None)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)

    # -- repartitioning --------------------------------------------------------------
    def repartitioned(self, partitions: Sequence[Operator],
                      share: PartitionFilter | None) -> Operator:
        """The new partition's handle names the old stores (as of each one's checkpoint)
        and its share of the keys; ``setup`` copies them into its own store, once."""
        sources: list[tuple[str, int]] = []
        for old in partitions:
            handle: StoreHandle | None = old.__dict__.get("state")
            if old.__dict__.get("totals") is not None:
                raise StoreError("RunningCount: an old partition's checkpoint predates the "
                                 "keyed store (its totals are in memory); let it checkpoint "
                                 "once on this version before repartitioning")
            if handle is not None:
                sources.append((handle.path, handle.applied))
        seed = StoreSeed(tuple(sources), share.to_json() if share is not None else None)
        self.state = StoreHandle("", max((w for _, w in sources), default=-1), seed)
        key_types = [t for t in (p.__dict__.get("key_type") for p in partitions) if t]
        self.key_type = key_types[0] if key_types else None
        return self

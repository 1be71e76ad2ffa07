"""A replayable Kafka source: offsets it owns, windows it can read again, commits that
follow what is durable downstream."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pyarrow as pa

from weir.operators.dead_letters import DeadLetters, dead_letters_of
from weir.operators.library.kafka_client import (
    LIBRDKAFKA_LOG,
    client_config,
    kafka,
    owns_partition,
    partition_key,
    split_key,
    topic_partitions,
)
from weir.operators.library.kafka_records import (
    decode_setting_aside,
    record_schema,
    records_to_batch,
)
from weir.operators.metrics import metric
from weir.operators.operator import Operator, OperatorContext
from weir.operators.partitioning import PartitionFilter
from weir.operators.ports import OutputPort
from weir.operators.windows import format_window_id
from weir.storage.replayable import ReplayableSource, take_committed

__all__ = ["KafkaSource"]

_LOGGER = logging.getLogger(__name__)

_START_POSITIONS = ("earliest", "latest", "group")
_POLL_S = 0.05  # a read call waits this long for records at most
_REPLAY_TIMEOUT_S = 120.0  # a replayed window's records must come back within this
_FIXED = {"enable.auto.commit": False, "enable.auto.offset.store": False,
          "enable.partition.eof": False, "auto.offset.reset": "error"}
_DEFAULTS = {"isolation.level": "read_committed", "fetch.wait.max.ms": 100,
             "queued.max.messages.kbytes": 65536, "socket.keepalive.enable": True}


class KafkaSource(ReplayableSource):
    """Reads Kafka topics; each record is a row, each window's offsets can be read again.

    Use it to bring a Kafka topic (or several) into a DAG, exactly once: the read position
    (one offset per topic partition) is checkpointed with the operator and each window's
    offset ranges are logged, so a recovered source re-reads identical windows, and an
    exactly-once sink downstream publishes every record's result once. Weir places the
    partitions itself (no consumer-group rebalancing): with ``PARTITIONS=N``, source
    partition i reads the topic partitions that map to it, and partitions added to a topic
    while it runs are read from their start. Once windows are committed, their offsets are
    committed to the consumer group ``group_id`` (only then: what downstream made durable),
    so Kafka's lag tools see real progress; Weir itself never reads them back unless
    ``start_from="group"``.

    Rows have the columns ``key`` (binary), the value (``value``: binary for
    ``value_format="bytes"``, string for ``"utf8"``; or, for ``"json"``, one column per
    field of ``value_schema``), ``topic``, ``partition``, ``offset``, ``timestamp`` and,
    with ``headers=True``, ``headers``. A record that does not decode stops the operator
    with an error naming its topic, partition and offset; nothing is skipped. With
    ``ON_ERROR="DEAD_LETTER"`` it goes to the ``errors`` port instead, as it came (its
    value as bytes) with the error, and reading goes on.

    Args:
        topics: a topic or a list of topics.
        bootstrap_servers: ``"host:port,host:port"``.
        group_id: the consumer group committed offsets go to (default
            ``weir.<operator name>``).
        start_from: where a partition with no checkpointed offset starts: ``"earliest"``,
            ``"latest"``, ``"group"`` (the group's committed offsets, else earliest), or
            a timestamp in epoch milliseconds (the first record at or after it).
        stop_at: None (read forever) or ``"end"``: the end offsets when the source first
            starts; the stream ends once they are read (tests, backfills).
        value_format: ``"bytes"``, ``"utf8"`` or ``"json"``.
        value_schema: for ``"json"``: the Arrow schema of the fields to read.
        headers: add a ``headers`` column (list of key/value structs).
        batch_records: records per emitted batch at most.
        records_per_window: read at most this many records per streaming window (None =
            as fast as possible), to spread a backlog over windows.
        config: more librdkafka consumer settings (security, timeouts); the ones Weir
            owns (auto commit, offset reset) are refused.

    Example:
        >>> src = KafkaSource("orders", "localhost:9092", value_format="utf8")
        >>> src.output_schema.names
        ['key', 'value', 'topic', 'partition', 'offset', 'timestamp']
    """

    output = OutputPort()
    SPLITS_INPUT = True
    WATERMARK_SPLITS = ("topic", "partition")  # each partition in order, not in step
    DEAD_LETTERS = True  # ON_ERROR="DEAD_LETTER": records that do not decode go to errors
    METRICS = ("records_read",)

    # the deployment's, never a checkpoint's: credentials stay out of checkpoints and
    # savepoints, and a new version's brokers and settings are not restored over
    SETTINGS: ClassVar[tuple[str, ...]] = ("bootstrap_servers", "config")
    NON_STATE: ClassVar[tuple[str, ...]] = (*ReplayableSource.NON_STATE, *SETTINGS,
                                            "_consumer", "_context", "_window_start", "_ends",
                                            "_owned", "_next_discovery", "_window_records",
                                            "_dead_letters")

    def __init__(self, topics: str | Sequence[str], bootstrap_servers: str,
                 group_id: str | None = None, start_from: str | int = "earliest",
                 stop_at: str | None = None, value_format: str = "bytes",
                 value_schema: pa.Schema | None = None, headers: bool = False,
                 batch_records: int = 10_000, records_per_window: int | None = None,
                 config: Mapping[str, Any] | None = None,
                 discover_partitions_s: float = 10.0) -> None:
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        if not self.topics or not all(isinstance(t, str) and t for t in self.topics):
            raise ValueError(f"topics must be a topic name or a list of them, not {topics!r}")
        if not bootstrap_servers:
            raise ValueError("bootstrap_servers is needed: 'host:port[,host:port...]'")
        if not (start_from in _START_POSITIONS or
                (isinstance(start_from, int) and not isinstance(start_from, bool)
                 and start_from >= 0)):
            raise ValueError(f"start_from must be one of {_START_POSITIONS} or a timestamp in "
                             f"epoch milliseconds, not {start_from!r}")
        if stop_at not in (None, "end"):
            raise ValueError(f"stop_at must be None or 'end', not {stop_at!r}")
        if batch_records <= 0:
            raise ValueError(f"batch_records must be positive, not {batch_records}")
        if records_per_window is not None and records_per_window <= 0:
            raise ValueError(f"records_per_window must be positive or None, not "
                             f"{records_per_window}")
        self.output_schema = record_schema(value_format, value_schema, headers)
        client_config(bootstrap_servers, config, _DEFAULTS, _FIXED, "KafkaSource")
        self.bootstrap_servers = bootstrap_servers
        self.group_id = group_id
        self.start_from = start_from
        self.stop_at = stop_at
        self.value_format = value_format
        self.headers = headers
        self.batch_records = batch_records
        self.records_per_window = records_per_window
        self.config = dict(config or {})
        self.discover_partitions_s = discover_partitions_s
        self.positions: dict[str, int] = {}  # "topic/partition" -> the next offset to read
        self.stop_offsets: dict[str, int] | None = None  # stop_at="end": where each ends
        self.records_read = 0
        self.reset_non_state()

    def reset_non_state(self) -> None:
        super().reset_non_state()
        self._consumer: Any = None
        self._context: OperatorContext | None = None
        self._window_start: dict[str, int] = {}
        self._ends: dict[int, dict[str, int]] = {}  # window -> positions at its end
        self._owned: list[str] = []
        self._next_discovery = 0.0
        self._window_records = 0
        self._dead_letters: DeadLetters | None = None

    def repartitioned(self, partitions: Sequence[Operator],
                      share: PartitionFilter | None) -> Operator:
        """A new partition takes every old partition's offsets; it reads those it owns."""
        for old in partitions:
            self.positions.update(getattr(old, "positions", {}))
            if getattr(old, "stop_offsets", None):
                self.stop_offsets = {**(self.stop_offsets or {}), **old.stop_offsets}
        return self

    # -- runtime hooks -----------------------------------------------------------------
    def setup(self, context: OperatorContext) -> None:
        self.reset_non_state()
        self._context = context
        self._dead_letters = dead_letters_of(self, context)  # records that do not decode
        config = client_config(
            self.bootstrap_servers, self.config, _DEFAULTS, _FIXED, f"operator {context.name!r}")
        config.setdefault("group.id", self.group_id or f"weir.{context.name}")
        config.setdefault("client.id", f"weir-{context.name}-{context.operator_id}")
        self._consumer = kafka().Consumer(config, logger=LIBRDKAFKA_LOG)
        try:
            self._discover(first=not self.positions,  # start_from: only with no offsets
                           first_deployment=context.recovered_window < 0)
            super().setup(context)
        except BaseException:
            self.teardown()
            raise
        self._ends = {context.recovered_window: dict(self.positions)} \
            if context.recovered_window >= 0 else {}
        _LOGGER.info("operator %s reads %d partition(s) of %s from %s", context.name,
                     len(self._owned), self.topics, self.bootstrap_servers)

    def begin_window(self, window_id: int) -> None:
        super().begin_window(window_id)
        self._window_start = {key: self.positions[key] for key in self._owned}
        self._window_records = 0

    def end_window(self) -> None:
        super().end_window()
        if self._window_id >= 0:
            self._ends[self._window_id] = dict(self.positions)

    def teardown(self) -> None:
        super().teardown()
        consumer, self._consumer = self.__dict__.get("_consumer"), None
        if consumer is not None:
            consumer.close()

    # -- ReplayableSource ------------------------------------------------------------
    def window_record(self) -> dict[str, list[int]]:
        """Every owned partition's ``[start, end)`` in the window (empty ranges too: a
        replay then restores positions resolved before the first checkpoint)."""
        return {key: [start, self.positions[key]] for key, start in self._window_start.items()}

    def read(self, limit: dict[str, list[int]] | None) -> bool:
        if limit is not None:
            self._read_again(limit)
            return True
        if self._done():
            return False
        if time.monotonic() >= self._next_discovery:
            self._discover(first=False)
        wanted = self.batch_records
        if self.records_per_window is not None:
            wanted = min(wanted, self.records_per_window - self._window_records)
            if wanted <= 0:
                return True
        messages = self._consumer.consume(wanted, _POLL_S)
        if messages:
            self._emit(self._checked(messages))
        self._advance_past_markers()
        return True

    def release(self, window_id: int) -> None:
        """Commits the offsets read up to ``window_id`` to the consumer group."""
        positions = take_committed(self._ends, window_id)
        if positions is None or self._consumer is None:
            return
        confluent = kafka()
        offsets = [confluent.TopicPartition(*split_key(key), offset)
                   for key, offset in positions.items() if key in self._owned and offset >= 0]
        if offsets:
            self._consumer.commit(offsets=offsets, asynchronous=True)

    # -- metrics -----------------------------------------------------------------------
    @metric
    def lag_total(self) -> int:
        """Declared before the per-partition figures: kept if a report has too many."""
        return sum(self.lag_by_partition().values())

    @metric("lag")
    def lag_by_partition(self) -> dict[str, int]:
        """Records behind the end, per topic partition (from the last fetch's end offset)."""
        consumer = self.__dict__.get("_consumer")
        if consumer is None:
            return {}
        confluent = kafka()
        lags = {}
        for key in self._owned:
            _, high = consumer.get_watermark_offsets(confluent.TopicPartition(*split_key(key)),
                                                     cached=True)
            if high >= 0:
                lags[key] = max(0, high - self.positions[key])
        return lags


    # -- helpers -----------------------------------------------------------------------
    @property
    def _name(self) -> str:
        context = self.__dict__.get("_context")
        return f"operator {context.name!r}" if context is not None else "KafkaSource"

    def _discover(self, first: bool, first_deployment: bool = False) -> None:
        """Finds this partition's topic partitions; new ones get a start offset and join
        the assignment (``first_deployment``: no broker or topic is a fatal error)."""
        assert self._context is not None
        self._next_discovery = time.monotonic() + self.discover_partitions_s
        index, count = self._context.partition_index, self._context.partition_count
        found = topic_partitions(self._consumer, self.topics, self.bootstrap_servers,
                                 self._name, first_deployment)
        owned = [partition_key(topic, p) for topic, ps in found.items() for p in ps
                 if owns_partition(topic, p, index, count)]
        new = [key for key in owned if key not in self._owned]
        if not new:
            return
        unknown = [key for key in new if key not in self.positions]
        if unknown:
            self.positions.update(self._start_offsets(unknown, first))
        if first and self.stop_at == "end" and self.stop_offsets is None:
            self.stop_offsets = {key: self._watermarks(key)[1] for key in owned}
        self._owned = owned
        if not first:
            _LOGGER.info("%s: reads new partition(s) %s from offsets %s", self._name, new,
                         [self.positions[k] for k in new])
            self._window_start.update({key: self.positions[key] for key in new})
        self._assign()

    def _start_offsets(self, keys: list[str], first: bool) -> dict[str, int]:
        """Where partitions with no checkpointed offset start; partitions found later
        start at their beginning (nothing written to them is missed)."""
        confluent = kafka()
        start = self.start_from if first else "earliest"
        offsets: dict[str, int] = {}
        if start == "group":
            committed = self._consumer.committed(
                [confluent.TopicPartition(*split_key(k)) for k in keys], timeout=10)
            offsets = {partition_key(tp.topic, tp.partition): tp.offset for tp in committed
                       if tp.offset >= 0}
        elif isinstance(start, int):
            found = self._consumer.offsets_for_times(
                [confluent.TopicPartition(*split_key(k), start) for k in keys], timeout=10)
            offsets = {partition_key(tp.topic, tp.partition): tp.offset for tp in found
                       if tp.offset >= 0}
            offsets.update({k: self._watermarks(k)[1] for k in keys if k not in offsets})
        for key in keys:
            if key not in offsets:
                low, high = self._watermarks(key)
                offsets[key] = high if start == "latest" else low
        return offsets

    def watermark_splits(self) -> list[str]:
        """Its topic partitions (``topic/partition``, the split columns joined)."""
        return list(self.__dict__.get("_owned") or ())

    def _watermarks(self, key: str) -> tuple[int, int]:
        confluent = kafka()
        try:
            return self._consumer.get_watermark_offsets(
                confluent.TopicPartition(*split_key(key)), timeout=10)
        except confluent.KafkaException as exc:
            raise ConnectionError(f"{self._name}: cannot read the offsets of {key} from "
                                  f"{self.bootstrap_servers!r}: {exc}") from None

    def _assign(self) -> None:
        confluent = kafka()
        self._consumer.assign([confluent.TopicPartition(*split_key(key), self.positions[key])
                               for key in self._owned])

    def _done(self) -> bool:
        stops = self.stop_offsets
        return stops is not None and all(self.positions.get(k, 0) >= end
                                         for k, end in stops.items())

    def _checked(self, messages: list[Any]) -> list[Any]:
        """The records among ``messages``; a consumer error stops the operator."""
        records = []
        for message in messages:
            error = message.error()
            if error is None:
                records.append(message)
                continue
            if error.code() == kafka().KafkaError._AUTO_OFFSET_RESET:
                raise RuntimeError(
                    f"{self._name}: the records at the read position of "
                    f"{partition_key(message.topic(), message.partition())} are gone from the "
                    f"brokers (deleted by retention before they were read): {error.str()}; "
                    "nothing is skipped silently: raise the topic's retention, or start anew "
                    "with start_from='earliest'")
            if error.fatal() or not error.retriable():
                raise RuntimeError(f"{self._name}: the Kafka consumer failed: {error.str()}")
            _LOGGER.warning("%s: Kafka consumer: %s (retried)", self._name, error.str())
        return records

    def _emit(self, records: list[Any], until: dict[str, int] | None = None) -> None:
        """Emits ``records`` before their partition's end (``until`` when replaying a
        window, else the bounded read's stop offsets) and moves the positions past them."""
        ends, unknown = (until, -1) if until is not None else (self.stop_offsets, 1 << 62)
        if ends is not None:
            records = [m for m in records
                       if m.offset() < ends.get(partition_key(m.topic(), m.partition()), unknown)]
        if not records:
            return
        for message in records:
            key = partition_key(message.topic(), message.partition())
            if key in self.positions and message.offset() >= self.positions[key]:
                self.positions[key] = message.offset() + 1
        dead = self.__dict__.get("_dead_letters")
        if dead is None:
            batch = records_to_batch(records, self.value_format, self.output_schema,
                                     self.headers)
        else:
            window_id = int(self.__dict__.get("_window_id", -1))
            batch = decode_setting_aside(
                records, self.value_format, self.output_schema, self.headers,
                lambda rows, error: dead.set_aside(rows, error, "output", window_id),
                dead.max_rows)
        self.records_read += batch.num_rows
        self._window_records += batch.num_rows
        self.output.emit(batch)

    def _advance_past_markers(self) -> None:
        """Moves positions past transaction markers and aborted records the consumer
        skipped (its position is past them), so a window's end is where reading stopped."""
        confluent = kafka()
        assigned = [confluent.TopicPartition(*split_key(k)) for k in self._owned]
        for tp in self._consumer.position(assigned):
            key = partition_key(tp.topic, tp.partition)
            if tp.offset > self.positions.get(key, 1 << 62):
                stop = (self.stop_offsets or {}).get(key)
                self.positions[key] = tp.offset if stop is None else min(tp.offset, stop)

    def _read_again(self, limit: dict[str, list[int]]) -> None:
        """Reads each partition's logged ``[start, end)`` again, exactly."""
        confluent = kafka()
        pending = {key: (start, end) for key, (start, end) in limit.items() if end > start}
        for key, (start, _end) in limit.items():
            if key in self.positions and self.positions[key] != start:
                raise RuntimeError(
                    f"{self._name}: the window log replays {key} from offset {start} but the "
                    f"restored position is {self.positions[key]}; the window log and the "
                    "checkpoint do not belong together")
        if pending:
            ends = {key: end for key, (_start, end) in pending.items()}
            self._consumer.assign([confluent.TopicPartition(*split_key(k), start)
                                   for k, (start, _end) in pending.items()])
            deadline = time.monotonic() + _REPLAY_TIMEOUT_S
            while pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self._name}: replaying window "
                                       f"{format_window_id(self._window_id)}: the records of "
                                       f"{sorted(pending)} did not come back within "
                                       f"{_REPLAY_TIMEOUT_S:g} s")
                messages = self._checked(self._consumer.consume(self.batch_records, _POLL_S))
                self._emit(messages, until=ends)
                for tp in self._consumer.position(
                        [confluent.TopicPartition(*split_key(k)) for k in list(pending)]):
                    key = partition_key(tp.topic, tp.partition)
                    if tp.offset >= ends[key]:
                        del pending[key]
        for key, (_start, end) in limit.items():
            self.positions[key] = end
        self._assign()

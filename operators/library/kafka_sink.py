"""An exactly-once Kafka sink: each window in one transaction with the sink's watermark.

``PostgresSink``'s rule on Kafka. A small progress topic holds, per sink partition, the
last window published (its watermark) and where the output topic's partitions ended
after it. Every window is one Kafka transaction: its records, then (once they are all
acknowledged) the progress record, then the commit. A window at or below the watermark
was published before a crash and is skipped when it is replayed. The transactional id
is the sink partition's, so a new deployment's producer fences the old one's.

Kafka aborts a transaction that a killed producer left open. Some Kafka-protocol brokers
do not: they keep it open (the sink aborts it at start) or show its records to
``read_committed`` readers. So at start the sink also reads its output partitions
past the watermark's offsets and counts the records its own earlier attempts left there
(each record carries its sink and window in headers); replaying those windows skips
that many identical records. The output is exactly once either way.
"""

from __future__ import annotations

import collections
import json
import logging
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import pyarrow as pa

from weir.operators.library.kafka_client import (
    LIBRDKAFKA_LOG,
    client_config,
    kafka,
    topic_partitions,
)
from weir.operators.library.kafka_records import json_value
from weir.operators.library.sinks import _WindowBuffer
from weir.operators.operator import OperatorContext, TransientNonState
from weir.operators.windows import format_window_id

__all__ = ["KafkaSink"]

_LOGGER = logging.getLogger(__name__)

SINK_HEADER = "weir.sink"
WINDOW_HEADER = "weir.window"
_TIMEOUT_S = 30.0
_FIXED_EXACTLY_ONCE = {"enable.idempotence": True}
_DEFAULTS = {"enable.idempotence": True, "linger.ms": 5, "partitioner": "murmur2_random",
             "compression.type": "lz4"}
_READ_CONFIG = {"enable.auto.commit": False, "enable.partition.eof": False,
                "isolation.level": "read_committed", "auto.offset.reset": "earliest"}


class KafkaSink(TransientNonState, _WindowBuffer):
    """Writes each window's rows to a Kafka topic, exactly once (or at least once).

    Use it to hand results to other Kafka consumers. Each row is one record: its key is
    ``key_column`` (None: no key) and its value ``value_column`` (a string or binary
    column) or, without one, the whole row as a JSON object. Records are
    partitioned by key as Kafka's Java producer does (murmur2; random without a key).

    With ``exactly_once`` (the default) each window is one transaction with the sink's
    watermark, written when the window ends: ``read_committed`` consumers see every
    window's records once and whole; ``read_uncommitted`` consumers may also see records
    of attempts that were aborted. The progress topic should be compacted (it is created
    so); a deployment that replaces a sink partition fences the old one. Without
    ``exactly_once`` records are produced (idempotently) and flushed at each window's
    end: at least once, no transactions, lower latency.

    Args:
        topic: the output topic (it must exist).
        bootstrap_servers: ``"host:port,host:port"``.
        key_column: the column that becomes each record's key, or None.
        value_column: the column that becomes each record's value (None: JSON rows).
        exactly_once: transactions and a watermark (True) or at least once (False).
        progress_topic: where the watermarks live (created if missing).
        sink_id: the watermark key's middle part instead of the operator name; two
            applications writing one topic through sinks of the same name need their own.
        config: more librdkafka producer settings (security, batching).

    Example:
        >>> KafkaSink("counts", "localhost:9092", key_column="word").topic
        'counts'
    """

    # the deployment's, never a checkpoint's: credentials stay out of checkpoints and
    # savepoints, and a new version's brokers and settings are not restored over
    SETTINGS: ClassVar[tuple[str, ...]] = ("bootstrap_servers", "config")
    NON_STATE: ClassVar[tuple[str, ...]] = (*SETTINGS, "_producer", "_context", "_key",
                                            "_watermark", "_offsets", "_leftovers",
                                            "_delivered", "_failures")
    METRICS = ("windows_written", "windows_skipped", "records_written", "leftovers_skipped")

    def __init__(self, topic: str, bootstrap_servers: str, key_column: str | None = None,
                 value_column: str | None = None, exactly_once: bool = True,
                 progress_topic: str = "weir_sink_progress", sink_id: str | None = None,
                 config: Mapping[str, Any] | None = None) -> None:
        if not topic:
            raise ValueError("KafkaSink needs a topic")
        if not bootstrap_servers:
            raise ValueError("bootstrap_servers is needed: 'host:port[,host:port...]'")
        client_config(bootstrap_servers, config, _DEFAULTS,
                      _FIXED_EXACTLY_ONCE if exactly_once else {}, "KafkaSink")
        if exactly_once and config and "transactional.id" in config:
            raise ValueError("KafkaSink: transactional.id is set by Weir (one per sink "
                             "partition); leave it out of config")
        self.topic = topic
        self.bootstrap_servers = bootstrap_servers
        self.key_column = key_column
        self.value_column = value_column
        self.exactly_once = exactly_once
        self.progress_topic = progress_topic
        self.sink_id = sink_id
        self.config = dict(config or {})
        self.windows_written = 0
        self.windows_skipped = 0
        self.records_written = 0
        self.leftovers_skipped = 0
        self.reset_non_state()

    def reset_non_state(self) -> None:
        self._producer: Any = None
        self._context: OperatorContext | None = None
        self._key = ""
        self._watermark = -1
        self._offsets: dict[int, int] = {}  # output partition -> its end after the watermark
        # window -> (key, value) -> records an earlier attempt of it left in the topic
        self._leftovers: dict[int, collections.Counter[tuple[bytes | None, bytes | None]]] = {}
        self._delivered: dict[int, int] = {}
        self._failures: list[str] = []

    def repartition_refusal(self) -> str | None:
        return ("KafkaSink keeps each partition's watermark under its operator id; new "
                "partitions would not know which windows the old ones published")

    @property
    def sink_key(self) -> str:
        """This partition's key in the progress topic (known after ``setup``)."""
        return self._key

    # -- lifecycle -------------------------------------------------------------------
    def setup(self, context: OperatorContext) -> None:
        self.reset_non_state()
        self._context = context
        self._key = f"{self.topic}/{self.sink_id or context.name}/{context.operator_id}"
        who = f"operator {context.name!r}"
        config = client_config(self.bootstrap_servers, self.config, _DEFAULTS,
                               _FIXED_EXACTLY_ONCE if self.exactly_once else {}, who)
        config.setdefault("client.id", f"weir-{context.name}-{context.operator_id}")
        if self.exactly_once:
            config["transactional.id"] = f"weir.{self._key}"
        confluent = kafka()
        self._producer = confluent.Producer(config, logger=LIBRDKAFKA_LOG)
        try:
            # a consumer's metadata request never creates the topic (a producer's may)
            reader = self._reader()
            try:
                partitions = topic_partitions(reader, [self.topic], self.bootstrap_servers,
                                              who, context.recovered_window < 0)[self.topic]
                if self.exactly_once:
                    self._create_progress_topic(reader)
            finally:
                reader.close()
            if self.exactly_once:
                self._producer.init_transactions(_TIMEOUT_S)  # fences an older deployment
                self._abort_left_open()
                self._read_watermark(partitions)
                self._find_leftovers(partitions)
        except BaseException:
            self.teardown()
            raise
        _LOGGER.info("KafkaSink %s writes into %s at %s (%s, watermark %s)", context.name,
                     self.topic, self.bootstrap_servers,
                     "exactly once" if self.exactly_once else "at least once",
                     format_window_id(self._watermark))

    def end_window(self) -> None:
        """Publishes the window's rows (in one transaction with the watermark)."""
        data = self.window_table()
        window_id = self.window_id
        if self.exactly_once and window_id <= self._watermark:
            self.windows_skipped += 1
            _LOGGER.debug("KafkaSink %s: window %s is at or below the watermark %s: published "
                          "before, skipped", self._name, format_window_id(window_id),
                          format_window_id(self._watermark))
            return
        if data is None:
            return
        if self._producer is None or self._context is None:
            raise RuntimeError("KafkaSink.end_window before setup()")
        records = self._records(data)
        if not self.exactly_once:
            self._produce(records, headers=None)
            self._flush()
            self._count(window_id, len(records))
            return
        left = self._leftovers.pop(window_id, None)
        if left:
            kept = []
            for record in records:
                if left[record] > 0:
                    left[record] -= 1
                    self.leftovers_skipped += 1
                else:
                    kept.append(record)
            records = kept
        producer = self._producer
        producer.begin_transaction()
        try:
            self._produce(records, headers=[(SINK_HEADER, self._key.encode()),
                                            (WINDOW_HEADER, str(window_id).encode())])
            self._flush()
            self._context.crash_point("kafka.records_sent")
            offsets = {**self._offsets, **self._delivered}
            self._produce_progress(window_id, offsets)
            self._flush()
            self._context.crash_point("kafka.before_commit")
            self._context.check_fence()
            producer.commit_transaction(_TIMEOUT_S)
        except BaseException:
            self._abort()
            raise
        self._watermark, self._offsets = window_id, offsets
        self._context.crash_point("kafka.committed")
        self._count(window_id, len(records))

    def teardown(self) -> None:
        producer, self._producer = self.__dict__.get("_producer"), None
        if producer is not None:
            producer.flush(5)

    # -- helpers ---------------------------------------------------------------------
    @property
    def _name(self) -> str:
        context = self.__dict__.get("_context")
        return context.name if context is not None else "?"

    def _count(self, window_id: int, records: int) -> None:
        self.windows_written += 1
        self.records_written += records
        _LOGGER.debug("KafkaSink %s: window %s, %d records into %s", self._name,
                      format_window_id(window_id), records, self.topic)

    def _records(self, data: pa.Table) -> list[tuple[bytes | None, bytes | None]]:
        """(key, value) per row."""
        names = data.column_names
        for label, column in (("key_column", self.key_column),
                              ("value_column", self.value_column)):
            if column is not None and column not in names:
                raise KeyError(f"operator {self._name!r}: KafkaSink {label} {column!r} is not "
                               f"among the window's columns {names}")
        count = data.num_rows
        keys = [_bytes(k) for k in data.column(self.key_column).to_pylist()] \
            if self.key_column is not None else [None] * count
        if self.value_column is not None:
            values = [_bytes(v) for v in data.column(self.value_column).to_pylist()]
        else:
            values = [json_value(row) for row in data.to_pylist()]
        return list(zip(keys, values, strict=True))

    def _produce(self, records: list[tuple[bytes | None, bytes | None]],
                 headers: list[tuple[str, bytes]] | None) -> None:
        producer = self._producer
        self._delivered = {}
        self._failures = []
        for key, value in records:
            while True:
                try:
                    producer.produce(self.topic, value, key, headers=headers,
                                     on_delivery=self._on_delivery)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.05)

    def _on_delivery(self, error: Any, message: Any) -> None:
        if error is not None:
            self._failures.append(error.str())
        elif message.topic() == self.topic:
            partition = message.partition()
            self._delivered[partition] = max(self._delivered.get(partition, 0),
                                             message.offset() + 1)

    def _flush(self) -> None:
        left = self._producer.flush(_TIMEOUT_S)
        if left or self._failures:
            reason = self._failures[0] if self._failures else f"{left} record(s) unacknowledged"
            raise RuntimeError(f"operator {self._name!r}: KafkaSink could not publish to "
                               f"{self.topic!r} at {self.bootstrap_servers!r}: {reason}")

    def _abort(self) -> None:
        try:
            self._producer.abort_transaction(_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the original error is the one to raise
            _LOGGER.warning("KafkaSink %s: aborting the transaction failed: %s", self._name, exc)

    def _produce_progress(self, window_id: int, offsets: dict[int, int]) -> None:
        value = json.dumps({"window": window_id, "offsets": {str(p): o for p, o in
                                                             sorted(offsets.items())}})
        self._producer.produce(self.progress_topic, value.encode(), self._key.encode(),
                               partition=0, on_delivery=self._on_delivery)

    def _abort_left_open(self) -> None:
        """Aborts a transaction a killed attempt left open. Kafka did at
        ``init_transactions``; a broker that keeps it open under this transactional id
        would commit it with the next window. An abort of nothing is not sent, so a
        marker record goes to the progress topic (under its own key) and is aborted."""
        producer = self._producer
        producer.begin_transaction()
        producer.produce(self.progress_topic, b"", f"{self._key}/abort".encode(), partition=0)
        producer.flush(_TIMEOUT_S)
        producer.abort_transaction(_TIMEOUT_S)

    def _create_progress_topic(self, reader: Any) -> None:
        confluent = kafka()
        metadata = reader.list_topics(self.progress_topic, timeout=_TIMEOUT_S)
        found = metadata.topics.get(self.progress_topic)
        if found is not None and found.error is None and found.partitions:
            return
        admin = confluent.admin.AdminClient(self._client_settings(), logger=LIBRDKAFKA_LOG)
        future = admin.create_topics([confluent.admin.NewTopic(
            self.progress_topic, 1, 1, config={"cleanup.policy": "compact"})])
        try:
            future[self.progress_topic].result(_TIMEOUT_S)
        except confluent.KafkaException as exc:
            if exc.args[0].code() != confluent.KafkaError.TOPIC_ALREADY_EXISTS:
                raise RuntimeError(f"operator {self._name!r}: KafkaSink cannot create its "
                                   f"progress topic {self.progress_topic!r}: {exc}; create it "
                                   "(compacted) or name another with progress_topic"
                                   ) from None

    def _client_settings(self) -> dict[str, Any]:
        """The user's connection settings (security) without producer-only ones."""
        keep = ("security.", "sasl.", "ssl.", "socket.", "client.")
        return {**{k: v for k, v in self.config.items() if k.startswith(keep)},
                "bootstrap.servers": self.bootstrap_servers}

    def _reader(self) -> Any:
        return kafka().Consumer({**self._client_settings(), **_READ_CONFIG,
                                 "group.id": f"weir.{self._key}.reader"}, logger=LIBRDKAFKA_LOG)

    def _read_watermark(self, partitions: list[int]) -> None:
        """This sink's last progress record: its watermark and the output's ends after it;
        with none yet, writes one at the output's current ends (where leftovers start)."""
        mark = None
        for message in self._read_all([(self.progress_topic, 0, 0)]):
            if message.key() == self._key.encode():
                mark = json.loads(message.value())
        if mark is not None:
            self._watermark = int(mark["window"])
            self._offsets = {int(p): int(o) for p, o in mark["offsets"].items()}
            return
        confluent = kafka()
        reader = self._reader()
        try:
            ends = {p: reader.get_watermark_offsets(confluent.TopicPartition(self.topic, p),
                                                    timeout=_TIMEOUT_S)[1] for p in partitions}
        finally:
            reader.close()
        producer = self._producer
        producer.begin_transaction()
        self._delivered, self._failures = {}, []
        self._produce_progress(-1, ends)
        self._flush()
        producer.commit_transaction(_TIMEOUT_S)
        self._offsets = ends

    def _find_leftovers(self, partitions: list[int]) -> None:
        """Counts this sink's records past the watermark's offsets (left by an attempt a
        broker did not abort)."""
        key = self._key.encode()
        starts = [(self.topic, p, self._offsets.get(p, 0)) for p in partitions]
        for message in self._read_all(starts):
            headers = dict(message.headers() or [])
            if headers.get(SINK_HEADER) != key:
                continue
            window = int(headers.get(WINDOW_HEADER, b"-1"))
            if window > self._watermark:
                counter = self._leftovers.setdefault(window, collections.Counter())
                counter[(message.key(), message.value())] += 1
        if self._leftovers:
            _LOGGER.warning("KafkaSink %s: %d record(s) of window(s) %s were published by an "
                            "attempt that did not commit (the broker kept them): they are not "
                            "published again", self._name,
                            sum(sum(c.values()) for c in self._leftovers.values()),
                            [format_window_id(w) for w in sorted(self._leftovers)])

    def _read_all(self, starts: list[tuple[str, int, int]]) -> list[Any]:
        """Every committed record from each (topic, partition, offset) to its current end."""
        confluent = kafka()
        reader = self._reader()
        try:
            ends = {}
            for topic, partition, offset in starts:
                end = reader.get_watermark_offsets(confluent.TopicPartition(topic, partition),
                                                   timeout=_TIMEOUT_S)[1]
                if end > offset:
                    ends[(topic, partition)] = end
            if not ends:
                return []
            reader.assign([confluent.TopicPartition(t, p, o) for t, p, o in starts
                           if (t, p) in ends])
            found: list[Any] = []
            deadline = time.monotonic() + _TIMEOUT_S
            while ends:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"operator {self._name!r}: KafkaSink could not read "
                                       f"{sorted(ends)} to their ends within {_TIMEOUT_S:g} s")
                for message in reader.consume(1000, 0.1):
                    if message.error() is None:
                        found.append(message)
                for tp in reader.position([confluent.TopicPartition(t, p) for t, p in ends]):
                    if tp.offset >= ends[(tp.topic, tp.partition)]:
                        del ends[(tp.topic, tp.partition)]
            return found
        finally:
            reader.close()


def _bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return str(value).encode()

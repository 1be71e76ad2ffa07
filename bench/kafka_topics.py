"""What every Kafka row of ``make bench`` shares: the broker, the pre-filled input topic
and the read-back of an output topic, so each row reads the same records from the same
kind of broker.

The broker is the tests' private one (``tests/kafka_broker.py``: noida-db's Kafka service
on loopback), started by each row's own process, or the cluster
``WEIR_BENCH_KAFKA_BOOTSTRAP`` names. The events (the same as every system reads) are
produced as JSON objects ``{"name": key, "value": v}``, the key also the record's, before
any clock starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator

from bench.common import JobSpec

__all__ = ["BOOTSTRAP_VARIABLE", "PARTITIONS", "BenchBroker", "NoBroker", "Topics",
           "bench_broker", "create_topics", "fill", "prepare", "read_totals"]

BOOTSTRAP_VARIABLE = "WEIR_BENCH_KAFKA_BOOTSTRAP"
PARTITIONS = 3
_PRIVATE = "noida-db 0.2.2 (private, loopback)"


class NoBroker(RuntimeError):
    """Neither a private broker binary nor ``WEIR_BENCH_KAFKA_BOOTSTRAP``."""


@dataclasses.dataclass(frozen=True)
class BenchBroker:
    bootstrap: str
    private: bool

    def row_name(self, system: str) -> str:
        """The row's name in the table, saying when the broker is the bundled one."""
        return system + (" (noida-db broker)" if self.private else "")

    @property
    def description(self) -> str:
        return _PRIVATE if self.private else self.bootstrap


@dataclasses.dataclass(frozen=True)
class Topics:
    events: str
    results: str
    fill_seconds: float


@contextlib.contextmanager
def bench_broker() -> Iterator[BenchBroker]:
    """The cluster ``WEIR_BENCH_KAFKA_BOOTSTRAP`` names, or a private broker killed on exit.

    Raises:
        NoBroker: neither is there.
    """
    bootstrap = os.environ.get(BOOTSTRAP_VARIABLE, "")
    if bootstrap:
        yield BenchBroker(bootstrap, private=False)
        return
    from tests.kafka_broker import PrivateBroker, find_broker

    binary = find_broker()
    if binary is None:
        raise NoBroker(f"no Kafka broker: pip install noida-db==0.2.2, or set "
                       f"{BOOTSTRAP_VARIABLE}")
    broker = PrivateBroker(binary)
    try:
        yield BenchBroker(broker.start(), private=True)
    finally:
        broker.stop()


def create_topics(bootstrap: str, *names: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, PARTITIONS, 1) for n in names]).values():
        future.result(60)


def fill(bootstrap: str, topic: str, spec: JobSpec) -> float:
    """Produces the job's events as JSON objects ``{"name": key, "value": v}``, the key also
    the record's; returns the seconds."""
    from confluent_kafka import Producer

    started = time.monotonic()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000})
    for batch in spec.generator().batches():
        for key, value in zip(batch.column("key").to_pylist(), batch.column("value").to_pylist(),
                              strict=True):
            record = json.dumps({"name": key, "value": value}, separators=(",", ":")).encode()
            while True:
                try:
                    producer.produce(topic, record, key.encode())
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
    if producer.flush(120):
        raise RuntimeError(f"the input topic {topic!r} could not be filled")
    return time.monotonic() - started


def prepare(bootstrap: str, spec: JobSpec) -> Topics:
    """A fresh input topic filled with the job's events and an empty output topic."""
    suffix = uuid.uuid4().hex[:8]
    events, results = f"bench-events-{suffix}", f"bench-counts-{suffix}"
    create_topics(bootstrap, events, results)
    return Topics(events, results, fill(bootstrap, events, spec))


def read_totals(bootstrap: str, topic: str,
                timeout_s: float = 120.0) -> dict[str, tuple[int, int]]:
    """Per key, count and sum over every result record ``{"name", "count", "sum"}`` of the
    output topic (read_committed)."""
    from confluent_kafka import Consumer, TopicPartition

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                       "enable.auto.commit": False, "isolation.level": "read_committed"})
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = {tp.partition: reader.get_watermark_offsets(tp, timeout=30)[1]
                for tp in partitions}
        reader.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for message in reader.consume(10_000, 0.2):
                if message.error() is None:
                    row = json.loads(message.value())
                    total = totals[row["name"]]
                    total[0] += row["count"]
                    total[1] += row["sum"]
            if all(tp.offset >= ends[tp.partition] for tp in reader.position(partitions)):
                break
    finally:
        reader.close()
    return {key: (count, total) for key, (count, total) in totals.items()}

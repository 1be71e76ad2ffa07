"""The benchmark job from Kafka to Kafka: a pre-filled topic → KafkaSource → the aggregation
in Spark → KafkaSink (exactly once).

The broker is the tests' private one (``tests/kafka_broker.py``: noida-db's Kafka service
on loopback), or the cluster ``WEIR_BENCH_KAFKA_BOOTSTRAP`` names. The events (the same
as every system reads) are produced as JSON objects before the clock starts; the figures
are from the first window to the last result out, read from the master's window stats as
for the ``weir`` row, and the output topic is read back (``read_committed``) and checked
against the known answer.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pyarrow as pa

from bench.common import JobResult, JobSpec, check_totals
from bench.weir_job import _run_app, job_figures
from operators import Dag
from operators.library import KafkaSink, KafkaSource, WindowedCount

__all__ = ["run"]

BOOTSTRAP_VARIABLE = "WEIR_BENCH_KAFKA_BOOTSTRAP"
_PARTITIONS = 3
_VALUE_SCHEMA = pa.schema([("name", pa.string()), ("value", pa.int64())])  # "key": the record's


def build_dag(bootstrap: str, topic: str, out: str, app_window_count: int,
              window_ms: int) -> Dag:
    """Source in container 0; the Spark aggregation and the Kafka sink in container 1."""
    dag = Dag("bench-kafka", STREAMING_WINDOW_SIZE_MILLIS=window_ms, CONTAINERS=2,
              HEARTBEAT_INTERVAL_MILLIS=500, SPARK_MASTER="local[2]",
              SPARK_SHUFFLE_PARTITIONS=2, SPARK_DRIVER_MEMORY="2g",
              SPARK_WARMUP_ROWS=1_000_000)
    source = dag.add_operator("events", KafkaSource(topic, bootstrap, value_format="json",
                                                    value_schema=_VALUE_SCHEMA, stop_at="end",
                                                    batch_records=50_000), CONTAINER=0)
    agg = dag.add_operator("aggregate", WindowedCount(key="name", value="value"), CONTAINER=1,
                           APPLICATION_WINDOW_COUNT=app_window_count, QUEUE_CAPACITY=256)
    sink = dag.add_operator("sink", KafkaSink(out, bootstrap, key_column="name"), CONTAINER=1)
    dag.add_stream("events", source.output, agg.input)
    dag.add_stream("counts", agg.output, sink.input)
    return dag


def _create_topics(bootstrap: str, *names: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, _PARTITIONS, 1) for n in names]).values():
        future.result(60)


def _fill(bootstrap: str, topic: str, spec: JobSpec) -> float:
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


def _totals(bootstrap: str, topic: str) -> dict[str, tuple[int, int]]:
    """Per key, count and sum over every record of the output topic (read_committed)."""
    from confluent_kafka import Consumer, TopicPartition

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                       "enable.auto.commit": False, "isolation.level": "read_committed"})
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    try:
        partitions = [TopicPartition(topic, p) for p in range(_PARTITIONS)]
        ends = {tp.partition: reader.get_watermark_offsets(tp, timeout=30)[1]
                for tp in partitions}
        reader.assign([TopicPartition(topic, p, 0) for p in range(_PARTITIONS)])
        deadline = time.monotonic() + 120
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


def run(spec: JobSpec, app_window_count: int = 2, timeout_s: float = 600.0,
        work_dir: Path | None = None) -> JobResult:
    """Fills a topic, runs the job through Kafka, checks the output topic."""
    from tests.kafka_broker import PrivateBroker, find_broker

    work = Path(work_dir or tempfile.mkdtemp(prefix="weir-bench-kafka-"))
    bootstrap = os.environ.get(BOOTSTRAP_VARIABLE, "")
    broker = None
    if not bootstrap:
        binary = find_broker()
        if binary is None:
            return JobResult("weir kafka", spec.events, 0.0, [], False,
                             "no Kafka broker: pip install noida-db==0.2.2, or set "
                             f"{BOOTSTRAP_VARIABLE}")
        broker = PrivateBroker(binary)
        bootstrap = broker.start()
    try:
        suffix = uuid.uuid4().hex[:8]
        topic, out = f"bench-events-{suffix}", f"bench-counts-{suffix}"
        _create_topics(bootstrap, topic, out)
        fill_s = _fill(bootstrap, topic, spec)
        dag = build_dag(bootstrap, topic, out, app_window_count, spec.window_ms)
        windows, error, wall_s = _run_app(dag, work, timeout_s)
        name = "weir kafka" + (" (noida-db broker)" if broker is not None else "")
        if error:
            return JobResult(name, spec.events, 0.0, [], False, error)
        correct, detail = check_totals(_totals(bootstrap, out), spec.expected())
    finally:
        if broker is not None:
            broker.stop()
    seconds, latencies, result_windows = job_figures(windows, spec.window_ms)
    return JobResult(name, spec.events, seconds, latencies, correct, detail, extra={
        "broker": "noida-db 0.2.2 (private, loopback)" if broker is not None else bootstrap,
        "fill_seconds": round(fill_s, 1),
        "application_windows": result_windows,
        "wall_seconds_with_startup": round(wall_s, 1),
    })

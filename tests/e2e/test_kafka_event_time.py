"""The job that decides it: Kafka in -> event-time windows with keyed state -> PostgreSQL and
Kafka out, exactly once, with containers killed at random.

A 3-partition topic of JSON events whose Kafka timestamps are their event times, each
partition in order (within the watermark delay) but the partitions far out of step with
each other → KafkaSource (2 partitions; its watermark is the lowest over the Kafka
partitions it reads, so the one behind is never made late) → EventTimeWindows (1 s
tumbling, count and sum per user) in Spark → PostgresSink upserting by user and window, and
KafkaSink, exactly once. Both outputs equal the reference computed in plain Python.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import textwrap
import time
import uuid

import pytest

from tests.e2e.test_exactly_once import chaos_seed, kill_randomly
from tests.e2e.test_kafka import create_topics, read_topic
from tests.e2e.test_recovery import wait_finished
from weir.master.client import WeirClient
from weir.operators.app import load_app

pytestmark = pytest.mark.timeout(420)

BASE_MS = (time.time_ns() // 1_000_000 - 600_000) // 1_000 * 1_000  # recent: within
# the broker's retention, which deletes records by their timestamps
EVENTS_PER_PARTITION = 4_000
LEAD_MS = (0, 3_000, 6_000)  # partition p's events start this far ahead in event time

APP = """
    import pyarrow as pa
    from weir.operators import Dag
    from weir.operators.library import EventTimeWindows, KafkaSink, KafkaSource, PostgresSink

    dag = Dag("kafka-event-time", CONTAINERS=3, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, HEARTBEAT_TIMEOUT_MILLIS=3000,
              CHECKPOINT_WINDOW_COUNT=4, STATE_DIR={state!r}, SPARK_MASTER="local[1]",
              SPARK_SHUFFLE_PARTITIONS=1, SPARK_WARMUP_ROWS=0, MAX_RESTARTS=8)
    source = dag.add_operator("source", KafkaSource(
        {topic!r}, {bootstrap!r}, group_id={group!r}, stop_at="end", value_format="json",
        value_schema=pa.schema([("user", pa.string()), ("amount", pa.int64())]),
        records_per_window=150), CONTAINER=0, PARTITIONS=2, EVENT_TIME_COLUMN="timestamp",
        WATERMARK_DELAY_MILLIS=500)
    windows = dag.add_operator("per-second", EventTimeWindows.tumbling(
        "timestamp", size_ms=1000, keys="user",
        aggregations={{"n": "count(*)", "total": "sum(amount)"}}), CONTAINER=1)
    to_table = dag.add_operator("to_table", PostgresSink(
        {dsn!r}, {table!r}, upsert_keys=["user", "window_start", "window_end"]), CONTAINER=2)
    to_kafka = dag.add_operator("to_kafka", KafkaSink({out!r}, {bootstrap!r},
                                                      key_column="user"), CONTAINER=2)
    dag.add_stream("events", source.output, windows.input)
    dag.add_stream("results", windows.output, to_table.input, to_kafka.input)
"""

Window = tuple[str, int]  # user, window start (epoch ms)


def produce_events(bootstrap: str, topic: str) -> dict[Window, tuple[int, int]]:
    """The events, partition by partition; returns the reference windows (count, sum)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    windows: dict[Window, list[int]] = collections.defaultdict(lambda: [0, 0])
    for partition, lead in enumerate(LEAD_MS):
        for i in range(EVENTS_PER_PARTITION):
            t = BASE_MS + lead + 2 * i + (i * 7919 % 201 - 100)  # 100 ms out of order at most
            user, amount = f"u{(i + partition) % 5}", (i * 31 + partition) % 11
            producer.produce(topic, json.dumps({"user": user, "amount": amount}).encode(),
                             partition=partition, timestamp=t)
            window = windows[(user, t - t % 1_000)]
            window[0] += 1
            window[1] += amount
        producer.poll(0)
    assert producer.flush(30) == 0
    return {k: (v[0], v[1]) for k, v in windows.items()}


def epoch_ms(value: object) -> int:
    moment = value if isinstance(value, datetime.datetime) else \
        datetime.datetime.fromisoformat(str(value))
    return int(moment.timestamp() * 1000)


def topic_windows(bootstrap: str, topic: str) -> list[tuple[Window, tuple[int, int]]]:
    """Every result record of the output topic (read_committed)."""
    return [((row["user"], epoch_ms(row["window_start"])), (row["n"], row["total"]))
            for row in read_topic(bootstrap, topic)]


def test_kafka_event_time_windows_to_postgres_and_kafka_exactly_once_under_kills(
        master, tmp_path, kafka_bootstrap, postgres_dsn):
    import psycopg

    rng, note = chaos_seed()
    suffix = uuid.uuid4().hex[:8]
    topic, out, group = f"events-{suffix}", f"windows-{suffix}", f"weir-test-{suffix}"
    create_topics(kafka_bootstrap, topic, out)
    expected = produce_events(kafka_bootstrap, topic)
    table = f"event_windows_{os.getpid()}_{time.time_ns() % 10**9}"
    app = tmp_path / "kafka_event_time_app.py"
    app.write_text(textwrap.dedent(APP.format(
        state=str(tmp_path / "state"), topic=topic, out=out, group=group,
        bootstrap=kafka_bootstrap, dsn=postgres_dsn, table=table)))
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        kills = kill_randomly(master, client, app_id, note, rng)
        wait_finished(client, master, app_id, timeout_s=300)
        windows_op = client.operator_stats(app_id, "per-second")
    note = f"{note}, killed {kills}"
    assert kills, f"no container was killed during the run; {note}"
    assert windows_op.metrics["late_rows"] == 0, \
        f"rows of the lagging partitions were made late; {note}"

    with psycopg.connect(postgres_dsn) as conn:
        rows = conn.execute(f'SELECT "user", window_start, n, total FROM {table}').fetchall()
    in_table = {(user, epoch_ms(start)): (n, total) for user, start, n, total in rows}
    assert len(rows) == len(in_table)
    assert in_table == expected, f"table differs from the reference; {note}"

    published = topic_windows(kafka_bootstrap, out)
    twice = [k for k, n in collections.Counter(k for k, _ in published).items() if n > 1]
    assert not twice, f"windows published twice to Kafka: {twice[:5]}; {note}"
    assert dict(published) == expected, f"output topic differs from the reference; {note}"

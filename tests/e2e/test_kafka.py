"""Kafka in, Kafka and PostgreSQL out, exactly once, with containers killed at random.

A 3-partition topic of text lines → KafkaSource (2 partitions) → Tokenize and WindowedCount
in Spark → KafkaSink (exactly once) and PostgresSink, in three container processes, on a
real Kafka-protocol broker and a real PostgreSQL server. The counts read back from the
output topic (read_committed) and from the table equal the reference exactly, and the
consumer group's committed offsets are the input's end offsets at the finish.
"""

from __future__ import annotations

import collections
import json
import os
import textwrap
import time
import uuid

import pytest

from tests.e2e.test_exactly_once import chaos_seed, kill_randomly, table_counts, write_input
from tests.e2e.test_recovery import wait_finished
from tests.e2e.test_weir_run import weir  # noqa: F401 - the fixture
from weir.master.client import WeirClient
from weir.operators.app import load_app

pytestmark = pytest.mark.timeout(400)

APP = """
    from weir.operators import Dag
    from weir.operators.library import (KafkaSink, KafkaSource, PostgresSink, Tokenize,
                                   WindowedCount)

    dag = Dag("kafka", CONTAINERS=3, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, HEARTBEAT_TIMEOUT_MILLIS=3000,
              CHECKPOINT_WINDOW_COUNT=4, STATE_DIR={state!r}, SPARK_MASTER="local[1]",
              SPARK_SHUFFLE_PARTITIONS=1, SPARK_WARMUP_ROWS=0, MAX_RESTARTS=8)
    source = dag.add_operator("source", KafkaSource({topic!r}, {bootstrap!r},
                                                    group_id={group!r}, stop_at="end",
                                                    value_format="utf8",
                                                    records_per_window=40),
                              CONTAINER=0, PARTITIONS=2)
    tokenize = dag.add_operator("tokenize", Tokenize(column="value"), CONTAINER=1)
    count = dag.add_operator("count", WindowedCount(key="word"), CONTAINER=1,
                             APPLICATION_WINDOW_COUNT=2)
    to_kafka = dag.add_operator("to_kafka", KafkaSink({out!r}, {bootstrap!r},
                                                      key_column="word"),
                                CONTAINER=2, CRASH_AT={crash!r})
    to_table = dag.add_operator("to_table", PostgresSink({dsn!r}, {table!r}), CONTAINER=2)
    dag.add_stream("lines", source.output, tokenize.input)
    dag.add_stream("words", tokenize.output, count.input)
    dag.add_stream("counts", count.output, to_kafka.input, to_table.input)
"""


def admin(bootstrap: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def create_topics(bootstrap: str, *names: str) -> None:
    from confluent_kafka.admin import NewTopic

    client = admin(bootstrap)
    for future in client.create_topics([NewTopic(n, 3, 1) for n in names]).values():
        future.result(30)


def produce_lines(bootstrap: str, topic: str, lines: list[str]) -> None:
    """Slowly enough that the run spans many windows: in rounds, one line per record."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for index, line in enumerate(lines):
        producer.produce(topic, line.encode(), partition=index % 3)
    assert producer.flush(30) == 0


def read_topic(bootstrap: str, topic: str) -> list[dict]:
    """Every record of the 3-partition ``topic`` (read_committed), as JSON objects."""
    from confluent_kafka import Consumer, TopicPartition

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4()}",
                       "enable.auto.commit": False, "isolation.level": "read_committed"})
    rows: list[dict] = []
    try:
        ends = {p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(3)}
        reader.assign([TopicPartition(topic, p, 0) for p in range(3)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows += [json.loads(message.value()) for message in reader.consume(1000, 0.2)
                     if message.error() is None]
            done = reader.position([TopicPartition(topic, p) for p in range(3)])
            if all(tp.offset >= ends[tp.partition] for tp in done):
                return rows
        raise AssertionError(f"the output topic was not read to its ends {ends} in 60 s")
    finally:
        reader.close()


def output_counts(bootstrap: str, topic: str) -> tuple[collections.Counter[str], int]:
    """Word counts summed over every record of the output topic (read_committed)."""
    counted: collections.Counter[str] = collections.Counter()
    rows = read_topic(bootstrap, topic)
    for row in rows:
        counted[row["word"]] += row["count"]
    return counted, len(rows)


def group_offsets(bootstrap: str, group: str, topic: str) -> tuple[dict[int, int],
                                                                   dict[int, int]]:
    """(the group's committed offsets, the topic's end offsets) per partition."""
    from confluent_kafka import Consumer, TopicPartition

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        committed = {tp.partition: tp.offset for tp in reader.committed(
            [TopicPartition(topic, p) for p in range(3)], timeout=10)}
        ends = {p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(3)}
        return committed, ends
    finally:
        reader.close()


def assert_counts(expected: collections.Counter, counts: tuple[collections.Counter, int],
                  note: str) -> None:
    counted, rows = counts
    missing = {w: n - counted[w] for w, n in expected.items() if counted[w] < n}
    extra = {w: counted[w] - expected[w] for w in counted if counted[w] > expected[w]}
    assert not missing and not extra, (
        f"{note}: {len(missing)} words short (e.g. {dict(list(missing.items())[:5])}), "
        f"{len(extra)} counted too often (e.g. {dict(list(extra.items())[:5])}), {rows} rows")


def test_kafka_to_kafka_and_postgres_exactly_once_under_random_kills(
        master, tmp_path, kafka_bootstrap, postgres_dsn):
    rng, note = chaos_seed()
    suffix = uuid.uuid4().hex[:8]
    topic, out, group = f"lines-{suffix}", f"counts-{suffix}", f"weir-test-{suffix}"
    create_topics(kafka_bootstrap, topic, out)
    expected = write_input(tmp_path / "inbox")
    lines = [line for file in sorted((tmp_path / "inbox").iterdir())
             for line in file.read_text().splitlines()]
    produce_lines(kafka_bootstrap, topic, lines)
    table = f"kafka_counts_{os.getpid()}_{time.time_ns() % 10**9}"
    app = tmp_path / "kafka_app.py"
    app.write_text(textwrap.dedent(APP.format(
        state=str(tmp_path / "state"), topic=topic, out=out, group=group,
        bootstrap=kafka_bootstrap, dsn=postgres_dsn, table=table,
        crash="kafka.committed@3")))
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        kills = kill_randomly(master, client, app_id, note, rng)
        wait_finished(client, master, app_id, timeout_s=300)
    assert len(kills) >= 2, f"only {len(kills)} kills happened during the run; {note}"
    assert list((tmp_path / "state").rglob("crashed-at-kafka.committed")), \
        "the sink was not killed between its transaction's commit and the checkpoint"
    note = f"{note}, killed {kills} and the Kafka sink right after a commit"
    assert_counts(expected, output_counts(kafka_bootstrap, out), f"output topic, {note}")
    assert_counts(expected, table_counts(postgres_dsn, table), f"table, {note}")
    committed, ends = group_offsets(kafka_bootstrap, group, topic)
    assert committed == ends, f"the group's offsets {committed} are not the ends {ends}"


def test_lag_and_records_read_show_in_the_operator_stats(master, tmp_path, kafka_bootstrap):
    """A source that cannot keep up shows its lag per partition in ``weir`` stats."""
    suffix = uuid.uuid4().hex[:8]
    topic = f"lag-{suffix}"
    create_topics(kafka_bootstrap, topic)
    produce_lines(kafka_bootstrap, topic, [f"line {i}" for i in range(3000)])
    app = tmp_path / "lag_app.py"
    app.write_text(textwrap.dedent(f"""
        from weir.operators import Dag
        from weir.operators.library import ConsoleSink, KafkaSource

        dag = Dag("lag", STREAMING_WINDOW_SIZE_MILLIS=200, HEARTBEAT_INTERVAL_MILLIS=200,
                  STATE_DIR={str(tmp_path / 'state')!r})
        source = dag.add_operator("source", KafkaSource({topic!r}, {kafka_bootstrap!r},
                                                        value_format="utf8",
                                                        records_per_window=10))
        sink = dag.add_operator("sink", ConsoleSink(limit=0))
        dag.add_stream("lines", source.output, sink.input)
    """))
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        try:
            deadline = time.monotonic() + 90
            seen: dict[str, float] = {}
            while time.monotonic() < deadline:
                info = client.operator_stats(app_id, "source")
                seen = dict(info.metrics)
                if seen.get("records_read", 0) > 0 and seen.get("lag_total", 0) > 0:
                    break
                time.sleep(0.2)
            assert seen.get("records_read", 0) > 0 and seen.get("lag_total", 0) > 0, seen
            per_partition = {k: v for k, v in seen.items() if k.startswith("lag[")}
            assert set(per_partition) == {f"lag[{topic}/{p}]" for p in range(3)}
            assert sum(per_partition.values()) == seen["lag_total"]
        finally:
            client.kill(app_id)


def bad_record_app(tmp_path, kafka_bootstrap: str, source_attributes: str, sinks: str
                   ) -> tuple[str, str]:
    """A topic whose partition 1 holds ``{"n": 1}``, ``not json``, ``{"n": 3}``, and an
    app reading it as JSON into ``sinks`` (code using ``source``); returns both."""
    topic = f"bad-{uuid.uuid4().hex[:8]}"
    create_topics(kafka_bootstrap, topic)
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for value in (b'{"n": 1}', b"not json", b'{"n": 3}'):
        producer.produce(topic, value, partition=1)
    assert producer.flush(30) == 0
    app = tmp_path / "bad_app.py"
    app.write_text(textwrap.dedent(f"""
        import pyarrow as pa
        from weir.operators import Dag
        from weir.operators.library import ConsoleSink, FileSink, KafkaSource

        dag = Dag("bad", HEARTBEAT_INTERVAL_MILLIS=200, STREAMING_WINDOW_SIZE_MILLIS=100)
        source = dag.add_operator("source", KafkaSource(
            {topic!r}, {kafka_bootstrap!r}, value_format="json", stop_at="end",
            value_schema=pa.schema([("n", pa.int64())])){source_attributes})
    """) + textwrap.dedent(sinks))
    return topic, str(app)


def test_a_record_that_does_not_decode_fails_the_run_at_once_naming_it(
        tmp_path, kafka_bootstrap, weir):  # noqa: F811 - the fixture
    topic, app = bad_record_app(tmp_path, kafka_bootstrap, "", """
        sink = dag.add_operator("sink", ConsoleSink(limit=0))
        dag.add_stream("records", source.output, sink.input)
    """)
    proc = weir("run", app)
    assert proc.wait(120) == 1, proc.output()
    result = proc.output()[proc.output().rindex("app-0001 bad: FAILED"):]
    assert "not retried: this error cannot succeed on retry" in result, result
    assert f"RecordDecodeError: the record at topic '{topic}', partition 1, offset 1 is " \
           "not JSON" in result, result


def test_with_dead_letters_a_record_that_does_not_decode_is_set_aside_and_the_run_ends(
        tmp_path, kafka_bootstrap, weir):  # noqa: F811 - the fixture
    topic, app = bad_record_app(tmp_path, kafka_bootstrap, ', ON_ERROR="DEAD_LETTER"', f"""
        good = dag.add_operator("good", FileSink({str(tmp_path / 'good')!r}))
        dead = dag.add_operator("dead", FileSink({str(tmp_path / 'dead')!r}))
        dag.add_stream("records", source.output, good.input)
        dag.add_stream("dead-letters", source.errors, dead.input)
    """)
    proc = weir("run", app)
    assert proc.wait(120) == 0, proc.output()

    def rows(folder: str) -> list[dict]:
        return [json.loads(line) for f in sorted((tmp_path / folder).glob("*.jsonl"))
                for line in f.read_text().splitlines()]

    assert sorted(r["n"] for r in rows("good")) == [1, 3]
    [dead] = rows("dead")
    assert (dead["partition"], dead["offset"], dead["weir_operator"]) == (1, 1, "source")
    assert dead["weir_error"].startswith(f"RecordDecodeError: the record at topic '{topic}', "
                                         "partition 1, offset 1 is not JSON")

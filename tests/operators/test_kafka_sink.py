"""KafkaSink against a real Kafka-protocol broker: windows published once, replays skipped,
and a producer killed inside or right after its transaction publishes nothing twice."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest

from tests.operators.test_kafka_source import new_topic
from tests.operators.test_library import wid
from weir.operators.library import KafkaSink
from weir.operators.library.kafka_client import KafkaSetupError
from weir.operators.operator import OperatorContext, PermanentError

pytestmark = pytest.mark.timeout(120)


def context(state: Path, **attributes) -> OperatorContext:
    return OperatorContext(name="sink", operator_id=7, container_id="c0",
                           attributes={"STREAMING_WINDOW_SIZE_MILLIS": 100, **attributes},
                           state_dir=str(state))


def write_window(sink: KafkaSink, counter: int, words: list[str]) -> None:
    sink.begin_window(wid(counter))
    sink.process("input", pa.record_batch({"word": words, "count": [len(w) for w in words]}))
    sink.end_window()


def read_back(bootstrap: str, topic: str, isolation: str = "read_committed",
              settle_s: float = 1.0) -> list[tuple[bytes | None, dict]]:
    """Every record of ``topic`` (3 partitions at most), read to the end."""
    from confluent_kafka import Consumer, TopicPartition

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "check",
                       "enable.auto.commit": False, "isolation.level": isolation})
    try:
        reader.assign([TopicPartition(topic, p, 0) for p in range(3)])
        records = []
        quiet_until = time.monotonic() + settle_s
        deadline = time.monotonic() + 30
        while time.monotonic() < min(quiet_until, deadline):
            for message in reader.consume(500, 0.1):
                if message.error() is None:
                    records.append((message.key(), json.loads(message.value())))
                    quiet_until = time.monotonic() + settle_s
        return records
    finally:
        reader.close()


def words_of(records) -> list[str]:
    return sorted(value["word"] for _key, value in records)


def test_each_window_is_published_once_and_a_replay_is_skipped(kafka_bootstrap, tmp_path):
    topic = new_topic(kafka_bootstrap)
    sink = KafkaSink(topic, kafka_bootstrap, key_column="word")
    sink.setup(context(tmp_path))
    try:
        write_window(sink, 1, ["a", "bb"])
        write_window(sink, 2, ["ccc"])
    finally:
        sink.teardown()
    again = KafkaSink(topic, kafka_bootstrap, key_column="word")  # recovered, same operator
    again.setup(context(tmp_path))
    try:
        write_window(again, 2, ["ccc"])  # replayed: skipped
        write_window(again, 3, ["dddd"])
        assert (again.windows_skipped, again.windows_written) == (1, 1)
    finally:
        again.teardown()
    records = read_back(kafka_bootstrap, topic)
    assert words_of(records) == ["a", "bb", "ccc", "dddd"]
    assert all(key == value["word"].encode() and value == {"word": value["word"],
                                                           "count": len(value["word"])}
               for key, value in records)


CRASHING_SINK = """
    import pyarrow as pa
    from weir.operators.library import KafkaSink
    from weir.operators.operator import OperatorContext
    from tests.operators.test_kafka_sink import write_window

    sink = KafkaSink({topic!r}, {bootstrap!r}, key_column="word")
    sink.setup(OperatorContext(name="sink", operator_id=7, container_id="c0",
                               attributes={{"CRASH_AT": {point!r} + "@2"}}, state_dir={state!r}))
    write_window(sink, 1, ["a", "bb"])
    write_window(sink, 2, ["ccc", "ccc", "dd"])  # dies at the crash point in this window
    raise SystemExit("the crash point was not reached")
"""


@pytest.mark.parametrize("point", ["kafka.records_sent", "kafka.before_commit",
                                   "kafka.committed"])
def test_a_sink_killed_in_or_after_its_transaction_publishes_nothing_twice(
        kafka_bootstrap, tmp_path, point):
    topic = new_topic(kafka_bootstrap)
    script = textwrap.dedent(CRASHING_SINK.format(topic=topic, bootstrap=kafka_bootstrap,
                                                  point=point, state=str(tmp_path)))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).parents[2], check=False)
    assert done.returncode == -9, done.stderr  # killed at the point, like kill -9
    again = KafkaSink(topic, kafka_bootstrap, key_column="word")
    again.setup(context(tmp_path))
    try:
        write_window(again, 2, ["ccc", "ccc", "dd"])  # the window the killed one was in
        write_window(again, 3, ["e"])
    finally:
        again.teardown()
    assert words_of(read_back(kafka_bootstrap, topic)) == ["a", "bb", "ccc", "ccc", "dd", "e"]


def test_records_a_broker_kept_of_an_unfinished_attempt_are_not_published_again(
        kafka_bootstrap, tmp_path):
    """A broker that shows an unfinished transaction's records (Kafka aborts it): played
    here by writing two of window 2's three records, with the sink's headers, as plain
    records after the sink's last watermark."""
    from confluent_kafka import Producer

    topic = new_topic(kafka_bootstrap, partitions=1)
    sink = KafkaSink(topic, kafka_bootstrap, key_column="word")
    sink.setup(context(tmp_path))
    try:
        write_window(sink, 1, ["a"])
        key = sink.sink_key.encode()
    finally:
        sink.teardown()
    leftover = Producer({"bootstrap.servers": kafka_bootstrap})
    for word in ("ccc", "ccc"):
        value = json.dumps({"word": word, "count": 3}, separators=(",", ":")).encode()
        leftover.produce(topic, value, word.encode(),
                         headers=[("weir.sink", key), ("weir.window", str(wid(2)).encode())])
    assert leftover.flush(30) == 0
    again = KafkaSink(topic, kafka_bootstrap, key_column="word")
    again.setup(context(tmp_path))
    try:
        write_window(again, 2, ["ccc", "ccc", "ccc"])
        assert (again.leftovers_skipped, again.records_written) == (2, 1)
    finally:
        again.teardown()
    assert words_of(read_back(kafka_bootstrap, topic)) == ["a", "ccc", "ccc", "ccc"]


def test_at_least_once_mode_publishes_plain_records(kafka_bootstrap, tmp_path):
    topic = new_topic(kafka_bootstrap)
    sink = KafkaSink(topic, kafka_bootstrap, value_column="word", exactly_once=False)
    sink.setup(context(tmp_path))
    try:
        write_window(sink, 1, ["x", "y"])
    finally:
        sink.teardown()
    from confluent_kafka import Consumer, TopicPartition

    reader = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "plain"})
    try:
        reader.assign([TopicPartition(topic, p, 0) for p in range(3)])
        got: list[bytes] = []
        for _ in range(100):
            got += [m.value() for m in reader.consume(10, 0.1) if m.error() is None]
            if len(got) == 2:
                break
        assert sorted(got) == [b"x", b"y"]
    finally:
        reader.close()


@pytest.mark.slow
def test_an_unknown_topic_an_unreachable_broker_and_a_missing_column_are_clear_errors(
        kafka_bootstrap, tmp_path):
    with pytest.raises(KafkaSetupError, match="topic 'nowhere-topic' does not exist"):
        KafkaSink("nowhere-topic", kafka_bootstrap).setup(context(tmp_path))
    nobody = KafkaSink("t", "127.0.0.1:1", config={"socket.connection.setup.timeout.ms": 2000})
    with pytest.raises(KafkaSetupError, match="no Kafka broker answers at '127.0.0.1:1'") as e:
        nobody.setup(context(tmp_path))
    assert isinstance(e.value, PermanentError)  # a first deployment: the application fails
    topic = new_topic(kafka_bootstrap)
    sink = KafkaSink(topic, kafka_bootstrap, key_column="user")
    sink.setup(context(tmp_path))
    try:
        with pytest.raises(KeyError, match="key_column 'user' is not among the window's "
                                           r"columns \['word', 'count'\]"):
            write_window(sink, 1, ["a"])
    finally:
        sink.teardown()

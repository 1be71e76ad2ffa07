"""KafkaSource against a real Kafka-protocol broker, driven through its hooks and restored
from its checkpoints as a recovered container would restore it."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from tests.operators.test_exactly_once import source_window
from tests.operators.test_library import Emitted, wid
from weir.container.operator_errors import is_fatal
from weir.operators.library import KafkaSource
from weir.operators.library.kafka_client import KafkaSetupError, RepeatedLogFilter
from weir.operators.library.kafka_records import RecordDecodeError
from weir.operators.metrics import collect_metrics
from weir.operators.operator import OperatorContext, PermanentError
from weir.runtime.operator_state import capture, restore

pytestmark = pytest.mark.timeout(120)


def admin(bootstrap: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def new_topic(bootstrap: str, partitions: int = 3) -> str:
    from confluent_kafka.admin import NewTopic

    name = f"t-{uuid.uuid4().hex[:10]}"
    client = admin(bootstrap)  # kept until the futures are done
    for future in client.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(30)
    return name


def produce(bootstrap: str, topic: str, records: list[tuple[int, bytes | None, bytes | None]]
            ) -> None:
    """``(partition, key, value)`` records, each acknowledged."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for partition, key, value in records:
        producer.produce(topic, value, key, partition=partition)
    assert producer.flush(30) == 0


def context(state: Path, recovered: int = -1, index: int = 0, count: int = 1,
            name: str = "kafka") -> OperatorContext:
    return OperatorContext(name=name, operator_id=3 + index, container_id="c0",
                           attributes={"STREAMING_WINDOW_SIZE_MILLIS": 100},
                           state_dir=str(state), recovered_window=recovered,
                           partition_index=index, partition_count=count)


def started(src: KafkaSource, state: Path, **options) -> Emitted:
    emitted = Emitted()
    src.connect_outputs(emitted)
    src.setup(context(state, **options))
    return emitted


def window(src: KafkaSource, emitted: Emitted, counter: int, calls: int = 3) -> bool:
    return source_window(src, emitted, counter, calls)


def values(emitted: Emitted) -> dict[int, list[str]]:
    return {w: sorted(v.decode() for b in bs for v in b.column("value").to_pylist())
            for w, bs in emitted.batches.items() if any(b.num_rows for b in bs)}


def test_reads_every_partition_with_its_offsets_and_ends_at_the_end(kafka_bootstrap, tmp_path):
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, [(i % 3, f"k{i}".encode(), f"v{i}".encode())
                                     for i in range(30)])
    src = KafkaSource(topic, kafka_bootstrap, stop_at="end", batch_records=4)
    emitted = started(src, tmp_path / "state")
    try:
        for counter in range(1, 100):
            if not window(src, emitted, counter):
                break
        else:
            pytest.fail("the bounded read never ended")
        rows = emitted.rows()
        assert sorted(r["value"] for r in rows) == sorted(f"v{i}".encode() for i in range(30))
        assert {(r["partition"], r["offset"]) for r in rows} == {
            (p, o) for p in range(3) for o in range(10)}
        assert all(r["topic"] == topic and r["key"] == b"k" + r["value"][1:] for r in rows)
        assert all(r["timestamp"] is not None for r in rows)
        assert src.positions == {f"{topic}/{p}": 10 for p in range(3)}
        assert src.records_read == 30
        metrics = collect_metrics(src)
        assert metrics["records_read"] == 30 and metrics["lag_total"] == 0
        assert {k for k in metrics if k.startswith("lag[")} == {
            f"lag[{topic}/{p}]" for p in range(3)}
    finally:
        src.teardown()


def test_a_restored_source_replays_identical_windows_then_reads_on(kafka_bootstrap, tmp_path):
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, [(i % 3, None, f"a{i}".encode()) for i in range(12)])
    src = KafkaSource(topic, kafka_bootstrap, batch_records=2)
    emitted = started(src, tmp_path / "state")
    window(src, emitted, 1, calls=2)
    checkpoint = capture(src)  # the state as of window 1
    for counter in range(2, 5):
        window(src, emitted, counter, calls=2)
    first_run = values(emitted)
    src.teardown()  # the container dies
    produce(kafka_bootstrap, topic, [(i % 3, None, f"b{i}".encode()) for i in range(6)])

    again = restore(KafkaSource(topic, kafka_bootstrap), checkpoint)
    emitted_again = Emitted()
    again.connect_outputs(emitted_again)
    again.setup(context(tmp_path / "state", recovered=wid(1)))
    try:
        for counter in range(2, 5):
            window(again, emitted_again, counter, calls=5)  # other timing, same windows
        assert values(emitted_again) == {w: v for w, v in first_run.items() if w > wid(1)}
        for counter in range(5, 30):
            window(again, emitted_again, counter)
            read = sorted(v for vs in (first_run | values(emitted_again)).values() for v in vs)
            if len(read) == 18:
                break
        assert read == sorted([f"a{i}" for i in range(12)] + [f"b{i}" for i in range(6)])
    finally:
        again.teardown()


def test_partitions_split_over_source_partitions_and_new_ones_are_picked_up(kafka_bootstrap,
                                                                             tmp_path):
    from confluent_kafka.admin import NewPartitions

    topic = new_topic(kafka_bootstrap, partitions=4)
    sources = [KafkaSource(topic, kafka_bootstrap, discover_partitions_s=0.0)
               for _ in range(2)]
    emitted = [started(s, tmp_path / f"state-{i}", index=i, count=2)
               for i, s in enumerate(sources)]
    try:
        owned = [set(s.positions) for s in sources]
        assert owned[0] | owned[1] == {f"{topic}/{p}" for p in range(4)}
        assert not owned[0] & owned[1] and owned[0] and owned[1]
        client = admin(kafka_bootstrap)
        for future in client.create_partitions([NewPartitions(topic, 6)]).values():
            future.result(30)
        produce(kafka_bootstrap, topic, [(p, None, f"p{p}".encode()) for p in range(6)])
        for counter in range(1, 40):
            for source, out in zip(sources, emitted, strict=True):
                window(source, out, counter)
            if sum(len(out.rows()) for out in emitted) == 6:
                break
        got = sorted(r["value"].decode() for out in emitted for r in out.rows())
        assert got == [f"p{p}" for p in range(6)]
        assert set(sources[0].positions) | set(sources[1].positions) == {
            f"{topic}/{p}" for p in range(6)}
    finally:
        for source in sources:
            source.teardown()


def test_committed_windows_commit_their_offsets_to_the_group(kafka_bootstrap, tmp_path):
    from confluent_kafka import Consumer, TopicPartition

    topic = new_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, topic, [(0, None, f"v{i}".encode()) for i in range(5)])
    group = f"g-{uuid.uuid4().hex[:8]}"
    src = KafkaSource(topic, kafka_bootstrap, group_id=group, stop_at="end")
    emitted = started(src, tmp_path / "state")
    checker = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    try:
        for counter in range(1, 20):
            if not window(src, emitted, counter):
                break
        assert len(emitted.rows()) == 5
        [before] = checker.committed([TopicPartition(topic, 0)], timeout=10)
        assert before.offset < 0, "nothing is committed to the group before the window is"
        src.committed(wid(counter))
        for _ in range(100):
            [after] = checker.committed([TopicPartition(topic, 0)], timeout=10)
            if after.offset == 5:
                break
            src._consumer.poll(0.1)  # serves the asynchronous commit
        assert after.offset == 5
    finally:
        checker.close()
        src.teardown()


def test_start_from_latest_and_from_the_group(kafka_bootstrap, tmp_path):
    from confluent_kafka import Consumer, TopicPartition

    topic = new_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, topic, [(0, None, f"old{i}".encode()) for i in range(4)])
    latest = KafkaSource(topic, kafka_bootstrap, start_from="latest")
    started(latest, tmp_path / "latest")
    assert latest.positions == {f"{topic}/0": 4}
    latest.teardown()

    group = f"g-{uuid.uuid4().hex[:8]}"
    committer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    committer.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
    committer.close()
    from_group = KafkaSource(topic, kafka_bootstrap, start_from="group", group_id=group)
    started(from_group, tmp_path / "group")
    assert from_group.positions == {f"{topic}/0": 3}
    from_group.teardown()


def test_json_values_are_read_into_the_declared_schema(kafka_bootstrap, tmp_path):
    topic = new_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, topic, [
        (0, b"a", json.dumps({"user": "ann", "amount": 3, "extra": 1}).encode()),
        (0, b"b", json.dumps({"user": "bob", "amount": 4}).encode()),
        (0, b"c", None)])  # a tombstone: a row of nulls
    schema = pa.schema([("user", pa.string()), ("amount", pa.int64())])
    src = KafkaSource(topic, kafka_bootstrap, value_format="json", value_schema=schema,
                      stop_at="end")
    emitted = started(src, tmp_path / "state")
    try:
        while window(src, emitted, 1):
            pass
        rows = emitted.rows()
        assert [(r["key"], r["user"], r["amount"]) for r in rows] == [
            (b"a", "ann", 3), (b"b", "bob", 4), (b"c", None, None)]
        assert emitted.all_batches()[0].schema.field("amount").type == pa.int64()
    finally:
        src.teardown()


@pytest.mark.parametrize(("value_format", "bad", "says"), [
    ("utf8", b"\xff\xfe", "is not UTF-8 text"),
    ("json", b"{not json", "is not JSON"),
    ("json", b'{"user": "x", "amount": "many"}', "does not fit value_schema"),
])
def test_a_record_that_does_not_decode_is_an_error_naming_it(kafka_bootstrap, tmp_path,
                                                             value_format, bad, says):
    topic = new_topic(kafka_bootstrap, partitions=1)
    good = b'{"user": "x", "amount": 1}' if value_format == "json" else b"fine"
    produce(kafka_bootstrap, topic, [(0, None, good), (0, None, bad), (0, None, good)])
    schema = pa.schema([("user", pa.string()), ("amount", pa.int64())]) \
        if value_format == "json" else None
    src = KafkaSource(topic, kafka_bootstrap, value_format=value_format, value_schema=schema,
                      stop_at="end", batch_records=10)
    emitted = started(src, tmp_path / "state")
    try:
        with pytest.raises(RecordDecodeError, match=f"the record at topic '{topic}', "
                                                    f"partition 0, offset 1 {says}"):
            for counter in range(1, 20):
                window(src, emitted, counter)
    finally:
        src.teardown()


class WithErrors(Emitted):
    """Keeps what goes to the dead-letter port apart."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[pa.RecordBatch] = []

    def __call__(self, port: str, batch: pa.RecordBatch) -> None:
        if port == "errors":
            self.errors.append(batch)
        else:
            super().__call__(port, batch)


def test_with_dead_letters_a_record_that_does_not_decode_is_set_aside_as_it_came(
        kafka_bootstrap, tmp_path):
    topic = new_topic(kafka_bootstrap, partitions=1)
    good = [b'{"user": "a", "amount": 1}', b'{"user": "b", "amount": 2}']
    produce(kafka_bootstrap, topic, [(0, None, good[0]), (0, b"k", b"{not json"),
                                     (0, None, good[1]), (0, None, b"[1, 2]")])
    schema = pa.schema([("user", pa.string()), ("amount", pa.int64())])
    src = KafkaSource(topic, kafka_bootstrap, value_format="json", value_schema=schema,
                      stop_at="end", batch_records=10)
    emitted = WithErrors()
    src.connect_outputs(emitted)
    src.setup(OperatorContext(name="kafka", operator_id=3, container_id="c0", attributes={
        "STREAMING_WINDOW_SIZE_MILLIS": 100, "ON_ERROR": "DEAD_LETTER"},
        state_dir=str(tmp_path / "state")))
    try:
        for counter in range(1, 20):
            if not window(src, emitted, counter):
                break
        assert [(r["user"], r["offset"]) for r in emitted.rows()] == [("a", 0), ("b", 2)]
        dead = [r for b in emitted.errors for r in b.to_pylist()]
        assert [(r["key"], r["value"], r["offset"], r["weir_port"]) for r in dead] == [
            (b"k", b"{not json", 1, "output"), (None, b"[1, 2]", 3, "output")]
        assert dead[0]["weir_error"].startswith(
            f"RecordDecodeError: the record at topic '{topic}', partition 0, offset 1 is "
            "not JSON")
        assert "is JSON but not an object" in dead[1]["weir_error"]
        assert src.positions == {f"{topic}/0": 4} and src.records_read == 2
    finally:
        src.teardown()


@pytest.mark.slow
def test_an_unknown_topic_and_an_unreachable_broker_are_clear_errors(kafka_bootstrap, tmp_path):
    missing = KafkaSource("no-such-topic-here", kafka_bootstrap)
    with pytest.raises(KafkaSetupError, match="topic 'no-such-topic-here' does not exist on "
                                              "the brokers at"):
        started(missing, tmp_path / "a")
    nobody = KafkaSource("t", "127.0.0.1:1", config={"socket.connection.setup.timeout.ms":
                                                     2000})
    with pytest.raises(KafkaSetupError, match="no Kafka broker answers at '127.0.0.1:1'") as e:
        started(nobody, tmp_path / "b")
    # at the first deployment no restart can fix it: the application fails at once
    assert isinstance(e.value, PermanentError) and is_fatal(e.value)
    with pytest.raises(KafkaSetupError) as e:  # after a checkpoint: restarts wait for it
        started(KafkaSource("t", "127.0.0.1:1", config={"socket.connection.setup.timeout.ms":
                                                        2000}), tmp_path / "c", recovered=5)
    assert not isinstance(e.value, PermanentError) and not is_fatal(e.value)


def test_the_clients_repeated_log_lines_come_once_a_minute_with_how_many_were_held():
    now = [0.0]
    kept = RepeatedLogFilter(every_s=60, clock=lambda: now[0])

    def line(text: str) -> logging.LogRecord:
        return logging.LogRecord("librdkafka", logging.WARNING, "", 0, text, (), None)

    refused = "FAIL [thrd:127.0.0.1:1/bootstrap]: Connect to ipv4#127.0.0.1:1 failed (after %dms)"
    first = line(refused % 3)
    assert kept.filter(first) and first.getMessage() == refused % 3
    assert [kept.filter(line(refused % ms)) for ms in (5, 9, 12)] == [False, False, False]
    assert kept.filter(line("another kind of line"))
    now[0] = 61.0
    again = line(refused % 20)
    assert kept.filter(again)
    assert again.getMessage() == refused % 20 + " (3 like it held back)"


def test_settings_weir_owns_are_refused():
    with pytest.raises(ValueError, match=r"\['enable.auto.commit'\] are set by Weir"):
        KafkaSource("t", "b:9092", config={"enable.auto.commit": True})
    with pytest.raises(ValueError, match="value_format='json' needs value_schema"):
        KafkaSource("t", "b:9092", value_format="json")
    with pytest.raises(ValueError, match="start_from must be one of"):
        KafkaSource("t", "b:9092", start_from="yesterday")


def test_a_new_partition_takes_every_old_partitions_offsets():
    old = [KafkaSource("t", "b:9092") for _ in range(2)]
    old[0].positions, old[1].positions = {"t/0": 5, "t/2": 7}, {"t/1": 3}
    new = KafkaSource("t", "b:9092").repartitioned(old, None)
    assert new.positions == {"t/0": 5, "t/1": 3, "t/2": 7}

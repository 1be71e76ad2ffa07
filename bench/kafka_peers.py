"""The Kafka row in context: on the same kind of broker, the same pre-filled topic
(``bench.kafka_topics``) read by one plain ``confluent-kafka`` consumer (the ceiling of a
Python reader) and the bench job run on Quix Streams, each checked against the known
answer like every other row.

- ``kafka-consumer-ceiling``: one ``Consumer`` assigned every partition, ``consume()`` in
  batches, each value decoded with ``json.loads`` and added to a per-key count and sum (the
  least a reader of this job does). Messages/s from the first ``consume()`` to the last
  message decoded; no latency (there are no windows).
- ``quixstreams``: ``tumbling_window(window_ms).agg(Count, Sum).final()`` per key, exactly
  once, results ``{"name", "count", "sum"}`` to an output topic read back and checked.
  Quix's windows are event-time windows over the records' timestamps and close only when a
  later record arrives, so its input gets one end marker per partition (key ``__end__``,
  an hour later) after the same events; the marker's own window never closes. Events/s
  from the first record processed to the last result visible (the group's committed
  offsets at the end: exactly once commits them with the results). Latency per partition
  and window: from the processing of the record that closed it to its results being
  visible (the first poll of the committed offsets past that record, every 20 ms).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from bench.common import JobResult, JobSpec, check_totals
from bench.kafka_topics import PARTITIONS, NoBroker, bench_broker, prepare, read_totals

__all__ = ["END_KEY", "KAFKA_PEERS", "check_ceiling", "consumer_ceiling", "quixstreams_job",
           "render_kafka_context", "window_latencies"]

KAFKA_PEERS = ("kafka-consumer-ceiling", "quixstreams")
"""The systems (``bench.one``) run next to ``weir-kafka`` on the same events."""

END_KEY = "__end__"
COMMIT_INTERVAL_S = 1.0
"""Quix's checkpoint (transaction) interval: Weir's row commits every 2 × 500 ms windows."""
_POLL_S = 0.02


def check_ceiling(read: int, totals: Mapping[str, tuple[int, int]],
                  expected: Mapping[str, tuple[int, int]]) -> tuple[bool, str]:
    """Every message read once, and the per-key counts and sums the known answer's."""
    want = sum(count for count, _ in expected.values())
    if read != want:
        return False, f"WRONG: read {read} messages of {want}"
    return check_totals(totals, expected)


def consumer_ceiling(spec: JobSpec, timeout_s: float = 600.0) -> JobResult:
    """The pre-filled topic read by one plain consumer; see the module docs."""
    try:
        with bench_broker() as broker:
            topics = prepare(broker.bootstrap, spec)
            read, totals, seconds = _consume_all(broker.bootstrap, topics.events,
                                                 spec.events, timeout_s)
    except NoBroker as missing:
        return JobResult("kafka consumer ceiling", spec.events, 0.0, [], False, str(missing))
    correct, detail = check_ceiling(read, totals, spec.expected())
    return JobResult(broker.row_name("kafka consumer ceiling"), spec.events,
                     seconds if correct else 0.0, [], correct, detail, extra={
                         "broker": broker.description, "fill_seconds":
                         round(topics.fill_seconds, 1), "decoded": "json.loads per value",
                         "latency": "none: no windows"})


def _consume_all(bootstrap: str, topic: str, events: int,
                 timeout_s: float) -> tuple[int, dict[str, tuple[int, int]], float]:
    """Messages read, per-key (count, sum), seconds from the first ``consume()`` on."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                         "enable.auto.commit": False})
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    read = 0
    try:
        consumer.list_topics(topic, timeout=30)  # connected before the clock starts
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        started = time.monotonic()
        deadline = started + timeout_s
        while read < events and time.monotonic() < deadline:
            for message in consumer.consume(10_000, 0.5):
                if message.error() is not None:
                    raise KafkaException(message.error())
                row = json.loads(message.value())
                total = totals[row["name"]]
                total[0] += 1
                total[1] += row["value"]
                read += 1
        seconds = time.monotonic() - started
    finally:
        consumer.close()
    return read, {key: (count, value) for key, (count, value) in totals.items()}, seconds


def render_kafka_context(results: Iterable[Mapping[str, Any]]) -> str:
    """One line: Weir's Kafka row as a ratio to the consumer ceiling's and Quix Streams'
    (correct rows only); empty without a correct Weir Kafka row and a correct peer."""
    rows = {}
    for r in results:
        for name in ("weir kafka", "kafka consumer ceiling", "quixstreams"):
            if str(r.get("system", "")).startswith(name) and r.get("correct") \
                    and r.get("events_per_second"):
                rows[name] = r
    weir = rows.get("weir kafka")
    if weir is None or len(rows) < 2:
        return ""
    eps = float(weir["events_per_second"])
    parts = []
    if "kafka consumer ceiling" in rows:
        ceiling = float(rows["kafka consumer ceiling"]["events_per_second"])
        parts.append(f"{eps / ceiling:.2f}× the ceiling of one plain confluent-kafka consumer "
                     f"({ceiling:,.0f} messages/s, JSON decoded, no windows)")
    if "quixstreams" in rows:
        quix = rows["quixstreams"]
        parts.append(f"{eps / float(quix['events_per_second']):.2f}× Quix Streams "
                     f"({float(quix['events_per_second']):,.0f} events/s, p99 "
                     f"{float(quix.get('latency_p99_ms', 0)):,.0f} ms)")
    return f"kafka, same events on the same kind of broker: weir kafka {eps:,.0f} events/s, " \
        + "; ".join(parts)


def window_latencies(closed: Mapping[tuple[int, int], tuple[float, int]],
                     commits: Iterable[tuple[float, Mapping[int, int]]]) -> list[float]:
    """Per (partition, window): ms from its close to the first commit seen after it that is
    past its closing record.

    ``closed``: ``{(partition, window start): (monotonic s, closing record's offset)}``;
    ``commits``: ``(monotonic s, {partition: committed offset})`` in time order. A window
    never seen committed has no latency (the row's check fails it anyway).
    """
    commits = list(commits)
    latencies = []
    for (partition, _), (closed_at, offset) in sorted(closed.items()):
        out = next((at for at, offsets in commits
                    if at >= closed_at and offsets.get(partition, -1) > offset), None)
        if out is not None:
            latencies.append(round((out - closed_at) * 1000, 1))
    return latencies


def quixstreams_job(spec: JobSpec, work: Path, timeout_s: float = 600.0) -> JobResult:
    """The bench job on Quix Streams, from the input topic to an output topic; see the
    module docs."""
    try:
        with bench_broker() as broker:
            topics = prepare(broker.bootstrap, spec)
            _append_end_markers(broker.bootstrap, topics.events)
            seconds, latencies, error = _run_quix(broker.bootstrap, topics.events,
                                                  topics.results, spec.window_ms, work,
                                                  timeout_s)
            if error:
                return JobResult(broker.row_name("quixstreams"), spec.events, 0.0, [], False,
                                 error)
            correct, detail = check_totals(read_totals(broker.bootstrap, topics.results),
                                           spec.expected())
    except NoBroker as missing:
        return JobResult("quixstreams", spec.events, 0.0, [], False, str(missing))
    from importlib.metadata import version

    return JobResult(broker.row_name("quixstreams"), spec.events, seconds, latencies, correct,
                     detail, extra={
                         "broker": broker.description,
                         "fill_seconds": round(topics.fill_seconds, 1),
                         "quixstreams": version("quixstreams"),
                         "confluent_kafka": version("confluent-kafka"),
                         "windows": "event time (record timestamps), per partition",
                         "partition_windows": len(latencies),
                         "processing_guarantee": "exactly-once",
                         "commit_interval_s": COMMIT_INTERVAL_S})


def _append_end_markers(bootstrap: str, topic: str) -> None:
    """One record per partition an hour after the events, so every window of theirs closes."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    later = int(time.time() * 1000) + 3_600_000
    marker = json.dumps({"name": END_KEY, "value": 0}).encode()
    for partition in range(PARTITIONS):
        producer.produce(topic, marker, END_KEY.encode(), partition=partition, timestamp=later)
    if producer.flush(60):
        raise RuntimeError(f"the end markers of {topic!r} could not be written")


def _run_quix(bootstrap: str, topic: str, out: str, window_ms: int, work: Path,
              timeout_s: float) -> tuple[float, list[float], str]:
    """Runs the Quix application until its committed offsets reach the input's end;
    ``(seconds, latencies ms, error)``."""
    from quixstreams import Application, message_context
    from quixstreams.dataframe.windows import Count, Sum

    group = f"bench-quix-{uuid.uuid4().hex[:8]}"
    app = Application(broker_address=bootstrap, consumer_group=group,
                      auto_offset_reset="earliest", processing_guarantee="exactly-once",
                      commit_interval=COMMIT_INTERVAL_S, state_dir=str(work / "quix-state"),
                      loglevel="WARNING")
    source = app.topic(topic, key_deserializer="str", value_deserializer="json")
    sink = app.topic(out, key_serializer="str", value_serializer="json")
    started: list[float] = []
    closed: dict[tuple[int, int], tuple[float, int]] = {}

    def first_in(_value: object) -> None:
        if not started:
            started.append(time.monotonic())

    def result(window: dict, key: str, _timestamp: int, _headers: object) -> dict:
        context = message_context()
        closed.setdefault((context.partition, window["start"]),
                          (time.monotonic(), context.offset))
        return {"name": key, "count": window["count"], "sum": window["sum"]}

    sdf = app.dataframe(source).update(first_in)
    sdf = sdf.tumbling_window(window_ms).agg(count=Count(), sum=Sum("value")) \
        .final(closing_strategy="partition")
    sdf.apply(result, metadata=True).to_topic(sink)
    watcher = _CommitWatcher(bootstrap, topic, group, app.stop, timeout_s)
    watcher.start()
    try:
        app.run()
    finally:
        watcher.stop()
    if watcher.error:
        return 0.0, [], watcher.error
    if not started or watcher.finished_at is None:
        return 0.0, [], "the application stopped before its input was committed"
    return (watcher.finished_at - started[0], window_latencies(closed, watcher.commits), "")


class _CommitWatcher:
    """Polls a consumer group's committed offsets until they reach the topic's end, then
    stops the application (``stop``); also at its deadline, with ``error`` set."""

    def __init__(self, bootstrap: str, topic: str, group: str, stop: Callable[[], None],
                 timeout_s: float) -> None:
        self._config = {"bootstrap.servers": bootstrap, "group.id": group,
                        "enable.auto.commit": False}
        self._topic, self._stop_app, self._timeout_s = topic, stop, timeout_s
        self._done = threading.Event()
        self.commits: list[tuple[float, dict[int, int]]] = []
        self.finished_at: float | None = None
        self.error = ""
        self._thread = threading.Thread(target=self._run, name="commit-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        reader = Consumer(self._config)
        deadline = time.monotonic() + self._timeout_s
        try:
            partitions = [TopicPartition(self._topic, p) for p in range(PARTITIONS)]
            ends = {tp.partition: reader.get_watermark_offsets(tp, timeout=30)[1]
                    for tp in partitions}
            while not self._done.is_set():
                offsets = {tp.partition: tp.offset
                           for tp in reader.committed(partitions, timeout=10)}
                now = time.monotonic()
                if not self.commits or self.commits[-1][1] != offsets:
                    self.commits.append((now, offsets))
                if all(offsets.get(p, -1) >= end for p, end in ends.items()):
                    self.finished_at = now
                    break
                if now > deadline:
                    self.error = f"timed out after {self._timeout_s:.0f} s: committed {offsets}"
                    break
                self._done.wait(_POLL_S)
        except Exception as exc:  # noqa: BLE001 - any failure stops the run and is its error
            self.error = f"watching the committed offsets failed: {exc!r}"
        finally:
            reader.close()
            self._stop_app()

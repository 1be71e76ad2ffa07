"""The benchmark job from Kafka to Kafka: a pre-filled topic → KafkaSource → the aggregation
in Spark → KafkaSink (exactly once).

The broker, the pre-filled topic and the read-back are ``bench.kafka_topics``', the same
as for the Kafka peers (``bench.kafka_peers``). The figures are from the first window to
the last result out, read from the master's window stats as for the ``weir`` row, and the
output topic is read back (``read_committed``) and checked against the known answer.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow as pa

from bench.common import JobResult, JobSpec, check_totals
from bench.kafka_topics import BOOTSTRAP_VARIABLE, NoBroker, bench_broker, prepare, read_totals
from bench.weir_job import _run_app, job_figures
from weir.operators import Dag
from weir.operators.library import KafkaSink, KafkaSource, WindowedCount

__all__ = ["BOOTSTRAP_VARIABLE", "build_dag", "run"]

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


def run(spec: JobSpec, app_window_count: int = 2, timeout_s: float = 600.0,
        work_dir: Path | None = None) -> JobResult:
    """Fills a topic, runs the job through Kafka, checks the output topic."""
    work = Path(work_dir or tempfile.mkdtemp(prefix="weir-bench-kafka-"))
    try:
        with bench_broker() as broker:
            topics = prepare(broker.bootstrap, spec)
            dag = build_dag(broker.bootstrap, topics.events, topics.results, app_window_count,
                            spec.window_ms)
            windows, error, wall_s = _run_app(dag, work, timeout_s)
            name = broker.row_name("weir kafka")
            if error:
                return JobResult(name, spec.events, 0.0, [], False, error)
            correct, detail = check_totals(read_totals(broker.bootstrap, topics.results),
                                           spec.expected())
    except NoBroker as missing:
        return JobResult("weir kafka", spec.events, 0.0, [], False, str(missing))
    seconds, latencies, result_windows = job_figures(windows, spec.window_ms)
    return JobResult(name, spec.events, seconds, latencies, correct, detail, extra={
        "broker": broker.description,
        "fill_seconds": round(topics.fill_seconds, 1),
        "application_windows": result_windows,
        "wall_seconds_with_startup": round(wall_s, 1),
    })

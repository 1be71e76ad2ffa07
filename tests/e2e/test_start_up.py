"""Start-up through the real processes: a container given a Spark operator starts Spark as
it starts, the sources run while that operator activates (Spark's JVM starting, its query
warming up), and the views say when each operator was set up and activated. The first
window that needs Spark waits for it; nothing is lost meanwhile."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from weir.operators import Dag
from weir.operators.library import FileSink, ParquetSource
from weir.operators.spark import SparkSql

pytestmark = pytest.mark.timeout(300)

FILES, ROWS = 4, 2_000


def test_sources_read_while_spark_starts_and_every_row_comes_out(master, tmp_path):
    data, out = tmp_path / "in", tmp_path / "out"
    data.mkdir()
    for index in range(FILES):
        x = pa.array(range(index * ROWS, (index + 1) * ROWS), pa.int64())
        pq.write_table(pa.table({"x": x}), data / f"part-{index}.parquet")
    dag = Dag("start-up", STREAMING_WINDOW_SIZE_MILLIS=200, HEARTBEAT_INTERVAL_MILLIS=100,
              SPARK_MASTER="local[1]", SPARK_SHUFFLE_PARTITIONS=1, SPARK_WARMUP_ROWS=1_000,
              SPARK_WARMUP_MILLIS=0, STATE_DIR=str(tmp_path / "state"))
    source = dag.add_operator("source", ParquetSource(data, rows_per_window=ROWS))
    double = dag.add_operator("double", SparkSql("SELECT x, 2 * x AS y FROM input"))
    sink = dag.add_operator("sink", FileSink(out, format="parquet"))
    dag.add_stream("rows", source.output, double.input)
    dag.add_stream("doubled", double.output, sink.input)
    app_id = master.core.submit(dag.to_descriptor(), {})
    info = master.wait_for_application(app_id, 240)
    assert info.state == "FINISHED", info.diagnostics

    written = pa.concat_tables(pq.read_table(f) for f in sorted(out.rglob("*.parquet")))
    assert sorted(zip(written.column("x").to_pylist(), written.column("y").to_pylist(),
                      strict=True)) == [(x, 2 * x) for x in range(FILES * ROWS)]

    operators = {op.name: op for op in master.core.list_operators(app_id)}
    spark_op = operators["double"]
    assert 0 < spark_op.set_up_ms <= spark_op.activated_ms
    windows = master.core.operator_info(app_id, "source").recent_windows
    first_began = min(w.begin_window_ms for w in windows if w.begin_window_ms > 0)
    # the source's first window began after every setup() and before Spark was warm
    assert spark_op.set_up_ms <= first_began < spark_op.activated_ms

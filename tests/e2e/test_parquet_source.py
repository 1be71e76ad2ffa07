"""ParquetSource end to end: a folder of Parquet files counted per key by Spark into an
exactly-once file sink, the source's container killed mid-run, and the totals still exact."""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.e2e.conftest import container_logs
from tests.e2e.test_recovery import pid_of, wait_finished, where_it_stands
from tests.harness import poll_for
from weir.master.client import WeirClient
from weir.operators.app import load_app

pytestmark = pytest.mark.timeout(300)

FILES, ROWS_PER_FILE, KEYS = 6, 50_000, 997

APP = """
    from weir.operators import Dag
    from weir.operators.library import FileSink, ParquetSource, WindowedCount

    dag = Dag("parquet-counts", CONTAINERS=3, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, HEARTBEAT_TIMEOUT_MILLIS=3000,
              CHECKPOINT_WINDOW_COUNT=4, STATE_DIR={state!r}, SPARK_MASTER="local[1]",
              SPARK_SHUFFLE_PARTITIONS=1, SPARK_WARMUP_ROWS=0, MAX_RESTARTS=8)
    source = dag.add_operator("source", ParquetSource({inbox!r}, rows_per_window=4000,
                                                      batch_rows=3000), CONTAINER=0)
    count = dag.add_operator("count", WindowedCount(key="key", value="value"), CONTAINER=1,
                             APPLICATION_WINDOW_COUNT=2)
    sink = dag.add_operator("sink", FileSink({out!r}, format="parquet", exactly_once=True),
                            CONTAINER=2)
    dag.add_stream("rows", source.output, count.input)
    dag.add_stream("counts", count.output, sink.input)
"""


def write_inbox(inbox: Path) -> dict[str, tuple[int, int]]:
    """Parquet files of (key, value) rows in row groups of 10,000; returns per key the
    reference (rows, sum of values)."""
    inbox.mkdir()
    tables = []
    for f in range(FILES):
        ids = range(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE)
        table = pa.table({"key": pa.array([f"k{i * 7919 % KEYS}" for i in ids], pa.string()),
                          "value": pa.array([i % 13 for i in ids], pa.int64())})
        pq.write_table(table, inbox / f".part-{f}.tmp", row_group_size=10_000)
        os.replace(inbox / f".part-{f}.tmp", inbox / f"part-{f}.parquet")
        tables.append(table)
    return totals(pa.concat_tables(tables).group_by("key").aggregate(
        [("value", "count"), ("value", "sum")]), "value_count", "value_sum")


def totals(table: pa.Table, count: str, total: str) -> dict[str, tuple[int, int]]:
    return {k: (c, s) for k, c, s in zip(table["key"].to_pylist(), table[count].to_pylist(),
                                         table[total].to_pylist(), strict=True)}


def published(out: Path) -> dict[str, tuple[int, int]]:
    """Per key, the rows and value sums of every published window file, added up."""
    files = sorted(out.glob("*.parquet"))
    assert files, "the sink published nothing"
    table = pa.concat_tables(pq.read_table(f) for f in files)
    grouped = table.group_by("key").aggregate([("count", "sum"), ("sum", "sum")])
    return totals(grouped, "count_sum", "sum_sum")


def test_parquet_files_counted_exactly_once_through_a_killed_source(master, tmp_path):
    expected = write_inbox(tmp_path / "inbox")
    app = tmp_path / "parquet_app.py"
    app.write_text(textwrap.dedent(APP.format(state=str(tmp_path / "state"),
                                              inbox=str(tmp_path / "inbox"),
                                              out=str(tmp_path / "out"))))
    client = WeirClient(master.address)
    with client:
        app_id = client.submit(load_app(app).to_descriptor())
        poll_for(lambda: client.application(app_id).committed_window_id >= 0, 120,
                 f"a first committed window\n{container_logs(master)}")
        container_id, pid = pid_of(client, app_id, "source")
        os.kill(pid, signal.SIGKILL)
        wait_finished(client, master, app_id, timeout_s=240)
        source = next(o for o in client.operators(app_id) if o.name == "source")
        assert source.failure_count >= 1, where_it_stands(client, app_id)
        assert next(c for c in client.containers(app_id)
                    if c.id == container_id).state == "KILLED"
    got = published(tmp_path / "out")
    wrong = {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v}
    assert not wrong and set(got) == set(expected), (
        f"{len(wrong)} keys with other (rows, sum) than expected: (got, expected) e.g. "
        f"{dict(list(wrong.items())[:5])}")
    assert os.listdir(tmp_path / "out" / ".staging") == [], "staged output left unpublished"

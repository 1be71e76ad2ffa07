"""Word count whose Spark jobs run on a real Spark standalone cluster (master + worker)."""

from __future__ import annotations

import collections
import subprocess
import sys

from tests.e2e.conftest import container_logs
from tests.e2e.wordcount import published_counts, words_of, write_wordcount_app
from tests.harness import ROOT, poll_for, tagged_env, tagged_processes
from weir.master.client import WeirClient
from weir.operators.app import load_app

LINES = 1_800


def test_wordcount_runs_its_spark_jobs_on_a_standalone_cluster(spark_cluster, master,
                                                               tmp_path):
    app, lines = write_wordcount_app(
        tmp_path, "cluster-wordcount", LINES,
        'CONTAINERS=2, STREAMING_WINDOW_SIZE_MILLIS=200, HEARTBEAT_INTERVAL_MILLIS=200, '
        f'SPARK_MASTER={spark_cluster.master_url!r}, SPARK_SHUFFLE_PARTITIONS=1, '
        'SPARK_WARMUP_ROWS=1000, SPARK_DRIVER_MEMORY="512m", SPARK_EXECUTOR_MEMORY="512m", '
        'SPARK_CORES_MAX=1')
    expected = collections.Counter(words_of(lines))

    def logs() -> str:
        return f"{container_logs(master)}\n{spark_cluster.logs()}"

    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        info = client.wait(app_id, 150)
        assert info.state == "FINISHED", f"{info.diagnostics}\n{logs()}"
        spark_container = {op.name: op for op in client.operators(app_id)}["count"].container_id

    counted, _ = published_counts(tmp_path / "out")
    assert counted == expected

    # The jobs ran on the cluster: the master knows the container's Spark application, the
    # worker started its executor, and that read the windows' Parquet files (loopback
    # master: the file handoff) and finished tasks.
    executor_log = executor_log_of(spark_cluster, f"weir-{app_id}-{spark_container}")
    assert "Reading File path: file:" in executor_log and ".parquet" in executor_log, logs()
    assert executor_log.count("Finished task") > 0, logs()


HANDOFF_SCRIPT = """
import sys
import pyarrow as pa
from weir.runtime.spark.bridge import SparkSessionBridge

bridge = SparkSessionBridge(master=sys.argv[1], shuffle_partitions=1, app_name=sys.argv[3],
                            executor_memory="512m", cores_max=1, handoff_dir=sys.argv[2])
batch = pa.record_batch({"x": list(range(1000))})
for handoff in ("shared", "arrow"):
    bridge.handoff = handoff
    df = bridge.to_dataframe([batch], batch.schema)
    print(handoff, bridge.to_arrow(df.selectExpr("sum(x) AS s")).to_pylist()[0]["s"])
bridge.stop()
"""


def test_shared_folder_and_arrow_handoffs_reach_the_executors(spark_cluster, tmp_path):
    """The two handoffs for clusters on other hosts, run on the real (loopback) cluster."""
    shared = tmp_path / "shared"
    env, tag = tagged_env(PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", HANDOFF_SCRIPT, spark_cluster.master_url,
                             str(shared), "weir-handoffs"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=180)
    poll_for(lambda: not tagged_processes(tag), 15, "the driver and its JVM to exit")
    assert result.returncode == 0, f"{result.stderr[-4000:]}\n{spark_cluster.logs()}"
    assert result.stdout.split() == ["shared", "499500", "arrow", "499500"], result.stdout
    executor_log = executor_log_of(spark_cluster, "weir-handoffs")
    assert f"Reading File path: {shared.as_uri()}/" in executor_log, spark_cluster.logs()
    assert executor_log.count("Finished task") >= 2, spark_cluster.logs()  # one job each


def executor_log_of(cluster, app_name: str) -> str:
    """The executors' logs of the cluster's application named ``app_name``."""
    ids = [a["id"] for a in cluster.applications() if a["name"] == app_name]
    assert len(ids) == 1, (app_name, cluster.applications())
    files = sorted(cluster.work_dir.glob(f"{ids[0]}/*/stderr"))
    assert files, f"no executor of {app_name} ran\n{cluster.logs()}"
    return "\n".join(p.read_text(errors="replace") for p in files)

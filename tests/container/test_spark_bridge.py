"""The Spark bridge: Arrow in, a job, Arrow out; scratch files live exactly as long as needed."""

from __future__ import annotations

import datetime
import os
import socket
import stat
import tempfile
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from weir.runtime.spark.bridge import (
    SparkBridgeStopped,
    SparkSessionBridge,
    _by_position,
    handoff_for,
)


@pytest.fixture(scope="module")
def bridge():
    spark = SparkSessionBridge(master="local[1]", shuffle_partitions=1)
    yield spark
    scratch = spark.scratch_dir
    spark.stop()
    assert scratch is None or not scratch.exists()


def scratch_files(bridge: SparkSessionBridge) -> list[str]:
    assert bridge.scratch_dir is not None
    return sorted(os.listdir(bridge.scratch_dir))


def test_nothing_starts_before_first_use(tmp_path: Path) -> None:
    spark = SparkSessionBridge(scratch_dir=tmp_path)
    assert not spark.started and spark.scratch_dir is None
    spark.stop()
    with pytest.raises(SparkBridgeStopped):
        _ = spark.session


@pytest.mark.slow
def test_round_trip_settings_and_file_lifetime(bridge: SparkSessionBridge) -> None:
    schema = pa.schema([("word", pa.string()), ("n", pa.int64()), ("nothing", pa.null())])
    batches = [pa.record_batch([pa.array(["a", "b", "a"]), pa.array([1, 2, 3]),
                                pa.nulls(3)], schema=schema),
               pa.record_batch([pa.array(["b"]), pa.array([10]), pa.nulls(1)], schema=schema)]
    df = bridge.to_dataframe(batches, schema)
    assert str(bridge.scratch_dir).startswith(("/dev/shm/", "/tmp"))
    assert f"weir-spark-{os.getpid()}-" in str(bridge.scratch_dir)
    assert len(scratch_files(bridge)) == 1  # the file lives until the job ran
    result = bridge.to_arrow(df.groupBy("word").sum("n").orderBy("word"))
    assert result.to_pylist() == [{"word": "a", "sum(n)": 4}, {"word": "b", "sum(n)": 12}]
    assert scratch_files(bridge) == []  # ... and not longer

    conf = bridge.session.conf
    assert conf.get("spark.sql.shuffle.partitions") == "1"
    assert conf.get("spark.sql.adaptive.enabled") == "false"
    assert conf.get("spark.ui.enabled") == "false"
    assert conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"


def test_job_scope_keeps_files_for_several_jobs(bridge: SparkSessionBridge) -> None:
    batch = pa.record_batch({"x": [1, 2, 3, 4]})
    with bridge.job():
        df = bridge.to_dataframe([batch], batch.schema)
        assert bridge.to_arrow(df.where("x % 2 = 0")).column("x").to_pylist() == [2, 4]
        assert len(scratch_files(bridge)) == 1
        assert bridge.to_arrow(df.selectExpr("sum(x) AS s")).to_pylist() == [{"s": 10}]
    assert scratch_files(bridge) == []
    empty = bridge.to_dataframe([], batch.schema)  # no batches: an empty DataFrame
    assert bridge.to_arrow(empty).num_rows == 0
    assert scratch_files(bridge) == []


def test_threads_share_the_bridge(bridge: SparkSessionBridge) -> None:
    results: dict[int, list[dict]] = {}
    errors: list[BaseException] = []

    def job(i: int) -> None:
        try:
            batch = pa.record_batch({"x": list(range(i * 100))})
            df = bridge.to_dataframe([batch], batch.schema)
            results[i] = bridge.to_arrow(df.selectExpr("count(*) AS n")).to_pylist()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=job, args=(i,)) for i in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert results == {i: [{"n": i * 100}] for i in (1, 2, 3)}
    assert scratch_files(bridge) == []


def test_a_warm_up_is_waited_for_by_every_caller(bridge: SparkSessionBridge) -> None:
    """A spare warms its Spark as it starts; an operator deployed meanwhile calls warm_up
    too and must report ready only once Spark is warm, not return at once."""
    assert not bridge.warm
    seen: list[bool] = []

    def warm_up() -> None:
        bridge.warm_up(max_rounds=2)
        seen.append(bridge.warm)

    threads = [threading.Thread(target=warm_up) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert seen == [True, True]
    assert scratch_files(bridge) == []


def test_orphaned_scratch_folders_are_removed(tmp_path: Path) -> None:
    dead = tmp_path / "weir-spark-999999999-abc"  # no such pid
    alive = tmp_path / f"weir-spark-{os.getppid()}-abc"
    other = tmp_path / "unrelated"
    for folder in (dead, alive, other):
        folder.mkdir()
    spark = SparkSessionBridge(scratch_dir=tmp_path)
    scratch = spark._files.new_path(".parquet").parent  # noqa: SLF001 - what to_dataframe does
    assert scratch.parent == tmp_path and scratch.is_dir() and spark.scratch_dir == scratch
    assert not dead.exists() and alive.exists() and other.exists()
    spark.stop()
    assert not scratch.exists()


def test_from_attributes() -> None:
    spark = SparkSessionBridge.from_attributes(
        {"SPARK_MASTER": "local[1]", "SPARK_SHUFFLE_PARTITIONS": 3, "SPARK_DRIVER_MEMORY": "2g"})
    assert (spark.master, spark.shuffle_partitions, spark.driver_memory) == ("local[1]", 3, "2g")


def test_handoff_follows_where_the_executors_are() -> None:
    assert handoff_for("local[2]") == handoff_for("local") == "local"
    assert handoff_for("spark://127.0.0.1:7077") == "local"  # workers on this host only
    assert handoff_for("spark://localhost:7077,[::1]:7078") == "local"
    assert handoff_for("spark://10.0.0.5:7077") == "arrow"
    assert handoff_for("spark://127.0.0.1:7077,spark-2.example:7077") == "arrow"
    assert handoff_for("yarn") == "arrow"
    assert handoff_for("spark://10.0.0.5:7077", "/mnt/weir") == "shared"


def test_cluster_settings() -> None:
    local = SparkSessionBridge(master="local[1]")
    assert local._cluster_settings(False) == {}  # noqa: SLF001 - local mode: nothing added
    loopback = SparkSessionBridge.from_attributes(
        {"SPARK_MASTER": "spark://127.0.0.1:7077", "SPARK_EXECUTOR_MEMORY": "512m",
         "SPARK_CORES_MAX": 1})
    assert loopback._cluster_settings(True) == {  # noqa: SLF001
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "512m", "spark.cores.max": "1"}
    remote = SparkSessionBridge.from_attributes(
        {"SPARK_MASTER": "spark://10.0.0.5:7077", "SPARK_DRIVER_HOST": "10.0.0.9"})
    assert remote.handoff == "arrow"
    assert remote._cluster_settings(False) == {"spark.driver.host": "10.0.0.9"}  # noqa: SLF001


def test_arrow_handoff_gives_what_the_parquet_files_give(
        bridge: SparkSessionBridge, monkeypatch: pytest.MonkeyPatch) -> None:
    moment = datetime.datetime(2026, 1, 2, 3, 4, 5)
    table = pa.table({
        "word": pa.array(["a", "b"]).dictionary_encode(),
        "u8": pa.array([1, 2], pa.uint8()), "u32": pa.array([1, 2], pa.uint32()),
        "u64": pa.array([1, 2**63], pa.uint64()), "x": pa.array([1.5, None]),
        "naive": pa.array([moment, None], pa.timestamp("ms")),
        "zoned": pa.array([moment, None], pa.timestamp("ns", tz="Europe/Paris")),
        "nothing": pa.nulls(2)})
    batches = table.to_batches()

    def through_spark() -> pa.Table:
        df = bridge.to_dataframe(batches, table.schema)
        return bridge.to_arrow(df.orderBy("u8"))

    via_files = through_spark()
    monkeypatch.setattr(bridge, "handoff", "arrow")
    via_arrow = through_spark()
    assert via_arrow.schema == via_files.schema
    assert via_arrow.to_pylist() == via_files.to_pylist()
    assert scratch_files(bridge) == []
    empty = bridge.to_dataframe([], table.schema)
    assert bridge.to_arrow(empty).schema == via_files.schema


def test_shared_handoff_dir(bridge: SparkSessionBridge, tmp_path: Path) -> None:
    shared = SparkSessionBridge(master="spark://10.0.0.5:7077", handoff_dir=tmp_path)
    batch = pa.record_batch({"x": [1, 2, 3]})
    df = shared.to_dataframe([batch], batch.schema, session=bridge.session)
    assert shared.scratch_dir is not None
    assert shared.scratch_dir.parent == tmp_path / socket.gethostname()
    assert all(f.startswith("file:") for f in df.inputFiles())  # never the default FS
    assert shared.to_arrow(df.selectExpr("sum(x) AS s")).to_pylist() == [{"s": 6}]
    assert scratch_files(shared) == []
    scratch = shared.scratch_dir
    shared.stop()
    assert not scratch.exists()


def test_the_jvm_log_config_is_private_and_not_a_planted_shared_file(tmp_path: Path) -> None:
    """Another user could plant /tmp/weir-log4j2-warn.properties; it must not be used."""
    planted = Path(tempfile.gettempdir()) / "weir-log4j2-warn.properties"
    existed = planted.exists()
    if not existed:
        planted.write_text("appender.evil.type = File\n")
    try:
        spark = SparkSessionBridge(scratch_dir=tmp_path)
        config = spark._log4j_config()
        assert config != planted and "evil" not in config.read_text()
        assert stat.S_IMODE(config.parent.stat().st_mode) == 0o700
        spark.stop()
        assert not config.parent.exists()
    finally:
        if not existed:
            planted.unlink()


def test_window_input_is_written_while_it_arrives(bridge: SparkSessionBridge,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    schema = pa.schema([("word", pa.string()), ("n", pa.int64()), ("nothing", pa.null())])
    big = pa.record_batch([pa.array(["a"] * 200_000), pa.array([1] * 200_000),
                           pa.nulls(200_000)], schema=schema)
    small = pa.record_batch([pa.array(["b"]), pa.array([5]), pa.nulls(1)], schema=schema)
    window_input = bridge.window_input(schema)
    window_input.append(small)
    window_input.append(big)  # past a row group's worth: written now, not at the end
    written = scratch_files(bridge)
    assert len(written) == 1 and os.path.getsize(bridge.scratch_dir / written[0]) > 0
    window_input.append(small)
    with bridge.job():
        df = window_input.dataframe()
        result = bridge.to_arrow(df.groupBy("word").sum("n").orderBy("word"))
    assert result.to_pylist() == [{"word": "a", "sum(n)": 200_000}, {"word": "b", "sum(n)": 10}]
    assert scratch_files(bridge) == []  # gone with its job

    dropped = bridge.window_input(schema)
    dropped.append(big)
    assert len(scratch_files(bridge)) == 1
    dropped.discard()  # a window cut short leaves no file behind
    assert scratch_files(bridge) == []

    monkeypatch.setattr(bridge, "handoff", "arrow")
    via_arrow = bridge.window_input(schema)
    for batch in (small, big, small):
        via_arrow.append(batch)
    result = bridge.to_arrow(via_arrow.dataframe().groupBy("word").sum("n").orderBy("word"))
    assert result.to_pylist() == [{"word": "a", "sum(n)": 200_000}, {"word": "b", "sum(n)": 10}]
    assert scratch_files(bridge) == []


def test_spark_is_given_the_schema_it_inferred_for_a_shape(bridge: SparkSessionBridge) -> None:
    batch = pa.record_batch({"word": ["a", "b"], "n": [1, 2]})
    first = bridge.to_dataframe([batch], batch.schema)
    cached = bridge._spark_schemas[_by_position(batch.schema)]  # noqa: SLF001 - what later
    # reads of these column types are given
    assert [f.dataType for f in cached.fields] == [f.dataType for f in first.schema.fields]
    again = bridge.to_dataframe([batch], batch.schema)  # read with the schema, no inference
    assert again.schema == first.schema
    assert bridge.to_arrow(again.selectExpr("sum(n) AS s")).to_pylist() == [{"s": 3}]


def test_a_warm_up_that_fails_is_told_to_every_caller(tmp_path: Path, monkeypatch) -> None:
    """It used to be logged and swallowed: a spare then waited as SPARE_STARTING for good
    and an operator reported ready over a Spark that never started."""
    import weir.runtime.spark.bridge as spark_bridge
    from weir.runtime.spark.bridge import SparkWarmUpError

    started = threading.Event()
    go_on = threading.Event()

    def gateway_exits(bridge, rows, max_rounds, budget_s):
        started.set()
        go_on.wait(10)
        raise RuntimeError("[JAVA_GATEWAY_EXITED] Java gateway process exited before "
                           "sending its port number.")

    monkeypatch.setattr(spark_bridge, "run_warm_up_jobs", gateway_exits)
    broken = SparkSessionBridge(master="local[1]", scratch_dir=tmp_path)
    heard: list[BaseException] = []

    def wait_for_it() -> None:
        try:
            broken.warm_up()
        except SparkWarmUpError as exc:
            heard.append(exc)

    first = threading.Thread(target=wait_for_it)
    first.start()
    assert started.wait(10)
    second = threading.Thread(target=wait_for_it)  # comes while the first warms up
    second.start()
    go_on.set()
    first.join(10)
    second.join(10)
    assert len(heard) == 2 and not broken.warm
    assert "JAVA_GATEWAY_EXITED" in str(heard[0])
    with pytest.raises(SparkWarmUpError, match="Spark could not start or warm up"):
        broken.warm_up()  # a later caller (an operator deployed afterwards) hears it too

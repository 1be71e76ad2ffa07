"""Hands a window's Arrow batches to the container's one SparkSession, on the fastest path.

Measured (see the design notes): pyarrow writes uncompressed, dictionary-free Parquet into a
memory-backed folder and Spark's vectorised reader scans it, within 10-25 % of data already
in the JVM; ``createDataFrame`` from Arrow is several times slower and is used only where
no file can reach the executors (see Handoff below).

File lifetime. ``to_dataframe`` writes one Parquet file that the DataFrame reads lazily, so
the file must outlive the job. Files are tracked per calling thread (one operator = one
thread) and deleted:

* at the end of the enclosing ``with bridge.job():`` block of the same thread (the way to
  run several jobs over the same inputs, e.g. one per output port), or else
* right after the next ``to_arrow`` of the same thread, which runs the job and then deletes
  every file that thread handed out (build DataFrames, run one job, repeat), or
* by ``release()`` (a DataFrame that is never run), and in any case by ``stop()``.

Do not keep a DataFrame from ``to_dataframe`` across windows; keep state as Arrow and hand
it over again each window.

Handoff (``SparkSessionBridge.handoff``). The Parquet file must be readable by whoever runs
the tasks, so the path depends on where the executors are:

* ``"local"``: local mode, or a standalone master on loopback (``spark://127.0.0.1:7077``),
  whose executors can only be on this machine: files in ``/dev/shm``, as fast as it gets.
* ``"shared"``: ``handoff_dir`` (``SPARK_HANDOFF_DIR``) is set: files in that folder, which
  every executor must see at the same path (NFS and the like).
* ``"arrow"``: any other cluster: ``createDataFrame`` from Arrow, which ships the data
  through the driver to the executors: slower, but it needs nothing from the cluster.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from weir.runtime.spark import class_archive
from weir.runtime.spark import gateway as spark_gateway
from weir.runtime.spark.handoff import (
    PARQUET_OPTIONS,
    Handoff,
    arrow_dataframe,
    default_scratch_parent,
    handoff_for,
    is_loopback_cluster,
    row_group_rows,
    to_table,
)
from weir.runtime.spark.java import JavaMissing, java_problem
from weir.runtime.spark.logs import quiet_query_context_loggers, write_log4j_config
from weir.runtime.spark.scratch import ScratchFiles
from weir.runtime.spark.warm_up import run_warm_up_jobs
from weir.runtime.spark.window_input import WindowInput

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Handoff", "SparkBridgeStopped", "SparkSessionBridge", "SparkWarmUpError", "handoff_for"]

_LOGGER = logging.getLogger(__name__)



class SparkBridgeStopped(RuntimeError):
    """The bridge was used after ``stop()``."""


class SparkWarmUpError(RuntimeError):
    """Spark could not start (its JVM, its gateway) or run the warm-up jobs."""


class SparkSessionBridge:
    """The container's Spark: one long-lived SparkSession, created on first use.

    Implements the ``operators.operator.SparkBridge`` protocol. Thread-safe: operator
    threads may build DataFrames and run jobs at the same time (Spark schedules the jobs
    FIFO on the shared cores). Use one bridge per process: a JVM has one SparkContext,
    so a second bridge would share (and its ``stop`` would stop) the same session.
    Scratch files go to ``<scratch_dir>/weir-spark-<pid>-<random>/``; folders left by dead
    processes are removed when a bridge makes its own.

    Args:
        master: Spark master URL (``local[2]``, ``spark://host:7077``).
        shuffle_partitions: ``spark.sql.shuffle.partitions``; small for small frequent jobs.
        driver_memory: ``spark.driver.memory`` (only applies if this starts the JVM).
        scratch_dir: parent folder of this bridge's scratch folder; default ``/dev/shm``
            (memory-backed), else the system temporary folder.
        app_name: Spark application name.
        log_level: Spark's log level once the session is up.
        conf: extra Spark settings, applied last.
        warmup_rows: rows per warm-up aggregation (see ``warm_up``).
        warmup_millis: how long the warm-up goes on after its first round (see
            ``warm_up``).
        driver_host: ``spark.driver.host``, where a cluster's executors reach this driver;
            default ``127.0.0.1`` for a loopback ``spark://`` master, else Spark's choice.
        executor_memory: ``spark.executor.memory`` on a cluster; default Spark's.
        cores_max: ``spark.cores.max`` on a standalone cluster; 0 = Spark's default (all).
        handoff_dir: a folder every executor reads at the same path; when set, the Parquet
            files go there (under ``<handoff_dir>/<hostname>/``) whatever the master.

    Example (it starts a JVM, so it is not a doctest)::

        bridge = SparkSessionBridge(master="local[1]")
        batch = pa.record_batch({"x": [1, 2, 3]})
        df = bridge.to_dataframe([batch], batch.schema)
        bridge.to_arrow(df.selectExpr("sum(x) AS s")).to_pylist()  # [{'s': 6}]
        bridge.stop()
    """

    def __init__(
        self,
        master: str = "local[2]",
        shuffle_partitions: int = 2,
        driver_memory: str = "1g",
        scratch_dir: str | os.PathLike[str] | None = None,
        app_name: str = "weir",
        *,
        log_level: str = "WARN",
        conf: Mapping[str, str] | None = None,
        warmup_rows: int = 10_000,
        warmup_millis: int = 1_000,
        driver_host: str = "",
        executor_memory: str = "",
        cores_max: int = 0,
        handoff_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.master = master
        self.driver_host = driver_host
        self.executor_memory = executor_memory
        self.cores_max = int(cores_max)
        self.handoff: Handoff = handoff_for(master, handoff_dir)
        if handoff_dir:  # one folder per host: orphan clean-up judges only its own pids
            scratch_dir = Path(handoff_dir) / socket.gethostname()
        self.warmup_rows = int(warmup_rows)
        self.warmup_millis = int(warmup_millis)
        self.shuffle_partitions = int(shuffle_partitions)
        self.driver_memory = driver_memory
        self.app_name = app_name
        self.log_level = log_level
        self.conf = dict(conf or {})
        self._files = ScratchFiles(Path(scratch_dir) if scratch_dir is not None
                                   else default_scratch_parent(), self._check_running)
        self._log4j_dir: Path | None = None
        self._session: SparkSession | None = None
        self._warmed = threading.Event()  # a warm-up (``_warm``: started) ended
        self._warm_ok = False  # ... and ran its jobs
        self._warm_error: Exception | None = None  # ... or failed: why
        self._lock = threading.RLock()
        self._warm = False
        self._spark_schemas: dict[pa.Schema, Any] = {}  # _by_position(schema) -> Spark schema
        self._stopped = False

    @classmethod
    def from_attributes(
        cls, attributes: Mapping[str, Any], **kwargs: Any
    ) -> SparkSessionBridge:
        """A bridge configured by the resolved DAG attributes (``SPARK_MASTER`` and co.)."""
        return cls(
            master=str(attributes.get("SPARK_MASTER", "local[2]")),
            shuffle_partitions=int(attributes.get("SPARK_SHUFFLE_PARTITIONS", 2)),
            driver_memory=str(attributes.get("SPARK_DRIVER_MEMORY", "1g")),
            warmup_rows=int(attributes.get("SPARK_WARMUP_ROWS", 10_000)),
            warmup_millis=int(attributes.get("SPARK_WARMUP_MILLIS", 1_000)),
            driver_host=str(attributes.get("SPARK_DRIVER_HOST", "")),
            executor_memory=str(attributes.get("SPARK_EXECUTOR_MEMORY", "")),
            cores_max=int(attributes.get("SPARK_CORES_MAX", 0)),
            handoff_dir=str(attributes.get("SPARK_HANDOFF_DIR", "")) or None,
            **kwargs,
        )

    # -- the session -------------------------------------------------------------------
    @property
    def started(self) -> bool:
        """Whether the SparkSession exists (nothing starts Java before first use)."""
        return self._session is not None

    @property
    def session(self) -> SparkSession:
        """The SparkSession, created (with the JVM) on first use."""
        session = self._session
        if session is not None:
            return session
        with self._lock:
            self._check_running()
            if self._session is None:
                self._session = self._create_session()
            return self._session

    def warm_up(self, max_rounds: int = 6, *, bounded: bool = True) -> None:
        """Starts the session and runs jobs of the common shape until their time settles,
        or (``bounded``) ``warmup_millis`` passed after the first round.

        A cold session pays seconds for the JVM and for loading Spark's classes at its
        first job, then runs interpreted code until the JIT compiles the hot paths
        (Parquet scan, hash aggregation, Arrow collection). A container whose operators
        run Spark starts this as it starts, so the JVM's start overlaps the deploy and the
        sources' first windows (``activate`` of a Spark operator waits for it); a spare
        warms unbounded, off every critical path. A call while another thread warms up
        waits for it to end (the first caller's bounds hold).

        Raises:
            SparkWarmUpError: Spark could not start or run the jobs (every caller hears
                it, those that waited too): a spare exits, an operator's activation fails.
                Stopping the bridge meanwhile is not an error.
        """
        with self._lock:
            started, self._warm = self._warm, True
        if not started:
            self._run_warm_up(max_rounds, self.warmup_millis / 1000 if bounded else None)
        self._warmed.wait()
        if self._warm_error is not None:
            raise SparkWarmUpError(f"Spark could not start or warm up ({self.master}): "
                                   f"{self._warm_error}") from self._warm_error

    def _run_warm_up(self, max_rounds: int, budget_s: float | None) -> None:
        try:
            run_warm_up_jobs(self, self.warmup_rows, max_rounds, budget_s)
            self._warm_ok = True
            _LOGGER.info("Spark session warm (%s)", self.master)
        except SparkBridgeStopped:
            _LOGGER.info("Spark warm-up interrupted: the container is stopping")
        except Exception as exc:  # noqa: BLE001 - handed to every caller
            if self._stopped:  # stop() pulled the JVM from under the job: Ctrl-C, SIGTERM
                _LOGGER.info("Spark warm-up interrupted: the container is stopping (%s)",
                             type(exc).__name__)
            else:
                self._warm_error = exc
        finally:
            self._warmed.set()

    @property
    def warm(self) -> bool:
        """Whether ``warm_up`` ran to its end: the session is up and its JIT warm."""
        return self._warm_ok and not self._stopped

    def _create_session(self) -> SparkSession:
        problem = java_problem()
        if problem is not None:  # a retry cannot install Java: said once, fatal
            raise JavaMissing(problem)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        loopback = is_loopback_cluster(self.master)
        if self.master.startswith("local") or loopback:
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no host lookup, no warning
        from pyspark.sql import SparkSession

        spark_gateway.install()  # Java started without fork(): see runtime.spark.gateway
        settings = {
            # Spark's own log lines go through log4j: warnings and errors only, on stderr;
            # the JVM maps Spark's classes from the archive, where one was made
            "spark.driver.extraJavaOptions":
                f"-Dlog4j2.configurationFile=file:{self._log4j_config()} "
                f"{class_archive.java_options()}".strip(),
            "spark.sql.shuffle.partitions": str(self.shuffle_partitions),
            "spark.default.parallelism": str(self.shuffle_partitions),
            "spark.sql.adaptive.enabled": "false",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            "spark.sql.session.timeZone": "UTC",
            "spark.driver.memory": self.driver_memory,
            **self._cluster_settings(loopback),
            **self.conf,
        }
        builder = SparkSession.builder.master(self.master).appName(self.app_name)
        for key, value in settings.items():
            builder = builder.config(key, value)
        _LOGGER.info("starting SparkSession (master %s, %d shuffle partitions, %s handoff)",
                     self.master, self.shuffle_partitions, self.handoff)
        if self.handoff == "arrow":
            _LOGGER.warning(
                "Spark master %s is not on this host and SPARK_HANDOFF_DIR is not set: windows "
                "reach Spark through createDataFrame, several times slower than Parquet files; "
                "set SPARK_HANDOFF_DIR to a folder every executor reads", self.master)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel(self.log_level)
        quiet_query_context_loggers()
        return session

    def _cluster_settings(self, loopback: bool) -> dict[str, str]:
        """What a cluster needs on top of local mode; nothing for local mode unless asked.

        Executors connect back to the driver (tasks, results, broadcasts), so it must listen
        where they can reach it: on loopback for a loopback master, whatever
        ``SPARK_LOCAL_IP`` or the host name say; elsewhere ``driver_host`` if given.
        """
        settings: dict[str, str] = {}
        if loopback:
            settings["spark.driver.host"] = settings["spark.driver.bindAddress"] = "127.0.0.1"
        if self.driver_host:
            settings["spark.driver.host"] = self.driver_host
            settings.pop("spark.driver.bindAddress", None)  # Spark's default: the host
        if self.executor_memory:
            settings["spark.executor.memory"] = self.executor_memory
        if self.cores_max > 0:
            settings["spark.cores.max"] = str(self.cores_max)
        return settings

    def _log4j_config(self) -> Path:
        """The log4j2 file of this JVM, in a private folder of its own (never a fixed path
        in the shared temporary folder: a file planted there would configure the JVM)."""
        if self._log4j_dir is None:
            self._log4j_dir = Path(tempfile.mkdtemp(prefix="weir-log4j2-"))  # mode 0700
            atexit.register(shutil.rmtree, self._log4j_dir, True)
        return write_log4j_config(self._log4j_dir, self.log_level)

    # -- Arrow -> Spark --------------------------------------------------------------
    def window_input(self, schema: pa.Schema) -> WindowInput:
        """An input to fill batch by batch as a window's data arrives; its ``dataframe``
        then costs only the file's close (see ``runtime.spark.window_input``)."""
        files = None if self.handoff == "arrow" else self._files
        return WindowInput(schema, files, lambda: self.session, self.read_parquet)

    def to_dataframe(
        self,
        batches: list[pa.RecordBatch],
        schema: pa.Schema,
        *,
        session: SparkSession | None = None,
    ) -> DataFrame:
        """A DataFrame over ``batches`` (any number, also none), read from a scratch file.

        Args:
            batches: the data; batches of another schema are cast to ``schema``.
            schema: the columns (needed when there are no batches).
            session: build the DataFrame in this session (for example one from
                ``bridge.session.newSession()``, to keep temporary views apart); default
                the bridge's session.

        The file lives until the job ran (see the module docs); on the ``arrow`` handoff
        there is no file.
        """
        spark = session if session is not None else self.session
        table = to_table(batches, schema)
        if self.handoff == "arrow":
            return arrow_dataframe(spark, table)
        path = self._files.new_path(".parquet")
        pq.write_table(table, path, **PARQUET_OPTIONS,
                       row_group_size=row_group_rows(table.num_rows, self.shuffle_partitions))
        return self.read_parquet(spark, path, table.schema)

    def read_parquet(self, spark: SparkSession, path: Path, schema: pa.Schema) -> DataFrame:
        """A DataFrame over a handed-off file whose Arrow schema is ``schema``.

        The Spark schema Spark infers from the first file of these column types is kept
        and given with every later one, under the later file's column names: inference
        reads the file's footer on the driver each time (measured 50-60 ms a window,
        against 14 ms with the schema given), and Spark takes a column's type from its
        Parquet type alone, whatever the column is called. So the warm-up's files (the
        layout ``WindowedCount`` hands Spark) spare an operator's first window the
        inference too, which cost a warm spare's first window after a recovery 50-250
        ms more than the next ones (its handoff).
        """
        uri = path.as_uri() if self.handoff == "shared" else str(path)  # never the default FS
        shape = _by_position(schema)
        known = self._spark_schemas.get(shape)
        if known is not None:
            return spark.read.schema(_renamed(known, schema.names)).parquet(uri)
        df = spark.read.parquet(uri)
        if len(self._spark_schemas) < 64:  # a few shapes per operator; never unbounded
            self._spark_schemas[shape] = df.schema
        return df

    # -- Spark -> Arrow --------------------------------------------------------------
    def to_arrow(self, df: DataFrame) -> pa.Table:
        """Runs the job and returns its result as Arrow.

        Outside a ``job()`` block, afterwards deletes the files this thread handed to Spark.
        """
        try:
            return df.toArrow()
        finally:
            if not self._files.in_job():
                self.release()

    def job(self) -> contextlib.AbstractContextManager[None]:
        """Keeps the files that ``to_dataframe`` writes in this block until the block ends.

        Use it to run several jobs over the same DataFrames (blocks nest).
        """
        return self._files.job()

    def release(self) -> None:
        """Deletes the files this thread handed out outside any ``job()`` block."""
        self._files.release()

    def stop(self) -> None:
        """Stops the SparkSession and removes the scratch folder; the bridge is done.

        Quietly, also while another thread runs a job (a container stopping during the
        warm-up): the jobs are cancelled and Spark's log silenced first, else the JVM
        prints a stack trace per task it interrupts and the job's thread gets a py4j
        error, which ``warm_up`` then reports as an interruption in one line.
        """
        self._stopped = True  # seen at once by a job's thread, even while the JVM starts
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            try:
                session.sparkContext.setLogLevel("OFF")
                session.sparkContext.cancelAllJobs()
            except Exception:  # noqa: BLE001 - the JVM may be gone already; stop() says so
                pass
            try:
                session.stop()
            except Exception:  # noqa: BLE001 - stopping must not fail the container's shutdown
                # Typically the JVM is already gone (its process group was signalled).
                _LOGGER.info("stopping the SparkSession failed; its JVM had exited",
                             exc_info=_LOGGER.isEnabledFor(logging.DEBUG))
        self._files.remove()
        if self._log4j_dir is not None:
            shutil.rmtree(self._log4j_dir, ignore_errors=True)

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def scratch_dir(self) -> Path | None:
        """This bridge's scratch folder, once created."""
        return self._files.folder

    # -- helpers -----------------------------------------------------------------------
    def _check_running(self) -> None:
        if self._stopped:
            raise SparkBridgeStopped("the Spark bridge was stopped; create a new one")

def _by_position(schema: pa.Schema) -> pa.Schema:
    """``schema``'s column types, the columns named by position (the key of the Spark
    schemas kept): files of the same types read the same whatever their names."""
    return pa.schema([pa.field(f"_{i}", field.type, field.nullable)
                      for i, field in enumerate(schema)])


def _renamed(spark_schema: Any, names: list[str]) -> Any:
    """A Spark ``StructType`` with its top-level fields renamed to ``names``, in order."""
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(name, field.dataType, field.nullable, field.metadata)
                       for name, field in zip(names, spark_schema.fields, strict=True)])

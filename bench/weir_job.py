"""The benchmark job on Weir: events in one container, the aggregation in Spark in another.

Runs a real master in this process and real container processes (with their Spark JVM),
so the memory of this process tree is Weir's whole footprint. Latency per window is read
from the master's window stats: the sink's END_WINDOW time of the window carrying an
application window's results, minus the source's END_WINDOW time of that window (window
close to result out). Inputs start only once Spark is warm (activation), so the figures
are of a warm system, as for the peers.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import (
    CpuMeter,
    JobResult,
    JobSpec,
    check_totals,
    percentile,
    write_event_files,
)
from weir.master.local_launcher import LocalProcessLauncher
from weir.master.server import MasterServer
from weir.operators import Dag
from weir.operators.library import EventGenerator, FileSink, ParquetSource, WindowedCount

__all__ = ["build_dag", "build_scaling_dag", "recovery", "run", "startup", "window_moved_ms"]

_LOGGER = logging.getLogger(__name__)
_POLL_S = 0.5


def build_dag(spec: JobSpec, out_dir: Path, app_window_count: int,
              spark_master: str = "local[2]", input_dir: Path | None = None) -> Dag:
    """Source in container 0; the Spark aggregation and a Parquet sink in container 1.

    The source generates the events, or, with ``input_dir``, reads them from the Parquet
    files there (``write_event_files``), ``spec.rate_per_second`` worth a window at most.
    """
    dag = Dag("bench", STREAMING_WINDOW_SIZE_MILLIS=spec.window_ms, CONTAINERS=2,
              HEARTBEAT_INTERVAL_MILLIS=500, SPARK_MASTER=spark_master,
              SPARK_SHUFFLE_PARTITIONS=2, SPARK_DRIVER_MEMORY="2g", SPARK_WARMUP_ROWS=1_000_000)
    source: object = spec.generator()
    if input_dir is not None:
        if spec.rate_per_second is None:
            raise ValueError("reading files, the source needs a rate: rows per window")
        source = ParquetSource(input_dir, batch_rows=spec.batch_rows, rows_per_window=round(
            spec.rate_per_second * spec.window_ms / 1000))
    gen = dag.add_operator("events", source, CONTAINER=0)
    agg = dag.add_operator("aggregate", WindowedCount(key="key", value="value"), CONTAINER=1,
                           APPLICATION_WINDOW_COUNT=app_window_count, QUEUE_CAPACITY=256)
    sink = dag.add_operator("sink", FileSink(out_dir, format="parquet"), CONTAINER=1)
    dag.add_stream("events", gen.output, agg.input)
    dag.add_stream("counts", agg.output, sink.input)
    return dag


def build_scaling_dag(spec: JobSpec, out_dir: Path, app_window_count: int, partitions: int,
                      spark_master: str = "local[1]") -> Dag:
    """The same job with the aggregation as ``partitions`` static partitions.

    ``CONTAINERS = 1 + partitions``: the source and the Parquet sink in container 0, the
    aggregation's partitions (``PARTITIONS=N``, ``PARTITION_KEY="key"``, left unpinned so
    the master spreads them) one per container 1..N; with N > 1 the master puts
    ``WindowedCount``'s unifier (adding up the partial counts, in Spark) in front of the
    sink, in container 0. With N = 1 the aggregation is pinned to container 1, no unifier.
    Every container with Spark runs its own small local session (``spark_master``, one
    shuffle partition, 1 GB driver), so that 4 partitions fit a 2-core machine.
    """
    if partitions < 1:
        raise ValueError(f"{partitions} partitions: need at least one")
    dag = Dag(f"bench-scaling-{partitions}", STREAMING_WINDOW_SIZE_MILLIS=spec.window_ms,
              CONTAINERS=1 + partitions, HEARTBEAT_INTERVAL_MILLIS=500,
              SPARK_MASTER=spark_master, SPARK_SHUFFLE_PARTITIONS=1, SPARK_DRIVER_MEMORY="1g",
              SPARK_WARMUP_ROWS=500_000)
    gen = dag.add_operator("events", spec.generator(), CONTAINER=0)
    placement: dict[str, object] = (
        {"PARTITIONS": partitions, "PARTITION_KEY": "key"} if partitions > 1
        else {"CONTAINER": 1})
    agg = dag.add_operator("aggregate", WindowedCount(key="key", value="value"),
                           APPLICATION_WINDOW_COUNT=app_window_count, QUEUE_CAPACITY=256,
                           **placement)
    sink = dag.add_operator("sink", FileSink(out_dir, format="parquet"), CONTAINER=0)
    dag.add_stream("events", gen.output, agg.input)
    dag.add_stream("counts", agg.output, sink.input)
    return dag


def _master(work: Path) -> MasterServer:
    """A master whose containers are local processes logging under ``work``."""
    return MasterServer("127.0.0.1", 0,
                        lambda a: LocalProcessLauncher(a, log_dir=work / "containers"),
                        container_stop_grace_ms=5_000)


def _totals(out_dir: Path) -> dict[str, tuple[int, int]]:
    """Per key, count and sum added up over every window the sink wrote."""
    files = sorted(out_dir.glob("*.parquet"))
    if not files:
        return {}
    table = pa.concat_tables(pq.read_table(f, columns=["key", "count", "sum"]) for f in files)
    summed = table.group_by("key").aggregate([("count", "sum"), ("sum", "sum")])
    return dict(zip(summed["key"].to_pylist(),
                    zip(summed["count_sum"].to_pylist(), summed["sum_sum"].to_pylist(),
                        strict=True), strict=True))


class _Windows:
    """Per-operator END_WINDOW times, tuple counts and user metrics (running totals, the
    newest), gathered from the master's stats, and the CPU time of the run's processes.

    The aggregation only when it is one operator (a partitioned one has no single
    operator of that name).
    """

    def __init__(self, operators: tuple[str, ...] = ("events", "sink")) -> None:
        self.operators = operators
        self.end_ms: dict[str, dict[int, int]] = defaultdict(dict)
        self.begin_ms: dict[str, dict[int, int]] = defaultdict(dict)  # 0: not reported
        self.processed: dict[str, dict[int, int]] = defaultdict(dict)
        self.cpu_ns: dict[str, dict[int, int]] = defaultdict(dict)  # the operator's thread
        self.metrics: dict[str, dict[str, float]] = defaultdict(dict)
        self.cpu = CpuMeter()
        self.moments: dict[str, int] = {}  # the start-up's, as the master saw them

    def note_moments(self, server: MasterServer, app_id: str) -> None:
        """Epoch ms (0: not seen) of what the application waited through before its first
        window, and its end, from the master's views (``start_up_timeline``)."""
        app = server.core.application_info(app_id)
        containers = server.core.list_containers(app_id)
        operators = server.core.list_operators(app_id)
        self.moments = {
            "submitted": app.submitted_ms,
            "container launched": min((c.started_ms for c in containers if c.started_ms),
                                      default=0),
            "every setup() done": max((op.set_up_ms for op in operators), default=0),
            "every operator activated (Spark warm)": max(
                (op.activated_ms for op in operators), default=0),
            "finished": app.finished_ms}

    def poll(self, server: MasterServer, app_id: str) -> None:
        for name in self.operators:
            info = server.core.operator_info(app_id, name)
            for w in info.recent_windows:
                self.end_ms[name][w.window_id] = w.end_window_ms
                self.begin_ms[name][w.window_id] = w.begin_window_ms
                self.processed[name][w.window_id] = w.tuples_processed
                self.cpu_ns[name][w.window_id] = w.cpu_time_ns
                if w.metrics:
                    self.metrics[name] = dict(w.metrics)
        if self.end_ms["events"]:  # the sources run: the timed part
            self.cpu.poll(server.core.list_containers(app_id))


def _run_app(dag: Dag, work: Path, timeout_s: float,
             operators: tuple[str, ...] = ("events", "sink")) -> tuple[_Windows, str, float]:
    windows = _Windows(operators)
    server = _master(work)
    started = time.monotonic()
    try:
        server.start()
        app_id = server.core.submit(dag.to_descriptor(), {})
        deadline = time.monotonic() + timeout_s
        while True:
            windows.poll(server, app_id)
            info = server.core.application_info(app_id)
            if info.state not in ("ACCEPTED", "RUNNING"):
                break
            if time.monotonic() > deadline:
                server.core.kill_application(app_id, "benchmark timeout")
                return windows, f"timed out after {timeout_s:.0f} s", 0.0
            time.sleep(_POLL_S)
        windows.poll(server, app_id)
        windows.note_moments(server, app_id)
        return windows, "" if info.state == "FINISHED" else \
            f"{info.state}: {info.diagnostics}", time.monotonic() - started
    finally:
        server.stop()


def first_in_ms(windows: _Windows, sources: tuple[str, ...], window_ms: int) -> int:
    """When the sources' first window began (epoch ms): as its container reported, else
    a whole window before its end. A source that reads all its input in less than a
    window ends that window early: counting a whole window would add time nobody spent."""
    starts = []
    for name in sources:
        ends = windows.end_ms[name]
        if ends:
            first = min(ends)
            began = windows.begin_ms[name].get(first, 0)
            starts.append(began if 0 < began <= ends[first] else ends[first] - window_ms)
    return min(starts, default=0)


def start_up_timeline(windows: _Windows, sources: tuple[str, ...], window_ms: int
                      ) -> dict[str, int]:
    """A run's moments in order (epoch ms; 0: not seen): submitted, first container
    launched, every operator's ``setup`` done (the sources may start), the sources' first
    window begun, every operator activated (Spark started and its query warmed), the
    first and the last result out of the sink (the end of its windows with rows), and the
    application finished."""
    moments = dict(windows.moments)
    results = sorted(w for w, n in windows.processed["sink"].items() if n > 0)
    sink = windows.end_ms["sink"]
    ordered = {name: moments.get(name, 0) for name in (
        "submitted", "container launched", "every setup() done")}
    ordered["sources' first window began"] = first_in_ms(windows, sources, window_ms)
    ordered["every operator activated (Spark warm)"] = moments.get(
        "every operator activated (Spark warm)", 0)
    ordered["first result"] = sink[results[0]] if results else 0
    ordered["last result"] = max((sink[w] for w in results), default=0)
    ordered["finished"] = moments.get("finished", 0)
    return ordered


def render_timeline(timeline_ms: dict[str, int], launched_at: float) -> str:
    """``"submitted 0.6 s, container launched 0.6 s, ..."``: each moment's seconds after
    the launch (epoch seconds), "-" where it was not seen.

    >>> render_timeline({"submitted": 10_600, "first result": 0}, 10.0)
    'submitted 0.6 s, first result -'
    """
    return ", ".join(f"{name} {ms / 1000 - launched_at:.1f} s" if ms > 0 else f"{name} -"
                     for name, ms in timeline_ms.items())


def job_figures(windows: _Windows, window_ms: int) -> tuple[float, list[float], int]:
    """Seconds from the first window's start to the last result out, the latency of each
    result window (its close at the source to its END_WINDOW at the sink), and how many
    windows carried results."""
    src, sink = windows.end_ms["events"], windows.end_ms["sink"]
    result_windows = [w for w, n in windows.processed["sink"].items() if n > 0]
    latencies = [sink[w] - src[w] for w in sorted(result_windows) if w in src]
    first_in = first_in_ms(windows, ("events",), window_ms)
    last_out = max((sink[w] for w in result_windows), default=0)
    return max(last_out - first_in, 1) / 1000, latencies, len(result_windows)


def breakdown(windows: _Windows, latencies: list[float]) -> dict[str, object]:
    """Where an application window's time goes, from the operators' running totals.

    Per Spark job (means): ``write_ms`` (the input written for Spark as it arrived,
    overlapped with the waiting), ``handoff_ms`` (the rest, at the window's end),
    ``job_ms`` (the transform, run by Spark, and its result back as Arrow), ``emit_ms``
    (the result out on the port). An aggregation that runs no Spark job (a join, a
    ``KeyedProcess``, ``TopN``) gives instead, per streaming window with input,
    ``operator_cpu_ms`` (its thread's CPU: the window's work) and ``rows_per_window``.
    Per sink file, ``sink_write_ms``. ``waiting_ms`` is the median window latency minus
    those: input in transit and queued (behind the previous window's work) before its
    work starts. ``cpu_seconds``: per process, during the timed part (sources running).
    """
    spark = windows.metrics.get("aggregate", {})
    sink = windows.metrics.get("sink", {})
    jobs = spark.get("spark[jobs]", 0.0)
    figures: dict[str, object] = {}
    if jobs:
        for phase in ("write", "handoff", "job", "emit"):
            figures[f"{phase}_ms"] = round(spark.get(f"spark[{phase}_ms]", 0.0) / jobs, 1)
        figures["rows_per_job"] = round(spark.get("spark[rows_in]", 0.0) / jobs)
        figures["jobs"] = int(jobs)
    else:
        rows = windows.processed.get("aggregate", {})
        busy = [w for w, n in rows.items() if n > 0]
        if busy:
            cpu_ns = windows.cpu_ns.get("aggregate", {})
            figures["operator_cpu_ms"] = round(
                sum(cpu_ns.get(w, 0) for w in busy) / len(busy) / 1e6, 1)
            figures["rows_per_window"] = round(sum(rows[w] for w in busy) / len(busy))
            figures["windows"] = len(busy)
    if sink.get("files_written"):
        figures["sink_write_ms"] = round(sink.get("write_ms", 0.0) / sink["files_written"], 1)
    if latencies:
        spent = sum(float(figures.get(k, 0.0))  # type: ignore[arg-type]
                    for k in ("handoff_ms", "job_ms", "emit_ms", "operator_cpu_ms",
                              "sink_write_ms"))
        figures["latency_p50_ms"] = percentile(latencies, 50)
        figures["waiting_ms"] = round(max(0.0, percentile(latencies, 50) - spent), 1)
    figures["cpu_seconds"] = windows.cpu.seconds()
    figures["timed_seconds"] = round(windows.cpu.elapsed(), 2)
    return figures


def run(spec: JobSpec, app_window_count: int = 2, timeout_s: float = 600.0,
        work_dir: Path | None = None, partitions: int = 0, from_files: bool = False,
        name: str = "") -> JobResult:
    """Runs the job on a local master with container processes; checks the output.

    ``partitions=0``: ``build_dag`` (two containers); N >= 1: ``build_scaling_dag`` with
    N partitions of the aggregation (1 + N containers). ``from_files``: the events are
    written to Parquet files first (untimed, as for Spark Structured Streaming) and the
    source reads them.
    """
    work = Path(work_dir or tempfile.mkdtemp(prefix="weir-bench-"))
    out_dir = work / "out"
    if partitions:
        dag = build_scaling_dag(spec, out_dir, app_window_count, partitions)
        name = name or f"weir, {partitions} partition{'s' if partitions > 1 else ''}"
    else:
        input_dir = None
        if from_files:
            input_dir = work / "events"
            input_dir.mkdir(parents=True, exist_ok=True)
            write_event_files(spec, input_dir)
        dag = build_dag(spec, out_dir, app_window_count, input_dir=input_dir)
        name = name or ("weir" if spec.rate_per_second is None else
                        f"weir @ {spec.rate_per_second / 1e6:g} M/s")
    operators = ("events", "sink") if partitions > 1 else ("events", "aggregate", "sink")
    windows, error, wall_s = _run_app(dag, work, timeout_s, operators)
    if error:
        return JobResult(name, spec.events, 0.0, [], False, error)
    correct, detail = check_totals(_totals(out_dir), spec.expected())
    seconds, latencies, result_windows = job_figures(windows, spec.window_ms)
    return JobResult(name, spec.events, seconds, latencies, correct, detail, extra={
        "breakdown": breakdown(windows, latencies),
        "application_windows": result_windows,
        "streaming_windows": len(windows.end_ms["events"]),
        "app_window_count": app_window_count,
        "wall_seconds_with_startup": round(wall_s, 1),
        **({"partitions": partitions, "containers": 1 + partitions} if partitions else {}),
    })


def startup(timeout_s: float = 180.0) -> dict[str, float]:
    """Seconds from starting a master to the first window result, and an idle container's RSS.

    The application: a paced source alone in container 0 (a container with no Spark:
    its memory is the idle figure), a Spark count and a sink in container 1.
    """
    work = Path(tempfile.mkdtemp(prefix="weir-startup-"))
    dag = Dag("startup", STREAMING_WINDOW_SIZE_MILLIS=500, CONTAINERS=2,
              HEARTBEAT_INTERVAL_MILLIS=500, SPARK_SHUFFLE_PARTITIONS=2)
    gen = dag.add_operator("events", EventGenerator(rate_per_second=10_000, keys=100),
                           CONTAINER=0)
    agg = dag.add_operator("aggregate", WindowedCount(key="key", value="value"), CONTAINER=1)
    sink = dag.add_operator("sink", FileSink(work / "out", format="parquet"), CONTAINER=1)
    dag.add_stream("events", gen.output, agg.input)
    dag.add_stream("counts", agg.output, sink.input)
    started = time.monotonic()
    server = _master(work)
    try:
        server.start()
        app_id = server.core.submit(dag.to_descriptor(), {})
        deadline = started + timeout_s
        first_result_s = 0.0
        while time.monotonic() < deadline and not first_result_s:
            if server.core.operator_info(app_id, "sink").total_tuples_processed > 0:
                first_result_s = time.monotonic() - started
            time.sleep(0.05)
        time.sleep(2)  # a few heartbeats with the source running
        idle = next(c for c in server.core.list_containers(app_id) if c.id.endswith("-c0"))
        busy = next(c for c in server.core.list_containers(app_id) if c.id.endswith("-c1"))
        return {"first_result_seconds": round(first_result_s, 2),
                "source_container_rss_mb": float(idle.memory_rss_mb),
                "spark_container_rss_mb": float(busy.memory_rss_mb)}
    finally:
        server.stop()


def window_moved_ms(recent_windows: Iterable[Any], after_window: int) -> int | None:
    """When the operator ended its first window after ``after_window``: that window's
    END_WINDOW time as its container stamped it (epoch ms), or None if none is known.

    >>> from types import SimpleNamespace as W
    >>> window_moved_ms([W(window_id=7, end_window_ms=70), W(window_id=9, end_window_ms=95),
    ...                  W(window_id=8, end_window_ms=90)], 7)
    90
    >>> window_moved_ms([W(window_id=7, end_window_ms=70)], 7) is None
    True
    """
    later = [w for w in recent_windows if w.window_id > after_window and w.end_window_ms > 0]
    return min(later, key=lambda w: w.window_id).end_window_ms if later else None


def recovery(spec: JobSpec, timeout_s: float = 300.0, spares: int = 0,
             on_ray: bool = False) -> dict[str, object]:
    """Kills the Spark container mid-run: seconds until windows move again, windows replayed.

    ``on_ray``: the master asks a Ray cluster of three one-CPU workers on this machine
    for its containers (each asks for one CPU: one a node), and the aggregation's whole
    node is killed instead of its process.

    The job runs paced (``spec.rate_per_second``) with checkpoints every 10 windows; once
    a window is committed (and, with ``spares`` (SPARE_CONTAINERS), a spare is ready:
    its Spark warm), the aggregation's container gets SIGKILL. "Moving again" is the
    sink's window passing the last one it had before the kill, timed by that window's
    END_WINDOW as the sink's container stamped it (``window_moved_ms``; same host, same
    clock): when the master hears of it depends on when the container next heartbeats
    (every 500 ms here) and on this loop's polling, which are no part of the recovery;
    that later moment is reported too (``seconds_until_the_master_saw_it``). The
    replayed windows are those between the aggregation's recovery checkpoint and its
    window at the kill.
    """
    import os
    import signal

    from weir.operators.windows import window_counter

    work = Path(tempfile.mkdtemp(prefix="weir-recovery-"))
    dag = build_dag(spec, work / "out", app_window_count=2)
    dag.set_attributes(CHECKPOINT_WINDOW_COUNT=10, HEARTBEAT_TIMEOUT_MILLIS=5000,
                       SPARE_CONTAINERS=spares, CONTAINER_CORES=1 if on_ray else 0)
    if on_ray:  # the bench's Ray nodes share this machine's disk
        dag.set_attributes(STATE_DIR=str(work / "state"), STATE_DIR_SHARED=True)
    cluster = None
    if on_ray:
        from bench.ray_cluster import LocalRayCluster
        from weir.master.ray_launcher import RayLauncher

        cluster = LocalRayCluster(workers=3, worker_cpus=1)
        address = cluster.address
        server = MasterServer("127.0.0.1", 0, lambda a: RayLauncher(a, address=address),
                              container_stop_grace_ms=5_000)
    else:
        server = _master(work)
    try:
        server.start()
        core = server.core
        app_id = core.submit(dag.to_descriptor(), {})
        deadline = time.monotonic() + timeout_s
        while core.application_info(app_id).committed_window_id < 0 or spares and not any(
                c.state == "SPARE" for c in core.list_containers(app_id)):
            if time.monotonic() > deadline:
                return {"error": "no window was committed (or no spare became ready)"}
            time.sleep(0.1)
        agg = core.operator_info(app_id, "aggregate")
        sink_before = core.operator_info(app_id, "sink").current_window_id
        container = next(c for c in core.list_containers(app_id) if c.id == agg.container_id)
        killed_at, killed_at_ms = time.monotonic(), time.time_ns() // 1_000_000
        pid = int(container.process_name.split("@")[0])
        if cluster is not None:
            cluster.kill_node_of(pid)  # its raylet and everything on the node
        else:
            os.kill(pid, signal.SIGKILL)
        while core.operator_info(app_id, "sink").current_window_id <= sink_before:
            if time.monotonic() > deadline:
                return {"error": "windows did not move again after the kill"}
            time.sleep(0.05)
        seen_s = time.monotonic() - killed_at
        moved_ms = window_moved_ms(core.operator_info(app_id, "sink").recent_windows,
                                   sink_before)
        moving_s = (moved_ms - killed_at_ms) / 1000 if moved_ms is not None else seen_s
        after = core.operator_info(app_id, "aggregate")
        moved_to = next(c for c in core.list_containers(app_id) if c.id == after.container_id)
        how = "a spare" if 0 < moved_to.started_ms < killed_at_ms else "a new container"
        info = core.wait_for_application(app_id, max(1.0, deadline - time.monotonic()))
        got = _totals(work / "out")
        want = spec.expected()
        at_least_once = all(got.get(k, (0, 0))[0] >= c for k, (c, _) in want.items())
        return {
            "killed": (f"the Ray node of {container.id} (Spark aggregation)" if on_ray
                       else f"{container.id} (Spark aggregation)"),
            "spares": spares,
            "moved_to": f"{moved_to.id} ({how})",
            "seconds_until_windows_move_again": round(moving_s, 2),
            "seconds_until_the_master_saw_it": round(seen_s, 2),
            "windows_replayed": max(0, window_counter(agg.current_window_id)
                                    - window_counter(after.recovery_window_id)),
            "final_state": info.state,
            "every_event_counted_at_least_once": at_least_once,
            "failure_count": after.failure_count,
        }
    finally:
        server.stop()
        if cluster is not None:
            cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the benchmark job on Weir.")
    parser.add_argument("--spec", default=JobSpec().to_json(), help="JobSpec as JSON")
    parser.add_argument("--app-windows", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=0,
                        help="the scaling job with N partitions of the aggregation")
    parser.add_argument("--startup", action="store_true", help="measure startup instead")
    parser.add_argument("--recovery", action="store_true", help="measure recovery instead")
    args = parser.parse_args()
    if args.startup:
        print(json.dumps(startup()))
    elif args.recovery:
        print(json.dumps(recovery(JobSpec.from_json(args.spec))))
    else:
        print(json.dumps(run(JobSpec.from_json(args.spec), args.app_windows,
                             partitions=args.partitions).to_dict()))


if __name__ == "__main__":
    main()

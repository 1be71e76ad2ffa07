"""The keyed-state row: a running count over a growing key space, on Weir.

Each streaming window brings ``new_keys`` keys never seen before plus ``repeats`` rows of
keys seen earlier, so the state grows to ``windows * new_keys`` keys while every window
touches about as many keys. If a window's cost follows the window (issue 21), its time at
the end is about its time at the start; if it followed the history, it would grow with
every key held. Figures: the count operator's time per window (its Spark job, the counts
back and the store's update, from its ``spark`` metrics, per window) as the median of the
first and of the last five windows, their ratio, and the peak RSS of the container running
the count (its Python process and its Spark JVM). The output is checked: every key's last
total equals the number of its rows.

Run alone: ``python -m bench.running_count [--windows 50 --new-keys 100000]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench.weir_job import _master
from weir.operators import Dag
from weir.operators.library import FileSink, ParquetSource, RunningCount

__all__ = ["build_dag", "run", "write_keys"]

_POLL_S = 0.5
_PHASES = ("handoff", "job", "emit")


def write_keys(folder: Path, windows: int, new_keys: int, repeats: int, seed: int = 7) -> int:
    """One Parquet file per window: its new keys and ``repeats`` earlier keys (int64 user
    ids); returns the rows written."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows = 0
    for w in range(windows):
        fresh = np.arange(w * new_keys, (w + 1) * new_keys, dtype=np.int64)
        again = rng.integers(0, (w + 1) * new_keys, size=repeats, dtype=np.int64)
        keys = np.concatenate([fresh, again])
        rng.shuffle(keys)
        pq.write_table(pa.table({"user": keys}), folder / f"keys-{w:05d}.parquet")
        rows += len(keys)
    return rows


def expected_totals(folder: Path) -> pa.Table:
    table = pq.read_table(folder)
    return table.group_by("user").aggregate([("user", "count")]).rename_columns(
        ["user", "expected"])


def build_dag(input_dir: Path, out_dir: Path, rows_per_window: int, window_ms: int,
              state_dir: Path) -> Dag:
    """The source in container 0; the running count (Spark, local store) and a Parquet
    sink in container 1."""
    dag = Dag("bench-running-count", STREAMING_WINDOW_SIZE_MILLIS=window_ms, CONTAINERS=2,
              HEARTBEAT_INTERVAL_MILLIS=500, SPARK_MASTER="local[2]",
              SPARK_SHUFFLE_PARTITIONS=2, SPARK_DRIVER_MEMORY="2g",
              SPARK_WARMUP_ROWS=100_000, STATE_DIR=str(state_dir))
    source = dag.add_operator("events", ParquetSource(input_dir, rows_per_window=rows_per_window,
                                                      batch_rows=rows_per_window), CONTAINER=0)
    count = dag.add_operator("count", RunningCount(key="user"), CONTAINER=1)
    sink = dag.add_operator("sink", FileSink(out_dir, format="parquet"), CONTAINER=1)
    dag.add_stream("keys", source.output, count.input)
    dag.add_stream("totals", count.output, sink.input)
    return dag


class _ContainerMemory:
    """Peak RSS of one container's process tree (found by its pid), sampled in a thread."""

    def __init__(self) -> None:
        self.pid = 0
        self.peak_mb = 0.0
        self.samples: list[tuple[float, float]] = []  # (whole tree, its Python process) MB
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="container-rss")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            if not self.pid:
                continue
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            sizes = []
            for proc in procs:
                try:
                    sizes.append(proc.memory_info().rss)
                except psutil.Error:
                    sizes.append(0)
            mb = sum(sizes) / 2**20
            self.samples.append((mb, sizes[0] / 2**20))
            self.peak_mb = max(self.peak_mb, mb)

    def by_fifth(self, which: int) -> list[int]:
        """The peak of each fifth of the run (0: the whole tree, 1: the Python process):
        flat when memory does not grow with the keys held."""
        n = len(self.samples)
        return [round(max((s[which] for s in self.samples[i * n // 5:(i + 1) * n // 5]),
                          default=0)) for i in range(5)]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def _window_times(metrics: dict[int, dict[str, float]]) -> list[float]:
    """Per window with a job, in window order: ms spent in its handoff, job and emit."""
    times, last_ms, last_jobs = [], 0.0, 0.0
    for window_id in sorted(metrics):
        m = metrics[window_id]
        jobs = m.get("spark[jobs]", 0.0)
        spent = sum(m.get(f"spark[{p}_ms]", 0.0) for p in _PHASES)
        if jobs > last_jobs:
            times.append((spent - last_ms) / (jobs - last_jobs))
        last_ms, last_jobs = spent, jobs
    return times


def run(windows: int = 50, new_keys: int = 100_000, repeats: int = 50_000,
        window_ms: int = 1000, timeout_s: float = 900.0,
        work_dir: Path | None = None) -> dict[str, Any]:
    """Runs the job on a local master with container processes; returns the figures."""
    work = Path(work_dir or tempfile.mkdtemp(prefix="weir-bench-rc-"))
    input_dir, out_dir = work / "keys", work / "out"
    rows = write_keys(input_dir, windows, new_keys, repeats)
    # the store on disk (``work`` may be tmpfs, where fsync costs nothing)
    state_dir = Path(tempfile.mkdtemp(prefix="weir-bench-rc-state-"))
    dag = build_dag(input_dir, out_dir, new_keys + repeats, window_ms, state_dir)
    metrics: dict[int, dict[str, float]] = {}
    memory = _ContainerMemory()
    server = _master(work)
    error = ""
    started = time.monotonic()
    try:
        server.start()
        app_id = server.core.submit(dag.to_descriptor(), {})
        while True:
            info = server.core.application_info(app_id)
            count = server.core.operator_info(app_id, "count")
            for w in count.recent_windows:
                if w.metrics:
                    metrics[w.window_id] = dict(w.metrics)
            if not memory.pid and count.container_id:
                for c in server.core.list_containers(app_id):
                    if c.id == count.container_id and c.process_name:
                        memory.pid = int(c.process_name.split("@")[0])
            if info.state not in ("ACCEPTED", "RUNNING"):
                if info.state != "FINISHED":
                    error = f"{info.state}: {info.diagnostics}"
                break
            if time.monotonic() - started > timeout_s:
                server.core.kill_application(app_id, "benchmark timeout")
                error = f"timed out after {timeout_s:.0f} s"
                break
            time.sleep(_POLL_S)
    finally:
        server.stop()
        memory.stop()
        shutil.rmtree(state_dir, ignore_errors=True)
    times = _window_times(metrics)
    result: dict[str, Any] = {
        "system": "weir running count", "windows": windows, "new_keys_per_window": new_keys,
        "repeats_per_window": repeats, "rows": rows, "distinct_keys": windows * new_keys,
        "window_ms": window_ms, "windows_timed": len(times),
        "container_peak_rss_mb": round(memory.peak_mb),
        "wall_seconds": round(time.monotonic() - started, 1), "error": error,
    }
    if len(times) >= 10:
        start, end = statistics.median(times[:5]), statistics.median(times[-5:])
        steady = statistics.median(times[5:10])  # the first five include Spark's warm-up
        result.update(start_ms=round(start, 1), end_ms=round(end, 1),
                      ratio=round(end / start, 2), windows_6_to_10_ms=round(steady, 1),
                      ratio_to_windows_6_to_10=round(end / steady, 2),
                      per_window_ms=[round(t) for t in times])
    if len(memory.samples) >= 5:
        result["container_rss_by_fifth_mb"] = memory.by_fifth(0)
        result["python_rss_by_fifth_mb"] = memory.by_fifth(1)
    result["correct"], result["detail"] = (False, error) if error else _check(input_dir, out_dir)
    return result


def _check(input_dir: Path, out_dir: Path) -> tuple[bool, str]:
    """Every key's highest published total equals its rows."""
    files = sorted(out_dir.glob("*.parquet"))
    if not files:
        return False, "the sink wrote nothing"
    out = pa.concat_tables(pq.read_table(f, columns=["user", "count"]) for f in files)
    last = out.group_by("user").aggregate([("count", "max")])
    joined = expected_totals(input_dir).join(last, "user", join_type="full outer")
    wrong = pc.sum(pc.invert(pc.fill_null(pc.equal(joined["expected"], joined["count_max"]),
                                          False))).as_py()
    return wrong == 0, f"{wrong} of {joined.num_rows} keys' totals differ" if wrong else ""


def render(result: dict[str, Any]) -> str:
    """One line for the report."""
    if result.get("error") or "distinct_keys" not in result:
        return f"running count: {result.get('error') or result.get('detail')}"
    return (f"running count over {result['distinct_keys'] / 1e6:g} M keys "
            f"({result['windows']} windows of {result['new_keys_per_window']:,} new keys + "
            f"{result['repeats_per_window']:,} repeats): per window {result.get('start_ms')} ms "
            f"at the start, {result.get('end_ms')} ms at the end (x{result.get('ratio')}, "
            f"target <= 1.5; x{result.get('ratio_to_windows_6_to_10')} of windows 6-10); "
            f"count container peak RSS {result['container_peak_rss_mb']} MB, by fifth of the "
            f"run {result.get('container_rss_by_fifth_mb')} (its Python process "
            f"{result.get('python_rss_by_fifth_mb')}); "
            f"correct: {'yes' if result['correct'] else 'NO ' + result['detail']}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--windows", type=int, default=50)
    parser.add_argument("--new-keys", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=50_000)
    parser.add_argument("--window-ms", type=int, default=1000)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args(argv)
    result = run(args.windows, args.new_keys, args.repeats, args.window_ms,
                 work_dir=args.work)
    print(render(result))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

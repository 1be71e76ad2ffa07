"""What every benchmarked system shares: the job, its known answer, the result record."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from weir.operators.library import EventGenerator

__all__ = ["CpuMeter", "JobResult", "JobSpec", "PeakMemory", "check_totals", "percentile",
           "render_breakdown",
           "render_table", "write_event_files"]


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """The job: N events (key out of ``keys``, value 0..99); per window and key, count and sum.

    Every system reads the same events: ``EventGenerator(keys, total=events,
    batch_rows, seed).batches()``.
    """

    events: int = 5_000_000
    keys: int = 10_000
    window_ms: int = 500
    batch_rows: int = 65_536
    seed: int = 0
    rate_per_second: float | None = None  # None: as fast as the system takes them

    def generator(self) -> EventGenerator:
        return EventGenerator(rate_per_second=self.rate_per_second, keys=self.keys,
                              total=self.events, batch_rows=self.batch_rows, seed=self.seed)

    def expected(self) -> dict[str, tuple[int, int]]:
        """``{key: (count, sum)}`` over all events: what the windows must add up to."""
        return self.generator().expected_counts()

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        return cls(**json.loads(text))


@dataclasses.dataclass
class JobResult:
    """One system's run of the job.

    ``latencies_ms``: per window, from the window's close to its result being out.
    ``seconds``: from the first event in to the last result out.
    """

    system: str
    events: int
    seconds: float
    latencies_ms: list[float]
    correct: bool
    detail: str = ""
    peak_rss_mb: float = 0.0
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["events_per_second"] = self.events_per_second
        data["latency_p50_ms"] = percentile(self.latencies_ms, 50)
        data["latency_p99_ms"] = percentile(self.latencies_ms, 99)
        return data


def write_event_files(spec: JobSpec, folder: Path) -> int:
    """The job's events as Parquet files in ``folder``, one per generator batch, names in
    event order, uncompressed and dictionary-free; returns the file count.

    Both Spark Structured Streaming and Weir's file-reading run read these: the same
    input, read the same way (put ``folder`` on tmpfs).
    """
    count = 0
    for count, batch in enumerate(spec.generator().batches(), start=1):
        pq.write_table(pa.Table.from_batches([batch]), folder / f"part-{count:06d}.parquet",
                       compression="none", use_dictionary=False)
    return count


def check_totals(per_window_rows: Mapping[str, tuple[int, int]],
                 expected: Mapping[str, tuple[int, int]]) -> tuple[bool, str]:
    """Compares per-key (count, sum) added up over all windows with the known answer."""
    if dict(per_window_rows) == dict(expected):
        return True, f"{len(expected)} keys, counts and sums exact"
    missing = set(expected) - set(per_window_rows)
    extra = set(per_window_rows) - set(expected)
    wrong = [k for k in set(expected) & set(per_window_rows)
             if per_window_rows[k] != expected[k]]
    got_events = sum(c for c, _ in per_window_rows.values())
    want_events = sum(c for c, _ in expected.values())
    return False, (f"WRONG: {len(missing)} keys missing, {len(extra)} unexpected, "
                   f"{len(wrong)} with wrong count/sum; {got_events} events counted of "
                   f"{want_events}")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return float(ordered[rank])


def render_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Aligned columns: the first left, the others right."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                        for i, (c, w) in enumerate(zip(row, widths, strict=True)))
              for row in rows]
    return lines


class PeakMemory:
    """Samples the resident memory of a process and all its descendants, keeping the peak."""

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        self._root = psutil.Process(pid)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.peak_mb = 0.0
        self._thread = threading.Thread(target=self._run, name="peak-memory", daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def sample_mb(self) -> float:
        total = 0
        try:
            procs = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            return 0.0
        for proc in procs:
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                continue
        return total / (1024 * 1024)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, self.sample_mb())
            time.sleep(self._interval_s)


class CpuMeter:
    """CPU seconds per process of a run between its first and its last ``poll``: this
    process (the master), and each container's Python process and its JVM children."""

    def __init__(self) -> None:
        self._first: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._started = self._stopped = 0.0

    def poll(self, containers: Any) -> None:
        """``containers``: the master's ContainerInfo list (``process_name`` is pid@host)."""
        now = time.monotonic()
        samples = {"master": _cpu_s(psutil.Process())}
        for container in containers:
            pid = container.process_name.split("@")[0]
            if not pid.isdecimal():
                continue
            role = container.id.rsplit("-", 1)[-1]
            try:
                proc = psutil.Process(int(pid))
                samples[f"{role} python"] = _cpu_s(proc)
                jvm = sum(_cpu_s(child) for child in proc.children(recursive=True))
            except psutil.Error:
                continue
            if jvm:
                samples[f"{role} jvm"] = jvm
        if not self._first:
            self._started = now
        for role, cpu in samples.items():
            self._first.setdefault(role, cpu)
            self._last[role] = cpu
        self._stopped = now

    def seconds(self) -> dict[str, float]:
        return {role: round(self._last[role] - self._first[role], 2) for role in self._last}

    def elapsed(self) -> float:
        return self._stopped - self._started


def _cpu_s(proc: psutil.Process) -> float:
    try:
        times = proc.cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


_ROOT = Path(__file__).resolve().parent.parent


def run_json_subprocess(system: str, argv: list[str], timeout_s: float,
                        launched_at_flag: str | None = None) -> dict[str, Any]:
    """Runs one bench runner (``argv``, printing its result as a last JSON line) in a process
    group of its own, killed after ``timeout_s``: its result with the peak memory of its
    process tree and its run time, or a failed result saying why (its stderr's tail).

    ``launched_at_flag``: the wall clock (``time.time()``) just before the spawn is passed
    to the runner after this flag, so that it can time its results from outside, as a
    user who started it waits, its own interpreter's start included."""
    started = time.monotonic()
    if launched_at_flag is not None:
        argv = [*argv, launched_at_flag, f"{time.time():.6f}"]
    proc = subprocess.Popen(argv, cwd=_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    with PeakMemory(proc.pid) as memory:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return {"system": system, "correct": False,
                    "detail": f"timed out after {timeout_s:.0f} s", "peak_rss_mb": memory.peak_mb}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(err.strip().splitlines()[-5:])
        return {"system": system, "correct": False, "peak_rss_mb": memory.peak_mb,
                "detail": f"exit {proc.returncode}: {tail}"}
    result = json.loads(lines[-1])
    result["peak_rss_mb"] = round(memory.peak_mb, 1)
    result["run_seconds"] = round(time.monotonic() - started, 1)
    return result


def render_breakdown(costs: dict[str, Any]) -> str:
    """One line: where a window's time went (per Spark job, or per window of an operator
    that runs none; means) and CPU per process."""
    parts = [f"{name} {costs[key]:,.0f} ms" for key, name in (
        ("write_ms", "input written as it arrived"), ("handoff_ms", "handoff"),
        ("job_ms", "Spark job + result to Arrow"), ("emit_ms", "emit"),
        ("operator_cpu_ms", "the operator's CPU"), ("sink_write_ms", "sink write"),
        ("waiting_ms", "waiting (in transit, queued)"))
        if key in costs]
    cpu = ", ".join(f"{role} {seconds:.1f}" for role, seconds in
                    costs.get("cpu_seconds", {}).items())
    if "jobs" in costs:
        unit = f"per job of {costs.get('rows_per_job', 0):,} rows"
    elif "windows" in costs:
        unit = f"per window of {costs.get('rows_per_window', 0):,} rows into the operator"
    else:
        unit = "per window"
    return (f"{unit} (p50 latency {costs.get('latency_p50_ms', 0):,.0f} ms): "
            + "; ".join(parts) + f". CPU s over {costs.get('timed_seconds', 0)} s: {cpu}")


class BusyCpus:
    """``count`` processes spinning a CPU each beside the runs (``--busy``): a machine
    that is also doing other work, as users' laptops and shared CI machines are. Each
    runs in a session of its own and is killed on exit; none is left behind."""

    def __init__(self, count: int) -> None:
        if count < 0:
            raise ValueError(f"--busy {count}: give 0 or more CPU-burning processes")
        self.count = count
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> BusyCpus:
        for _ in range(self.count):
            self._procs.append(subprocess.Popen(
                [sys.executable, "-c", "while True: pass"], start_new_session=True,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return self

    def __exit__(self, *_: object) -> None:
        for proc in self._procs:
            proc.kill()
        for proc in self._procs:
            proc.wait(10)
        self._procs.clear()

"""The latency row of ``make bench``: end-to-end latency from an event's creation to its
result at the sink, at 100 k events/s with 100 ms streaming windows, for a stateless
Python map and for the keyed count, on Weir and on Spark Structured Streaming.

Design (the runs are in ``bench.latency_jobs``):

- **The events.** Event ``seq`` (0, 1, ...) is due at ``start_ms + seq * 1000 // rate``
  (``due_ms``): its creation time, carried in ``created_ms``. Its key and value are a
  function of ``seq`` (``event_batch``: a multiplicative hash, 10,000 keys, every key
  once per 10,000 events; values 0..99), so both systems get the same stream and the
  right answer is known from how many events were generated. Weir: ``PacedEvents``, an
  ``InputOperator`` that emits the events that are due each time the window loop calls
  it (every ~2 ms), stamped with their due time. The library's ``EventGenerator`` was
  not used: it emits a window's allowance in one burst at the window's start, with
  random keys Spark cannot reproduce. Spark SS: its ``rate`` source hands over whole
  seconds only (offsets are seconds: one 100,000-row micro-batch a second, measured
  here; its newest row is already 260-370 ms old at the sink, its oldest 1.3 s), so it
  gets the same generator as a Python streaming data source (``pyspark.sql.datasource``,
  Arrow batches): ``latestOffset`` is the events due by now, ``read`` makes them.
  Events are created by the schedule, not on a burst: a run whose source lags shows it
  as latency. The Python source costs Spark a few µs per row in its Python worker (the
  built-in ``rate-micro-batch`` source is JVM-only but stamps a whole batch with one
  synthetic time); at 20-50 k rows per micro-batch its job's fixed cost (~300 ms for a
  ``groupBy`` plus 100-150 ms of offset and commit log writes per batch, measured with
  both sources) weighs more.
- **The jobs.** Map: ``mapped = value * 3 + 7``. In Weir a plain ``Operator`` whose
  ``process`` maps each Arrow batch with pyarrow (``map_batch``; the library has no map
  operator, and this is what its README shows a user writing). In Spark SS a Python UDF
  (``map_value`` through ``functions.udf``, row at a time in Spark's Python worker):
  ``mapInArrow`` and pandas UDFs, the vectorised equivalents, need pandas, which the
  bench environment does not install. Count: per key per window, count and sum:
  Weir's ``WindowedCount`` (in Spark, one streaming window per application window),
  Spark SS a ``foreachBatch`` ``groupBy`` per micro-batch (the window is the
  micro-batch, as in the main row), with ``max(created_ms)`` per key.
- **Windows and triggers.** Weir: 100 ms streaming windows. Spark SS: the smallest
  processing-time trigger of 100, 200, 500, 1000 ms at which it keeps up (at most 10 %
  of its micro-batches take longer than the trigger), found once per job by a probe run
  before the repeats (``--probe``) and printed. Spark SS runs the job for 2 s before it
  probes or measures (its JIT, its Python workers), as Weir warms its Spark before its
  source starts.
- **Latency.** At the sink, each result's arrival is its wall clock when the sink's code
  has it (Weir: the sink operator's ``process``; Spark SS: ``foreachBatch`` after
  ``toArrow()``). Map: arrival minus that event's creation, per event. Count: per window
  result (Weir's streaming window, Spark's micro-batch), the arrival of its last batch
  minus the creation of the newest event it counts, so the window's own span is not
  counted. Events created in the first ``warmup_s`` are left out of the figures.
  events/s: the measured events over the span from the warm-up's end to the last of
  their results' arrival.
- **Correct.** Map: every generated event out exactly once with its mapped value.
  Count: per key, counts and sums over all windows equal those of the events generated
  (the generator is bounded: ``rate * duration_s`` events, then the stream ends).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.common import check_totals, percentile, render_table

__all__ = ["JOBS", "SPARK", "TRIGGERS_MS", "WEIR", "LatencySpec", "check_counts", "check_map",
           "due_ms", "event_batch", "expected_counts", "figures", "keeps_up", "latency_jobs",
           "map_batch", "map_value", "render_latency"]

WEIR, SPARK = "weir-latency", "spark-latency"
"""The systems' names in ``bench.one``."""
JOBS = ("map", "count")
TRIGGERS_MS = (100, 200, 500, 1000)
"""Spark SS's processing-time triggers tried, smallest first."""
APP_WINDOWS = (1, 2, 4, 5, 10)
"""Weir's application windows tried for the count (streaming windows per Spark job),
smallest first: its counterpart of Spark SS's trigger. Each divides the default
CHECKPOINT_WINDOW_COUNT (20), as the master requires (3 is refused at submit)."""
GOAL_MS = {"map": 100.0, "count": 250.0}
"""The issue's goal for Weir's p99 per job (and below Spark SS's p99)."""

_HASH = 2_654_435_761  # Knuth's multiplicative hash: odd, coprime with 10**k
SCHEMA = pa.schema([("seq", pa.int64()), ("key", pa.string()), ("value", pa.int64()),
                    ("created_ms", pa.int64())])
MAPPED_SCHEMA = pa.schema([("seq", pa.int64()), ("key", pa.string()), ("mapped", pa.int64()),
                           ("created_ms", pa.int64())])


@dataclasses.dataclass(frozen=True)
class LatencySpec:
    """One latency run: the job, the rate, the windows, how long, the warm-up left out."""

    job: str = "map"
    rate_per_second: int = 100_000
    keys: int = 10_000
    window_ms: int = 100
    duration_s: float = 30.0
    warmup_s: float = 5.0
    trigger_ms: int = 0  # Spark SS: 0 = find the smallest it sustains (TRIGGERS_MS)
    probe_s: float = 12.0  # seconds per trigger (Spark SS) or window count (Weir) tried
    app_windows: int = 1  # Weir's count: streaming windows per application window

    @property
    def events(self) -> int:
        return int(self.rate_per_second * self.duration_s)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LatencySpec:
        return cls(**json.loads(text))


def due_ms(start_ms: int, seq: np.ndarray | int, rate: int) -> np.ndarray | int:
    """When event ``seq`` is due (its creation time, epoch ms) on the schedule."""
    return start_ms + seq * 1000 // rate


def _codes(seq: np.ndarray, keys: int) -> tuple[np.ndarray, np.ndarray]:
    mixed = seq.astype(np.int64) * _HASH
    return mixed % keys, (mixed >> 16) % 100


def key_names(keys: int) -> pa.Array:
    """``k0000``..: the keys as ``EventGenerator`` names them."""
    width = max(4, len(str(keys - 1)))
    return pa.array([f"k{i:0{width}d}" for i in range(keys)], pa.string())


def event_batch(first: int, n: int, keys: int, start_ms: int, rate: int,
                names: pa.Array | None = None) -> pa.RecordBatch:
    """Events ``first .. first + n``: ``seq``, ``key``, ``value``, ``created_ms`` (due)."""
    seq = np.arange(first, first + n, dtype=np.int64)
    codes, values = _codes(seq, keys)
    names = key_names(keys) if names is None else names
    return pa.record_batch([pa.array(seq), names.take(pa.array(codes)), pa.array(values),
                            pa.array(due_ms(start_ms, seq, rate))], schema=SCHEMA)


def map_value(value: int) -> int:
    """The stateless map, per value (Spark SS's Python UDF)."""
    return value * 3 + 7


def map_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The stateless map over a batch (Weir's operator): ``map_value`` on each value."""
    mapped = pc.add(pc.multiply(batch.column("value"), 3), 7)
    return pa.record_batch([batch.column("seq"), batch.column("key"), mapped,
                            batch.column("created_ms")], schema=MAPPED_SCHEMA)


def expected_counts(events: int, keys: int) -> dict[str, tuple[int, int]]:
    """``{key: (count, sum)}`` over events ``0 .. events``."""
    codes, values = _codes(np.arange(events, dtype=np.int64), keys)
    counts = np.bincount(codes, minlength=keys)
    sums = np.bincount(codes, weights=values, minlength=keys).astype(np.int64)
    names = key_names(keys).to_pylist()
    return {names[i]: (int(counts[i]), int(sums[i])) for i in np.flatnonzero(counts)}


def check_map(seq: np.ndarray, mapped: np.ndarray, events: int, keys: int
              ) -> tuple[bool, str]:
    """Whether events ``0 .. events`` each came out once, with ``mapped`` right."""
    if events <= 0:
        return False, "WRONG: no event was generated"
    order = np.argsort(seq, kind="stable")
    seq, mapped = seq[order], mapped[order]
    seen = np.bincount(seq[(seq >= 0) & (seq < events)], minlength=events)
    missing, twice = int(np.sum(seen == 0)), int(np.sum(seen > 1))
    unknown = int(np.sum((seq < 0) | (seq >= events)))
    _, values = _codes(seq, keys)
    wrong = int(np.sum(mapped != values * 3 + 7))
    if missing or twice or unknown or wrong:
        return False, (f"WRONG: {missing:,} events missing, {twice:,} out more than once, "
                       f"{unknown:,} never generated, {wrong:,} with a wrong value "
                       f"(of {events:,})")
    return True, f"{events:,} events, each out once with its mapped value"


def check_counts(table: pa.Table, events: int, keys: int) -> tuple[bool, str]:
    """Whether the per-window ``key``, ``count``, ``sum`` rows add up, per key, to the
    counts and sums of events ``0 .. events``."""
    if events <= 0:
        return False, "WRONG: no event was generated"
    got: dict[str, tuple[int, int]] = {}
    if table.num_rows:
        summed = table.group_by("key").aggregate([("count", "sum"), ("sum", "sum")])
        got = dict(zip(summed["key"].to_pylist(),
                       zip(summed["count_sum"].cast(pa.int64()).to_pylist(),
                           summed["sum_sum"].cast(pa.int64()).to_pylist(), strict=True),
                       strict=True))
    ok, detail = check_totals(got, expected_counts(events, keys))
    return ok, (f"{events:,} events: {detail}" if ok else detail)


def figures(created_ms: np.ndarray, arrival_ms: np.ndarray, events: np.ndarray,
            boundary_ms: int) -> dict[str, float]:
    """p50, p99 and max latency and events/s of the results whose (newest) event was
    created after ``boundary_ms`` (the warm-up's end); one array entry per result."""
    kept = created_ms > boundary_ms
    latencies = (arrival_ms[kept] - created_ms[kept]).tolist()
    span_ms = float(arrival_ms[kept].max() - boundary_ms) if latencies else 0.0
    return {"latency_p50_ms": percentile(latencies, 50),
            "latency_p99_ms": percentile(latencies, 99),
            "latency_max_ms": max(latencies, default=0.0),
            "results_measured": len(latencies),
            "events_measured": int(events[kept].sum()),
            "events_per_second": round(events[kept].sum() * 1000 / span_ms) if span_ms else 0}


def keeps_up(trigger_ms: int, batch_ms: Sequence[float], most_behind: float = 0.1) -> bool:
    """Whether Spark SS sustained a trigger: at most ``most_behind`` of its micro-batches
    (``durationMs.triggerExecution``) took longer than the trigger (Spark's "falling
    behind"), and there were some."""
    if not batch_ms:
        return False
    behind = sum(1 for ms in batch_ms if ms > trigger_ms)
    return behind <= most_behind * len(batch_ms)


def weir_keeps_up(spec: LatencySpec, result: dict[str, Any]) -> bool:
    """Whether a Weir probe run sustained the rate: correct, and its events/s at least
    90 % of the rate offered (a backlog that grows shows as a lower rate)."""
    return bool(result.get("correct")) and float(
        result.get("events_per_second", 0)) >= 0.9 * spec.rate_per_second


def _weir_app_windows(spec: LatencySpec, run: Callable[..., dict[str, Any]], shown: Any,
                      timeout_s: float) -> tuple[int, list[dict[str, Any]]]:
    """The smallest application window (APP_WINDOWS) at which Weir's count keeps up, each
    tried on a short run, as Spark SS's trigger is; the largest if none does."""
    tries = []
    for count in APP_WINDOWS:
        short = dataclasses.replace(spec, app_windows=count,
                                    duration_s=spec.probe_s + spec.warmup_s)
        result = run(WEIR, shown, timeout_s, "--latency-spec", short.to_json())
        kept = weir_keeps_up(short, result)
        tries.append({"app_windows": count, "kept_up": kept,
                      "events_per_second": result.get("events_per_second"),
                      "p99_ms": result.get("latency_p99_ms")})
        if kept:
            return count, tries
    return APP_WINDOWS[-1], tries


def latency_jobs(args: Any, run: Callable[..., dict[str, Any]]
                 ) -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    """``make bench``'s four latency runs: ``run`` is its ``_run(system, JobSpec,
    timeout_s, *extra)``. Each system's batch for the count is found first by probe runs:
    Spark SS's smallest trigger, Weir's smallest application window that keep up."""
    from bench.common import JobSpec

    jobs = []
    for job in JOBS:
        spec = LatencySpec(job=job, duration_s=args.latency_seconds)
        shown = JobSpec(events=spec.events, window_ms=spec.window_ms,
                        rate_per_second=spec.rate_per_second)
        probe = run(SPARK, shown, args.timeout, "--latency-spec", spec.to_json(), "--probe")
        trigger = int(probe.get("trigger_ms") or TRIGGERS_MS[-1])
        print(f"  latency {job}: Spark SS trigger {trigger} ms "
              f"(probe: {probe.get('probes', probe.get('detail'))})", file=sys.stderr,
              flush=True)
        spark_spec = dataclasses.replace(spec, trigger_ms=trigger)
        weir_spec = spec
        if job == "count":
            count, tries = _weir_app_windows(spec, run, shown, args.timeout)
            print(f"  latency count: Weir application window {count} x {spec.window_ms} ms "
                  f"(probe: {tries})", file=sys.stderr, flush=True)
            weir_spec = dataclasses.replace(spec, app_windows=count)
        for system, s in ((WEIR, weir_spec), (SPARK, spark_spec)):
            jobs.append((f"{system} {job}", lambda system=system, s=s, shown=shown: {
                **run(system, shown, args.timeout, "--latency-spec", s.to_json()),
                "system": system, "job": s.job}))
    return jobs


def render_latency(results: list[dict[str, Any]]) -> str:
    """The latency section: per job and system, events/s and latency, p99 ÷ Spark SS,
    and the goal (Weir's p99 under GOAL_MS and Spark SS's) met in how many runs."""
    headers = ["job", "system", "trigger/window", "runs", "events/s", "p50 ms",
               "p99 ms (median)", "p99 min-max", "max ms", "correct", "p99 ÷ Spark SS",
               "goal met"]
    rows = []
    for r in results:
        job = r.get("job", "?")
        spark = next((s for s in results if s.get("system") == SPARK and s.get("job") == job
                      and s.get("correct")), None)
        p99 = float(r.get("latency_p99_ms", 0))
        low, high = r.get("spread", {}).get("latency_p99_ms", [p99, p99])
        extra = r.get("extra", {})
        unit = (f"trigger {extra.get('trigger_ms', '?')} ms" if r.get("system") == SPARK
                else f"window {extra.get('window_ms', '?')} ms"
                + (f" x {extra['app_windows']}" if extra.get("app_windows", 1) > 1 else ""))
        ratio = (f"{p99 / spark['latency_p99_ms']:.2f}" if spark and r.get("correct")
                 and spark.get("latency_p99_ms") else "-")
        goal = "-"
        if r.get("system") == WEIR:
            runs = [x.get("latency_p99_ms") for x in r.get("runs", [r])]
            spark_runs = [x.get("latency_p99_ms") for x in spark.get("runs", [spark])] \
                if spark else []
            met = sum(1 for i, x in enumerate(runs) if r.get("correct") and x is not None
                      and x < GOAL_MS.get(job, 0) and i < len(spark_runs)
                      and spark_runs[i] is not None and x < spark_runs[i])
            goal = f"{met} of {len(runs)}"
        rows.append([job, r.get("system", "?"), unit, str(r.get("repeats", 1)),
                     f"{r.get('events_per_second', 0):,.0f}",
                     f"{r.get('latency_p50_ms', 0):,.0f}", f"{p99:,.0f}",
                     f"{low:,.0f}-{high:,.0f}", f"{r.get('latency_max_ms', 0):,.0f}",
                     "yes" if r.get("correct") else "NO", ratio, goal])
    lines = ["latency: event creation to its result at the sink, 100 k events/s, 10,000 keys "
             "(map: per event; count: per window, from its newest event)",
             *render_table(headers, rows)]
    lines += [f"  {r.get('system')} {r.get('job')}: {r.get('detail', '')}" for r in results
              if not r.get("correct")]
    lines.append(textwrap.fill(
        f"goal met: Weir's p99 under {GOAL_MS['map']:.0f} ms (map) / {GOAL_MS['count']:.0f} "
        "ms (count) and under Spark SS's p99 of the same round", 100, initial_indent="  ",
        subsequent_indent="    "))
    return "\n".join(lines)

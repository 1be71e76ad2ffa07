"""The event-time row of ``make bench``: its input, its known answer, its figures.

1-second tumbling windows by event time, count and sum per key, a 2-second watermark
delay, over Parquet files in which 5 % of the events are up to 2 s out of order. Weir
(``bench.event_time_jobs.run_weir``) and Spark Structured Streaming (``run_spark``) read
the same files; both outputs must equal ``reference_windows``.

No row may be late for either system, whatever its batches: an out-of-order event is only
ever *behind* its place in the files, by at most the watermark delay, and every event
before it in the files has an event time no later than its place. So the watermark before
its batch (the highest event time seen minus the delay) is at most its own event time,
below its window's end.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime
import json
import textwrap
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench.common import percentile, render_table

__all__ = ["EventTimeSpec", "check_windows", "emitted_in", "event_time_jobs",
           "render_event_time",
           "reference_windows", "spark_delays_ms", "weir_delays_ms", "window_table",
           "write_event_time_files"]

_KEYS = ("key", "window_start")


@dataclasses.dataclass(frozen=True)
class EventTimeSpec:
    """The event-time job and its input.

    Event ``i`` (in file order) is due at ``start_ms + i * 1000 // events_per_second``; a
    fraction ``out_of_order`` of the events is stamped 1..``max_disorder_ms`` earlier.
    ``rows_per_window`` bounds what Weir's source reads per ``streaming_window_ms`` (the
    rate offered to Weir); ``files_per_trigger`` is Spark's ``maxFilesPerTrigger``.
    """

    events: int = 8_000_000
    keys: int = 10_000
    events_per_second: int = 100_000  # of event time: 100 events per ms
    out_of_order: float = 0.05
    max_disorder_ms: int = 2_000
    watermark_delay_ms: int = 2_000
    window_size_ms: int = 1_000
    batch_rows: int = 65_536  # rows per file
    seed: int = 0
    start_ms: int = 1_795_000_000_000  # 2026-11-18 11:06:40 UTC: whole seconds
    streaming_window_ms: int = 500
    rows_per_window: int = 1_000_000
    files_per_trigger: int = 15  # 983,040 events per micro-batch

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> EventTimeSpec:
        return cls(**json.loads(text))


def event_batch(spec: EventTimeSpec, index: int) -> pa.Table:
    """File ``index``'s events: ``ts`` (timestamp ms, UTC), ``key``, ``value`` (0..99).

    Seeded per file, so a file is the same whatever else is generated.
    """
    first = index * spec.batch_rows
    rows = max(0, min(spec.batch_rows, spec.events - first))
    rng = np.random.default_rng([spec.seed, index])
    due = spec.start_ms + (np.arange(first, first + rows, dtype=np.int64) * 1000
                           // spec.events_per_second)
    behind = rng.integers(1, spec.max_disorder_ms + 1, rows)
    ts = due - np.where(rng.random(rows) < spec.out_of_order, behind, 0)
    names = pa.array([f"k{k:05d}" for k in range(spec.keys)])
    return pa.table({"ts": pa.array(ts, pa.timestamp("ms", tz="UTC")),
                     "key": names.take(pa.array(rng.integers(0, spec.keys, rows))),
                     "value": pa.array(rng.integers(0, 100, rows), pa.int64())})


def write_event_time_files(spec: EventTimeSpec, folder: Path) -> int:
    """The events as uncompressed, dictionary-free Parquet files in ``folder`` (put it on
    tmpfs), names in file order, like ``bench.common.write_event_files``; the file count."""
    folder.mkdir(parents=True, exist_ok=True)
    files = -(-spec.events // spec.batch_rows)
    for index in range(files):
        pq.write_table(event_batch(spec, index), folder / f"part-{index + 1:06d}.parquet",
                       compression="none", use_dictionary=False)
    return files


def epoch_ms(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A timestamp column (any unit) or epoch-ms integers as epoch-ms int64."""
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("ms", tz=column.type.tz))
    return column.cast(pa.int64())


def reference_windows(folder: Path, window_size_ms: int) -> pa.Table:
    """What the job must output, computed from the files: per key and tumbling window,
    ``n`` and ``total``; columns ``key``, ``window_start`` (epoch ms), ``n``, ``total``."""
    events = pq.read_table(folder, columns=["ts", "key", "value"])
    ts = epoch_ms(events.column("ts")).to_numpy()
    table = pa.table({"key": events.column("key"),
                      "window_start": ts // window_size_ms * window_size_ms,
                      "value": events.column("value")})
    grouped = table.group_by(list(_KEYS)).aggregate([("value", "count"), ("value", "sum")])
    return pa.table({"key": grouped["key"], "window_start": grouped["window_start"],
                     "n": grouped["value_count"].cast(pa.int64()),
                     "total": grouped["value_sum"].cast(pa.int64())})


def window_table(table: pa.Table) -> pa.Table:
    """A system's output as ``key``, ``window_start`` (epoch ms), ``n``, ``total``."""
    return pa.table({"key": table.column("key").cast(pa.string()),
                     "window_start": epoch_ms(table.column("window_start")),
                     "n": table.column("n").cast(pa.int64()),
                     "total": table.column("total").cast(pa.int64())})


def check_windows(got: pa.Table, expected: pa.Table) -> tuple[bool, str]:
    """Whether ``got`` has each (key, window) of ``expected`` exactly once, with its count
    and sum, and nothing else (both as ``window_table``/``reference_windows`` give them)."""
    counts = got.group_by(list(_KEYS)).aggregate([([], "count_all")])
    twice = pc.sum(pc.greater(counts["count_all"], 1)).as_py() or 0
    missing = expected.join(got, list(_KEYS), join_type="left anti").num_rows
    extra = got.join(expected, list(_KEYS), join_type="left anti").num_rows
    both = expected.join(got, list(_KEYS), join_type="inner", right_suffix="_got")
    wrong = 0
    if both.num_rows:
        differs = pc.or_(pc.not_equal(both["n"], both["n_got"]),
                         pc.not_equal(both["total"], both["total_got"]))
        wrong = pc.sum(differs).as_py() or 0
    windows = pc.count_distinct(expected["window_start"]).as_py()
    if not (twice or missing or extra or wrong):
        return True, (f"{expected.num_rows:,} (key, window) results over {windows} windows, "
                      "each once, counts and sums exact")
    return False, (f"WRONG: {missing:,} (key, window) results missing, {extra:,} unexpected, "
                   f"{wrong:,} with a wrong count or sum, {twice:,} emitted more than once "
                   f"(of {expected.num_rows:,})")


def emitted_in(window_starts: pa.Array | pa.ChunkedArray, unit_ids: Iterable[int]
               ) -> dict[int, int]:
    """Per event-time window (start ms), the first unit (streaming window, micro-batch)
    whose output had it; ``window_starts[i]`` was output in ``unit_ids[i]``."""
    first: dict[int, int] = {}
    for start, unit in zip(window_starts.to_pylist(), unit_ids, strict=True):
        if start not in first or unit < first[start]:
            first[start] = unit
    return first


def weir_delays_ms(emitted: Mapping[int, int], source_end_ms: Mapping[int, int],
                   windows_end_ms: Mapping[int, int]) -> tuple[list[float], list[float], int]:
    """Weir's result delay per event-time window, the part of it queued, and how many
    windows had no timing.

    ``emitted``: event-time window -> the streaming window its results went out in. The
    windows operator fires in the streaming window whose watermark passes the window's
    end, and that watermark came with the source's END_WINDOW of the same window id: the
    delay is the operator's END_WINDOW of that window (results emitted) minus the
    source's (its input read). Queued: how long after that read the operator was still
    busy with its previous streaming window (a backlog, when the source reads faster
    than the operator takes the rows).
    """
    delays, queued, unknown = [], [], 0
    ended = sorted(windows_end_ms)
    for window in sorted(emitted):
        w = emitted[window]
        if w not in source_end_ms or w not in windows_end_ms:
            unknown += 1
            continue
        delays.append(float(windows_end_ms[w] - source_end_ms[w]))
        before = bisect.bisect_left(ended, w)
        busy_until = windows_end_ms[ended[before - 1]] if before else source_end_ms[w]
        queued.append(float(max(0, busy_until - source_end_ms[w])))
    return delays, queued, unknown


def spark_delays_ms(emitted: Mapping[int, int], progress: Iterable[Mapping[str, Any]]
                    ) -> tuple[list[float], int]:
    """Spark Structured Streaming's result delay per event-time window, and how many had
    no timing.

    ``emitted``: event-time window -> the micro-batch that output it; ``progress``: per
    micro-batch ``batch``, ``start_ms`` (its trigger) and ``trigger_ms``
    (``durationMs.triggerExecution``). In append mode a window goes out in the micro-batch
    after the one whose data moved the watermark past its end (the watermark is taken
    between micro-batches): the delay runs from that earlier micro-batch's trigger (its
    input fixed) to the end of the one that output it.
    """
    by_batch = {int(p["batch"]): p for p in progress}
    delays, unknown = [], 0
    for window in sorted(emitted):
        batch = emitted[window]
        out, moved = by_batch.get(batch), by_batch.get(batch - 1)
        if out is None or moved is None:
            unknown += 1
            continue
        delays.append(float(out["start_ms"]) + float(out["trigger_ms"])
                      - float(moved["start_ms"]))
    return delays, unknown


def iso_ms(text: str) -> int:
    """Spark's progress timestamp (``2026-11-24T17:32:00.123Z``) as epoch ms."""
    stamp = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return round(stamp.timestamp() * 1000)


def delay_figures(delays: list[float]) -> dict[str, float]:
    """p50 and p99 of the result delays, kept in a run's ``extra`` beside its latencies."""
    return {"result_delay_p50_ms": percentile(delays, 50),
            "result_delay_p99_ms": percentile(delays, 99)}


WEIR, SPARK = "weir-event-time", "spark-event-time"
"""The systems' names in ``bench.one`` and in the results."""

NOTES = (
    "events/s: events over the seconds from the first input read to the last result out.",
    "result delay: per event-time window, from when the input that completed it was read "
    "to its result out. Weir: the source's END_WINDOW of the streaming window whose "
    "watermark passed the window's end, to the windows operator's END_WINDOW of that "
    "window (its results emitted). Spark SS: from the trigger of the micro-batch whose "
    "data moved the watermark past the window's end to the end (triggerExecution) of the "
    "next micro-batch, which outputs it: append mode emits one micro-batch later.",
    "correct: every (key, window) count and sum equals the reference computed from the "
    "files with pyarrow, each emitted once; no late rows (none is late by construction). "
    "Spark SS never closes the windows within the delay of the input's end (its watermark "
    "never passes them): those are left out of its check; Weir closes them at the end.",
)


def event_time_jobs(args: Any, run: Callable[..., dict[str, Any]]
                    ) -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    """``make bench``'s two event-time jobs over the same spec: ``run`` is its
    ``_run(system, JobSpec, timeout_s, *extra)``; ``args`` its options."""
    from bench.common import JobSpec

    spec = EventTimeSpec(events=args.event_time_events, rows_per_window=round(
        args.event_time_rate * EventTimeSpec.streaming_window_ms / 1000))
    extra = ("--event-time-spec", spec.to_json())
    shown = JobSpec(events=spec.events)
    return [(name, lambda name=name: run(name, shown, args.timeout, *extra))
            for name in (WEIR, SPARK)]


def render_event_time(results: list[dict[str, Any]]) -> str:
    """The event-time section: events/s and result delay, as ratios to Spark SS's."""
    spark = next((r for r in results if r["system"] == SPARK and r.get("correct")), None)
    headers = ["system", "events", "runs", "events/s (median)", "min-max", "delay p50 ms",
               "delay p99 ms", "peak MB", "correct", "events/s ÷ Spark SS", "p99 ÷ Spark SS"]
    rows = []
    for r in results:
        eps, p50, p99 = (r.get("events_per_second", 0), r.get("latency_p50_ms", 0),
                         r.get("latency_p99_ms", 0))
        low, high = r.get("spread", {}).get("events_per_second", [eps, eps])
        ok = bool(spark and r.get("correct"))
        rows.append([r["system"], f"{r.get('events', 0):,}", str(r.get("repeats", 1)),
                     f"{eps:,.0f}", f"{low:,.0f}-{high:,.0f}", f"{p50:,.0f}", f"{p99:,.0f}",
                     f"{r.get('peak_rss_mb', 0):,.0f}", "yes" if r.get("correct") else "NO",
                     f"{eps / spark['events_per_second']:.2f}" if ok and spark
                     and spark.get("events_per_second") else "-",
                     f"{p99 / spark['latency_p99_ms']:.2f}" if ok and spark
                     and spark.get("latency_p99_ms") else "-"])
    lines = ["event time: 1 s tumbling windows by event time, count and sum per key, 2 s "
             "watermark delay, 5 % of events up to 2 s out of order (same Parquet files)",
             *render_table(headers, rows)]
    lines += [f"  {r['system']}: {r.get('detail', '')}" for r in results]
    for r in results:
        extra = r.get("extra", {})
        if r["system"] == WEIR and r.get("correct"):
            lines.append(textwrap.fill(
                f"{WEIR}: offered {extra.get('offered_events_per_second', 0):,.0f} events/s;"
                f" of the delay, queued behind the previous streaming window: p50 "
                f"{extra.get('queued_p50_ms', 0):,.0f} ms, p99 "
                f"{extra.get('queued_p99_ms', 0):,.0f} ms; the delay without it: p50 "
                f"{extra.get('unqueued_p50_ms', 0):,.0f} ms, p99 "
                f"{extra.get('unqueued_p99_ms', 0):,.0f} ms", 100, initial_indent="  ",
                subsequent_indent="    "))
    lines += [textwrap.fill(note, 100, initial_indent="  ", subsequent_indent="    ")
              for note in NOTES]
    return "\n".join(lines)

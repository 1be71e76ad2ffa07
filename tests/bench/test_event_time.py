"""make bench's event-time row: its input, reference, check, delays and table (no timing)."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench import __main__ as bench_main
from bench.event_time import (
    SPARK,
    WEIR,
    EventTimeSpec,
    check_windows,
    emitted_in,
    event_batch,
    iso_ms,
    reference_windows,
    render_event_time,
    spark_delays_ms,
    weir_delays_ms,
    window_table,
    write_event_time_files,
)

SMALL = EventTimeSpec(events=50_000, keys=50, events_per_second=10_000, batch_rows=8_192)


def test_the_events_are_the_same_every_time_and_out_of_order_as_asked() -> None:
    first, again = event_batch(SMALL, 2), event_batch(SMALL, 2)
    assert first.equals(again)
    assert first.schema.field("ts").type == pa.timestamp("ms", tz="UTC")
    ts = np.concatenate([event_batch(SMALL, i).column("ts").cast(pa.int64()).to_numpy()
                         for i in range(7)])
    assert len(ts) == SMALL.events  # the last file holds the rest
    due = SMALL.start_ms + np.arange(len(ts)) * 1000 // SMALL.events_per_second
    behind = due - ts
    assert behind.min() == 0 and behind.max() <= SMALL.max_disorder_ms
    assert 0.04 < np.mean(behind > 0) < 0.06


def test_no_event_is_late_whatever_the_batches() -> None:
    """Every event is at or after the highest event time before it minus the delay, so the
    watermark before any batch holding it is below its window's end."""
    ts = np.concatenate([event_batch(SMALL, i).column("ts").cast(pa.int64()).to_numpy()
                         for i in range(7)])
    highest_before = np.maximum.accumulate(np.concatenate([[ts[0]], ts[:-1]]))
    assert np.all(ts >= highest_before - SMALL.watermark_delay_ms)


def test_the_reference_counts_and_sums_per_key_and_window(tmp_path: Path) -> None:
    files = write_event_time_files(SMALL, tmp_path / "events")
    assert files == 7
    want: dict[tuple[str, int], list[int]] = collections.defaultdict(lambda: [0, 0])
    for i in range(files):
        for row in event_batch(SMALL, i).to_pylist():
            ms = int(row["ts"].timestamp() * 1000)
            window = want[(row["key"], ms - ms % 1000)]
            window[0] += 1
            window[1] += row["value"]
    got = reference_windows(tmp_path / "events", 1000).to_pylist()
    assert {(r["key"], r["window_start"]): [r["n"], r["total"]] for r in got} == want
    assert len(got) == len(want)


def _windows(rows: list[tuple[str, int, int, int]]) -> pa.Table:
    keys, starts, counts, sums = zip(*rows, strict=True)
    return pa.table({"key": list(keys), "window_start": pa.array(starts, pa.int64()),
                     "n": pa.array(counts, pa.int64()), "total": pa.array(sums, pa.int64())})


EXPECTED = _windows([("a", 0, 2, 5), ("b", 0, 1, 1), ("a", 1000, 3, 9)])


def test_the_check_takes_an_exact_output_in_any_order() -> None:
    ok, detail = check_windows(EXPECTED.take([2, 0, 1]), EXPECTED)
    assert ok, detail
    assert "3 (key, window) results over 2 windows" in detail


def test_the_check_names_what_is_wrong() -> None:
    cases = {
        "1 (key, window) results missing": EXPECTED.slice(0, 2),
        "1 unexpected": pa.concat_tables([EXPECTED, _windows([("c", 0, 1, 1)])]),
        "1 with a wrong count or sum": _windows([("a", 0, 2, 5), ("b", 0, 1, 2),
                                                 ("a", 1000, 3, 9)]),
        "1 emitted more than once": pa.concat_tables([EXPECTED, EXPECTED.slice(2)]),
    }
    for phrase, got in cases.items():
        ok, detail = check_windows(got, EXPECTED)
        assert not ok and phrase in detail, (phrase, detail)


def test_outputs_are_brought_to_epoch_ms() -> None:
    spark_like = pa.table({"key": ["a"], "window_start": pa.array(
        [1_000_000], pa.timestamp("us", tz="UTC")), "n": pa.array([1], pa.int32()),
        "total": pa.array([7], pa.int64())})
    assert window_table(spark_like).to_pylist() == [
        {"key": "a", "window_start": 1000, "n": 1, "total": 7}]


def test_each_window_goes_with_the_first_unit_that_output_it() -> None:
    assert emitted_in(pa.array([0, 1000, 0, 2000]), [5, 6, 4, 6]) == {0: 4, 1000: 6, 2000: 6}


def test_weir_delay_is_the_source_read_to_the_windows_operator_out() -> None:
    source = {10: 1_000, 11: 1_500, 12: 2_000}
    windows = {10: 1_800, 11: 2_600, 12: 2_900}  # window 11 waited 300 ms for window 10
    delays, queued, unknown = weir_delays_ms({0: 10, 1000: 11, 2000: 11, 3000: 13},
                                             source, windows)
    assert delays == [800, 1_100, 1_100] and queued == [0, 300, 300] and unknown == 1


def test_spark_delay_spans_the_batch_that_moved_the_watermark_and_the_next() -> None:
    progress = [{"batch": 0, "start_ms": 0, "trigger_ms": 900},
                {"batch": 1, "start_ms": 950, "trigger_ms": 1000},
                {"batch": 2, "start_ms": 2000, "trigger_ms": 100}]
    delays, unknown = spark_delays_ms({0: 1, 1000: 2, 2000: 2, 3000: 0}, progress)
    assert delays == [1_950, 1_150, 1_150] and unknown == 1
    assert iso_ms("1970-01-01T00:00:01.250Z") == 1_250


def test_the_table_gives_ratios_to_spark() -> None:
    weir = {"system": WEIR, "events": 10, "events_per_second": 30, "latency_p50_ms": 500,
            "latency_p99_ms": 900, "correct": True, "detail": "ok",
            "extra": {"offered_events_per_second": 40, "queued_p50_ms": 100}}
    spark = {"system": SPARK, "events": 10, "events_per_second": 20, "latency_p50_ms": 400,
             "latency_p99_ms": 600, "correct": True, "detail": "ok"}
    lines = render_event_time([weir, spark]).splitlines()
    assert lines[3].split()[-2:] == ["1.50", "1.50"]
    assert lines[4].split()[-2:] == ["1.00", "1.00"]
    text = " ".join(line.strip() for line in lines)
    assert "queued behind the previous streaming window: p50 100 ms" in text
    wrong = render_event_time([weir, {**spark, "correct": False}]).splitlines()
    assert wrong[3].split()[-2:] == ["-", "-"]


def test_make_bench_runs_both_systems_on_one_spec_and_prints_the_section(
        monkeypatch, tmp_path, capsys) -> None:
    calls: list[tuple[str, dict]] = []

    def fake_run(system, spec, timeout_s, *extra):
        et = json.loads(extra[extra.index("--event-time-spec") + 1])
        calls.append((system, et))
        return {"system": system, "events": spec.events, "events_per_second": 10,
                "latency_p50_ms": 5, "latency_p99_ms": 9, "correct": True, "detail": "ok"}

    monkeypatch.setattr(bench_main, "_run", fake_run)
    monkeypatch.setattr(bench_main, "_machine", lambda: {"cores": 2})
    skips = [arg for name in ("weir", "weir-paced", "spark-streaming", "weir-kafka", "bytewax",
                              "startup", "recovery", "master-restart", "control-plane",
                              "scaling", "running-count", "latency", "nexmark")
             for arg in ("--skip", name)]
    assert bench_main.main([*skips, "--repeat", "2", "--event-time-events", "1000",
                            "--event-time-rate", "4000", "--out", str(tmp_path)]) == 0
    assert [system for system, _ in calls] == [WEIR, SPARK, WEIR, SPARK]  # interleaved
    assert all(et["events"] == 1000 and et["rows_per_window"] == 2000 for _, et in calls)
    assert "event time: 1 s tumbling windows" in capsys.readouterr().out
    report = json.loads((tmp_path / "latest.json").read_text())
    assert [r["system"] for r in report["event_time"]] == [WEIR, SPARK]

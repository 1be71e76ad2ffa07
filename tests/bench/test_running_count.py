"""The running-count row of ``make bench``: its per-window figures, its line in the report,
and the input it writes (a growing key space with repeats)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

import bench.__main__ as bench_main
from bench.running_count import _window_times, expected_totals, render, write_keys

SKIP_ALL_BUT = [arg for name in ("weir", "weir-paced", "spark-streaming", "weir-kafka",
                                 "bytewax", "event-time", "startup", "recovery",
                                 "master-restart", "control-plane", "scaling", "latency",
                                 "nexmark")
                for arg in ("--skip", name)]


def test_each_window_brings_new_keys_and_repeats_of_earlier_ones(tmp_path):
    assert write_keys(tmp_path, windows=3, new_keys=10, repeats=5) == 45
    first = pq.read_table(tmp_path / "keys-00000.parquet")["user"].to_pylist()
    last = pq.read_table(tmp_path / "keys-00002.parquet")["user"].to_pylist()
    assert set(range(10)) <= set(first) and max(first) < 10
    assert set(range(20, 30)) <= set(last) and len(last) == 15
    assert expected_totals(tmp_path).num_rows == 30


def test_window_times_come_from_the_running_totals_per_job():
    metrics = {1: {"spark[jobs]": 1, "spark[handoff_ms]": 10, "spark[job_ms]": 100,
                   "spark[emit_ms]": 40},
               2: {"spark[jobs]": 1, "spark[handoff_ms]": 10, "spark[job_ms]": 100,
                   "spark[emit_ms]": 40},  # no job in this window
               3: {"spark[jobs]": 2, "spark[handoff_ms]": 20, "spark[job_ms]": 220,
                   "spark[emit_ms]": 90}}
    assert _window_times(metrics) == [150.0, 180.0]


def test_make_bench_runs_the_row_and_prints_its_line(monkeypatch, tmp_path, capsys):
    result = {"system": "weir running count", "windows": 50, "new_keys_per_window": 100_000,
              "repeats_per_window": 50_000, "distinct_keys": 5_000_000, "start_ms": 600.0,
              "end_ms": 660.0, "ratio": 1.1, "ratio_to_windows_6_to_10": 1.2,
              "container_peak_rss_mb": 1200, "container_rss_by_fifth_mb": [1, 2, 3, 4, 5],
              "python_rss_by_fifth_mb": [1, 1, 1, 1, 1], "correct": True, "detail": "",
              "error": ""}
    calls = []
    monkeypatch.setattr(bench_main, "_run", lambda system, *a: calls.append(system) or result)
    monkeypatch.setattr(bench_main, "_machine", lambda: {"cores": 2})
    assert bench_main.main([*SKIP_ALL_BUT, "--out", str(tmp_path)]) == 0
    assert calls == ["running-count"]
    assert render(result) in capsys.readouterr().out
    assert json.loads((tmp_path / "latest.json").read_text())["running_count"]["ratio"] == 1.1
    assert "5 M keys" in render(result) and "x1.1" in render(result)

"""The Nexmark runs timed from outside: which output files count and their times
(``bench.output_times``), the launch time the runner hands to its run, and ``one``
putting them together before the work folder goes. Real files, no system runs."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.common import JobResult, run_json_subprocess
from bench.nexmark import one, spark_queries, weir_queries
from bench.nexmark.model import NexmarkSpec
from bench.output_times import OUTSIDE_FIGURES, has_rows, outside_figures, result_times


def _parquet(path: Path, rows: int, mtime: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"a": pa.array(range(rows), pa.int64())}), path)
    os.utime(path, (mtime, mtime))
    return path


def _text(path: Path, text: str, mtime: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))
    return path


def test_the_first_and_last_file_with_rows_give_the_times(tmp_path: Path) -> None:
    _parquet(tmp_path / "window-1-0000000001.parquet", 3, 1_000.0)
    _parquet(tmp_path / "window-1-0000000002.parquet", 0, 500.0)  # empty: earlier, not counted
    _parquet(tmp_path / "window-1-0000000003.parquet", 1, 3_000.0)
    _parquet(tmp_path / "window-1-0000000004.parquet", 0, 9_000.0)  # empty: later, not counted
    _text(tmp_path / "_SUCCESS", "", 50.0)
    _parquet(tmp_path / ".window-1-0000000005.parquet.77.tmp", 2, 20.0)  # being written
    _text(tmp_path / ".part-0.parquet.crc", "x", 10.0)
    _parquet(tmp_path / "_temporary" / "0" / "part-9.parquet", 2, 5.0)  # not committed
    assert result_times(tmp_path, "*") == (1_000.0, 3_000.0)
    assert result_times(tmp_path, "**/*") == (1_000.0, 3_000.0)
    assert result_times(tmp_path, weir_queries.RESULT_FILES) == (1_000.0, 3_000.0)


def test_no_file_with_a_row_gives_no_times(tmp_path: Path) -> None:
    _parquet(tmp_path / "part-00000-x.snappy.parquet", 0, 100.0)
    _text(tmp_path / "_SUCCESS", "", 200.0)
    assert result_times(tmp_path, "*") is None
    assert result_times(tmp_path / "never-written", "*") is None


def test_spark_ss_part_files_count_and_only_those(tmp_path: Path) -> None:
    _parquet(tmp_path / "part-00000-a.snappy.parquet", 2, 2_000.0)
    _parquet(tmp_path / "part-00001-b.snappy.parquet", 0, 1_000.0)
    _parquet(tmp_path / "other.parquet", 5, 100.0)
    assert result_times(tmp_path, spark_queries.RESULT_FILES) == (2_000.0, 2_000.0)


def test_csv_files_count_by_holding_a_line_at_any_depth(tmp_path: Path) -> None:
    """Flink's filesystem sink: committed part files (no suffix) in a bucket folder; an
    in-progress file is hidden."""
    _text(tmp_path / "2026-11-26--07" / "part-1-0", "1,2\n", 4_000.0)
    _text(tmp_path / "2026-11-26--07" / "part-1-1", "", 100.0)
    _text(tmp_path / "2026-11-26--07" / ".part-1-2.inprogress.abc", "3,4\n", 50.0)
    _text(tmp_path / "part-2-0", "5,6\n7,8\n", 6_000.0)
    assert result_times(tmp_path, "**/*") == (4_000.0, 6_000.0)


def test_a_parquet_file_without_its_footer_has_no_rows(tmp_path: Path) -> None:
    half = tmp_path / "window-1.parquet"
    half.write_bytes(b"PAR1 not yet finished")
    assert not has_rows(half)
    assert has_rows(_parquet(tmp_path / "whole.parquet", 1, 1.0))


def test_the_figures_are_times_since_launch_and_events_over_the_last() -> None:
    figures = outside_figures(1_000.0, 1_012.5, (1_004.0, 1_010.0), 2_000)
    assert figures == {"launch_to_first_result_s": 4.0, "launch_to_last_result_s": 10.0,
                       "launch_to_exit_s": 12.5, "events_per_second_outside": 200.0}
    assert tuple(figures) == OUTSIDE_FIGURES


def test_a_figure_that_cannot_be_taken_is_none() -> None:
    no_output = outside_figures(1_000.0, 1_012.5, None, 2_000)
    assert no_output == {"launch_to_first_result_s": None, "launch_to_last_result_s": None,
                         "launch_to_exit_s": 12.5, "events_per_second_outside": None}
    assert outside_figures(1_000.0, None, (1_001.0, 1_002.0), 10)["launch_to_exit_s"] is None


def test_the_runner_passes_its_spawn_time_to_the_run() -> None:
    code = "import json, sys; print(json.dumps({'correct': True, 'argv': sys.argv[1:]}))"
    before = time.time()
    result = run_json_subprocess("echo", [sys.executable, "-c", code], 60,
                                 launched_at_flag="--launched-at")
    after = time.time()
    flag, value = result["argv"]
    assert flag == "--launched-at" and before <= float(value) <= after
    plain = run_json_subprocess("echo", [sys.executable, "-c", code], 60)
    assert plain["argv"] == []


@pytest.fixture
def spark_run(monkeypatch):
    """``spark_queries.run`` replaced: writes two result files (2 s and 5 s after the
    launch) and an empty one, returns 6 s after it; its keyword arguments recorded."""
    calls: list[dict] = []
    launched = 1_800_000_000.0

    def fake(query, spec, data, work, files_per_trigger, **kwargs):
        calls.append(kwargs)
        out = work / spark_queries.OUT_DIR
        _parquet(out / "part-00000-a.parquet", 4, launched + 2)
        _parquet(out / "part-00001-b.parquet", 0, launched + 1)
        _parquet(out / "part-00002-c.parquet", 4, launched + 5)
        return JobResult("spark-structured-streaming", spec.events, 3.0, [], True, "exact",
                         extra={"system_returned_at": launched + 6})

    monkeypatch.setattr(spark_queries, "run", fake)
    return calls, launched


def test_one_times_the_run_from_the_launch_and_turns_the_warm_up_off(spark_run, capsys,
                                                                     tmp_path: Path) -> None:
    calls, launched = spark_run
    spec = NexmarkSpec(events=1_000)
    argv = ["spark-structured-streaming", "q1", "--data", str(tmp_path), "--spec",
            spec.to_json(), "--launched-at", str(launched)]
    assert one.main([*argv, "--no-warm-up"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert calls[-1]["warm_up"] is False
    assert result["launch_to_first_result_s"] == 2.0
    assert result["launch_to_last_result_s"] == 5.0
    assert result["launch_to_exit_s"] == 6.0
    assert result["events_per_second_outside"] == 200.0
    assert result["events_per_second"] == pytest.approx(1_000 / 3)  # the span, kept
    assert "system_returned_at" not in result["extra"]
    assert one.main(argv) == 0
    assert calls[-1]["warm_up"] is True  # the flag's default: as before


def test_busy_cpus_spin_while_inside_and_are_gone_after() -> None:
    import psutil

    from bench.common import BusyCpus
    from tests.harness import poll_for

    with BusyCpus(2) as busy:
        procs = [psutil.Process(p.pid) for p in busy._procs]
        assert len(procs) == 2
        poll_for(lambda: all(p.cpu_times().user > 0.05 for p in procs), 30,
                 "both busy processes to burn CPU")
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs)
    with pytest.raises(ValueError, match="--busy -1"):
        BusyCpus(-1)

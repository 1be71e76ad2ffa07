"""The Nexmark row: its runs interleaved, its table, its failures (FAILED and a non-zero
exit, as every other row), its place in ``make bench``, and how Flink's output is read
back. No system runs here; the runs are made up."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from bench import __main__ as bench_main
from bench.nexmark import __main__ as nexmark_main
from bench.nexmark import flink_job, flink_runner, runner
from bench.nexmark.flink_runner import output_schema, read_output
from bench.nexmark.model import NOT_EXPRESSIBLE, QUERIES
from bench.output_times import result_times

FIGURES = {"weir": 600_000.0, "spark-structured-streaming": 500_000.0, "flink": 1_200_000.0}
LAST_RESULT_S = {"weir": 10.0, "spark-structured-streaming": 30.0, "flink": 20.0}
"""Each system's made-up seconds from launch to its last result (the median run's)."""


def table_row(table: str, query: str, system: str) -> dict[str, str]:
    """A row of the rendered table as header -> cell, cut at the columns the dashes line
    marks (an empty cell stays empty); a ``min-max`` column is named after the column
    before it (``"launch→last result s min-max"``)."""
    lines = table.splitlines()
    dashes = next(i for i, line in enumerate(lines) if set(line) == {"-", " "})
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[dashes])]
    headers: list[str] = []
    for start, end in spans:
        header = lines[dashes - 1][start:end].strip()
        headers.append(f"{headers[-1]} {header}" if header == "min-max" else header)
    for line in lines[dashes + 1:]:
        cells = [line[start:end].strip() for start, end in spans]
        if cells[:2] == [query, system]:
            return dict(zip(headers, cells, strict=True))
    raise AssertionError(f"no row {query} {system} in\n{table}")


@pytest.fixture
def fake_runs(monkeypatch):
    """``_run_one`` answering from made-up figures (flink's q7 wrong); calls recorded.
    The events are not written."""
    calls: list[tuple[str, str]] = []

    def fake(system, query, spec, data, rate, timeout_s, warm_up=False):
        calls.append((system, query))
        n = sum(1 for s, q in calls if (s, q) == (system, query))
        wrong = system == "flink" and query == "q7"
        last = LAST_RESULT_S[system] * (1 + 0.1 * (n - 2))
        return {"system": system, "correct": not wrong,
                "launch_to_first_result_s": last / 2, "launch_to_last_result_s": last,
                "launch_to_exit_s": last + 1, "events_per_second_outside": 1_000 / last,
                "detail": "WRONG: 3 rows, 4 expected" if wrong else "4 rows, exact",
                "events_per_second": FIGURES[system] * (1 + 0.1 * (n - 2)),
                "latencies_ms": [100.0] if system != "flink" else [],
                "latency_p50_ms": 100.0, "latency_p99_ms": 200.0, "peak_rss_mb": 10.0,
                "extra": {"breakdown": {"jobs": 3, "rows_per_job": 1000, "job_ms": 50.0,
                                        "cpu_seconds": {}, "timed_seconds": 1.0}
                          if query != "q7" else  # an operator that runs no Spark job
                          {"windows": 3, "rows_per_window": 500, "operator_cpu_ms": 9.0,
                           "cpu_seconds": {}, "timed_seconds": 1.0}}
                if system == "weir" else {}}

    monkeypatch.setattr(runner, "_run_one", fake)
    monkeypatch.setattr(runner, "write_files", lambda spec, data, csv: {"bid": 1})
    return calls


def test_runs_are_interleaved_and_summarised_as_medians_with_their_spread(fake_runs):
    section = runner.run_nexmark(1_000, ["q1", "q7"], repeat=3)
    assert fake_runs[:6] == [("weir", "q1"), ("spark-structured-streaming", "q1"),
                             ("flink", "q1")] * 2
    weir, spark, flink = section["queries"]["q1"]
    assert weir["events_per_second"] == 600_000.0  # the median of 540k, 600k, 660k
    assert weir["spread"]["events_per_second"] == [540_000.0, 660_000.0]
    assert spark["repeats"] == 3 and flink["correct"]
    assert not section["queries"]["q7"][2]["correct"]


def test_the_table_gives_weir_as_ratios_and_each_wrong_run_as_failed(fake_runs):
    section = {**runner.run_nexmark(1_000, ["q1", "q7"], repeat=3), "cores": 2}
    table = runner.render_nexmark(section)
    q1_weir = table_row(table, "q1", "weir")
    assert (q1_weir["weir ÷ Spark SS span"], q1_weir["weir ÷ Flink span"]) == ("1.20", "0.50")
    q7_weir = table_row(table, "q7", "weir")
    assert (q7_weir["weir ÷ Spark SS span"], q7_weir["weir ÷ Flink span"]) == ("1.20", "-")
    assert q1_weir["per core"] == "300,000"  # on 2 cores
    q1_flink = table_row(table, "q1", "flink")
    assert (q1_flink["per core"], q1_flink["published Flink per core"]) == ("600,000",
                                                                           "157,940")
    assert "q7 flink: WRONG: 3 rows, 4 expected" in table
    assert "q1 weir: per job of 1,000 rows" in table  # the breakdown line
    assert "q7 weir: per window of 500 rows into the operator" in table  # no Spark job
    assert runner.nexmark_failed(section) == ["nexmark q7 flink: WRONG: 3 rows, 4 expected"]


def test_a_breakdown_without_spark_jobs_gives_the_operators_cpu_per_window():
    from bench.common import render_breakdown

    line = render_breakdown({"windows": 4, "rows_per_window": 1200, "operator_cpu_ms": 35.0,
                             "sink_write_ms": 5.0, "waiting_ms": 60.0, "latency_p50_ms": 100,
                             "cpu_seconds": {"c0 python": 1.5}, "timed_seconds": 2.0})
    assert line.startswith("per window of 1,200 rows into the operator (p50 latency 100 ms)")
    assert "the operator's CPU 35 ms; sink write 5 ms; waiting" in line
    assert render_breakdown({"sink_write_ms": 5.0, "cpu_seconds": {},
                             "timed_seconds": 1.0}).startswith("per window (")


def test_the_command_prints_failed_and_exits_non_zero_on_a_wrong_run(fake_runs, capsys,
                                                                      tmp_path):
    assert nexmark_main.main(["--events", "1000", "--queries", "q1", "--repeat", "1",
                              "--json", str(tmp_path / "n.json")]) == 0
    assert nexmark_main.main(["--events", "1000", "--queries", "q7", "--repeat", "1"]) == 1
    out = capsys.readouterr().out
    assert "FAILED nexmark q7 flink: WRONG" in out
    assert json.loads((tmp_path / "n.json").read_text())["queries"]["q1"][0]["system"] == "weir"
    with pytest.raises(SystemExit):
        runner.parse_queries("q1,q99")
    with pytest.raises(SystemExit):
        nexmark_main.main(["--systems", "storm"])


_ALL_BUT_NEXMARK = ["--skip", "weir", "--skip", "weir-paced", "--skip", "spark-streaming",
                    "--skip", "weir-kafka", "--skip", "bytewax", "--skip", "event-time",
                    "--skip", "running-count", "--skip", "startup", "--skip", "recovery",
                    "--skip", "master-restart", "--skip", "control-plane", "--skip",
                    "latency", "--skip", "scaling", "--repeat", "1"]


def test_make_bench_has_the_nexmark_row_and_fails_on_its_failures(fake_runs, monkeypatch,
                                                                  tmp_path, capsys):
    monkeypatch.setattr(bench_main, "_machine", lambda: {"cores": 2})
    code = bench_main.main([*_ALL_BUT_NEXMARK, "--nexmark-events", "1000",
                            "--nexmark-queries", "q1,q7", "--out", str(tmp_path)])
    assert code == 1
    out = capsys.readouterr().out
    assert "nexmark: 1,000 events" in out and "FAILED nexmark q7 flink" in out
    report = json.loads((tmp_path / "latest.json").read_text())
    assert set(report["nexmark"]["queries"]) == {"q1", "q7"}
    fake_runs.clear()
    assert bench_main.main([*_ALL_BUT_NEXMARK, "--skip", "nexmark",
                            "--out", str(tmp_path)]) == 0
    assert fake_runs == []


def test_flink_gets_a_query_for_each_and_its_csv_output_is_read_back(tmp_path: Path):
    settings = {"window_ms": 10_000, "slide_ms": 2_000, "session_gap_ms": 10_000,
                "q2_modulo": 123, "watermark_delay_ms": 2_000, "category": 10,
                "q3_states": ["OR", "ID", "CA"], "top_n": 10}
    for query in (q for q in QUERIES if ("flink", q) not in NOT_EXPRESSIBLE):
        views, sql = flink_job.query_sql(query, settings)
        assert sql.startswith("SELECT")
        assert all(v.startswith("CREATE TEMPORARY VIEW") for v in views)
        assert output_schema(query).names == re.findall(r"(?:^|, )([a-z_]+) ",
                                                        flink_job._OUTPUT[query])
    (tmp_path / "2026-11-26--07").mkdir()
    (tmp_path / "2026-11-26--07" / "part-1-0").write_text(
        "1000,1001,908.000,\"2026-11-18 11:06:40.005\",x\n")
    (tmp_path / "2026-11-26--07" / ".part-1-1.inprogress").write_text("garbage\n")
    table = read_output("q1", tmp_path)
    assert table.num_rows == 1
    os.utime(tmp_path / "2026-11-26--07" / "part-1-0", (1_000.0, 1_000.0))
    # timed from outside: the file the check reads, not the in-progress one
    assert result_times(tmp_path, flink_runner.RESULT_FILES) == (1_000.0, 1_000.0)
    assert str(table["price"][0].as_py()) == "908.000"
    assert table["date_time"][0].as_py().microsecond == 5_000


def test_every_run_spans_a_minute_of_event_time_so_spark_closes_windows_too():
    small, large = runner.spec_for(200_000), runner.spec_for(10_000_000)
    assert small.events / small.events_per_second >= 60
    assert (small.events_per_file, large.events_per_file) == (10_000, 100_000)
    assert large.events_per_second == 100_000  # at most: 10 s windows of 1 M events


def test_make_bench_offers_weir_the_nexmark_rate_not_another_rows(fake_runs, monkeypatch,
                                                                    tmp_path):
    rates = []
    counted = runner._run_one

    def recording(system, query, spec, data, rate, timeout_s, warm_up=False):
        rates.append(rate)
        return counted(system, query, spec, data, rate, timeout_s, warm_up)

    monkeypatch.setattr(runner, "_run_one", recording)
    monkeypatch.setattr(bench_main, "_machine", lambda: {"cores": 2})
    bench_main.main([*_ALL_BUT_NEXMARK, "--nexmark-events", "1000", "--nexmark-queries", "q1",
                     "--nexmark-rate", "1234567", "--event-time-rate", "7",
                     "--out", str(tmp_path)])
    assert rates and set(rates) == {1_234_567.0}


def test_spark_ss_results_are_read_back_from_the_files_its_batches_wrote(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench.nexmark.spark_queries import _written

    assert _written(tmp_path) is None  # no batch wrote a row
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "part-00000-x.snappy.parquet")
    pq.write_table(pa.table({"a": pa.array([], pa.int64())}), tmp_path / "part-00001-y.parquet")
    pq.write_table(pa.table({"a": [3]}), tmp_path / "part-00002-z.parquet")
    (tmp_path / "_SUCCESS").write_text("")
    assert _written(tmp_path).column("a").to_pylist() == [1, 2, 3]


def test_a_query_a_system_cannot_express_is_shown_not_run_and_is_no_failure(fake_runs):
    section = {**runner.run_nexmark(1_000, ["q9"], repeat=2), "cores": 2}
    assert [s for s, q in fake_runs] == ["weir", "weir"]  # Spark SS and Flink not started
    weir, spark, flink = section["queries"]["q9"]
    assert weir["repeats"] == 2 and "not_run" in spark and "not_run" in flink
    table = runner.render_nexmark(section)
    assert "q9 flink: not run: its SQL form" in table
    assert runner.nexmark_failed(section) == []


def test_the_wait_from_outside_is_summarised_and_shown_first(fake_runs):
    section = {**runner.run_nexmark(1_000, ["q1", "q7"], repeat=3), "cores": 2}
    weir = section["queries"]["q1"][0]
    assert weir["launch_to_last_result_s"] == 10.0  # the median of 9, 10, 11
    assert weir["spread"]["launch_to_last_result_s"] == [9.0, 11.0]
    assert weir["launch_to_first_result_s"] == 5.0
    assert weir["spread"]["launch_to_first_result_s"] == [4.5, 5.5]
    assert weir["launch_to_exit_s"] == 11.0
    assert [r["launch_to_last_result_s"] for r in weir["runs"]] == [9.0, 10.0, 11.0]
    table = runner.render_nexmark(section)
    row = table_row(table, "q1", "weir")
    assert list(row)[3:9] == ["launch→last result s", "launch→last result s min-max",
                              "launch→first result s", "launch→first result s min-max",
                              "weir ÷ Spark SS outside", "weir ÷ Flink outside"]
    assert list(row).index("launch→exit s") < list(row).index("processing span events/s")
    assert [row[k] for k in list(row)[3:11]] == ["10.0", "9.0-11.0", "5.0", "4.5-5.5",
                                                 "3.00", "2.00", "11.0", "100"]
    spark = table_row(table, "q1", "spark-structured-streaming")
    assert spark["launch→last result s"] == "30.0" and spark["weir ÷ Spark SS outside"] == ""
    q7 = table_row(table, "q7", "weir")
    assert (q7["weir ÷ Spark SS outside"], q7["weir ÷ Flink outside"]) == ("3.00", "-")
    assert "launch -> first / last result" in table  # the note on how it is taken
    assert "without their untimed warm-ups" in table.splitlines()[0]


def test_runs_without_the_figures_from_outside_render_as_dashes():
    def run(system, last=None, **more):
        figures = {} if last is None else {
            "launch_to_first_result_s": last / 2, "launch_to_last_result_s": last,
            "launch_to_exit_s": last + 1, "events_per_second_outside": 100 / last}
        return {"system": system, "correct": True, "events_per_second": 50.0,
                "detail": "exact", **figures, **more}

    weir = runner.summarize([run("weir", 4.0), run("weir"), run("weir", 6.0)])  # no output once
    assert weir["launch_to_last_result_s"] is None
    assert weir["spread"]["launch_to_last_result_s"] is None
    assert weir["spread"]["events_per_second"] == [50.0, 50.0]  # the span still summarised
    spark = runner.summarize([run("spark-structured-streaming", 8.0)])
    assert spark["launch_to_last_result_s"] == 8.0
    timed_out = {"system": "flink", "correct": False, "detail": "timed out after 600 s"}
    section = {"queries": {"q2": [weir, spark, runner.summarize([timed_out])]}, "cores": 2}
    table = runner.render_nexmark(section)
    row = table_row(table, "q2", "weir")
    assert [row[k] for k in list(row)[3:11]] == ["-"] * 8
    assert row["processing span events/s"] == "50"
    flink = table_row(table, "q2", "flink")
    assert (flink["launch→last result s"], flink["launch→exit s"]) == ("-", "-")
    assert table_row(table, "q2", "spark-structured-streaming")["launch→last result s"] == "8.0"
    assert runner.nexmark_failed(section) == ["nexmark q2 flink: timed out after 600 s"]


def test_the_runner_times_from_the_spawn_and_runs_the_peers_without_warm_up(monkeypatch):
    calls = []

    def spawn(system, argv, timeout_s, launched_at_flag=None):
        calls.append((argv, launched_at_flag))
        return {"correct": True}

    monkeypatch.setattr(runner, "run_json_subprocess", spawn)
    spec = runner.spec_for(200_000)
    runner._run_one("flink", "q1", spec, Path("/data"), 1e6, 60)
    runner._run_one("flink", "q1", spec, Path("/data"), 1e6, 60, warm_up=True)
    (quiet, flag), (warm, _) = calls
    assert flag == "--launched-at"
    assert "--no-warm-up" in quiet and "--no-warm-up" not in warm


def test_the_default_run_is_ten_million_events(monkeypatch, tmp_path, capsys):
    asked = []

    def section(events, *args, **kwargs):
        asked.append(events)
        return {"queries": {}}

    monkeypatch.setattr(nexmark_main, "run_nexmark", section)
    monkeypatch.setattr(bench_main, "run_nexmark", section)
    monkeypatch.setattr(bench_main, "_machine", lambda: {"cores": 2})
    assert nexmark_main.main(["--queries", "q1"]) == 0
    assert bench_main.main([*_ALL_BUT_NEXMARK, "--out", str(tmp_path)]) == 0
    assert asked == [10_000_000, 10_000_000]
    capsys.readouterr()
    for main in (nexmark_main.main, bench_main.main):
        with pytest.raises(SystemExit):
            main(["--help"])
        assert "2,000,000 is the quick option" in " ".join(capsys.readouterr().out.split())


def test_busy_cpus_spin_beside_every_run_and_the_table_says_so(fake_runs, monkeypatch):
    entered: list[int] = []

    class Recording:
        def __init__(self, count: int) -> None:
            self.count = count

        def __enter__(self):
            entered.append(self.count)

        def __exit__(self, *_):
            return None

    monkeypatch.setattr(runner, "BusyCpus", Recording)
    section = runner.run_nexmark(1_000, ["q1"], repeat=2, busy=2)
    assert entered == [2] * 6  # each of 3 systems x 2 runs, with the 2 processes
    assert section["busy"] == 2
    assert "2 CPU-burning processes beside every run" in runner.render_nexmark(section)
    quiet = runner.run_nexmark(1_000, ["q1"], repeat=1)
    assert "CPU-burning" not in runner.render_nexmark(quiet)

"""The scaling row of ``make bench``: ratios, the table, the JSON and ``--skip scaling``,
on made-up results (no Spark, no timing)."""

from __future__ import annotations

import json

import pytest

import bench.__main__ as bench_main
from bench.__main__ import _partition_counts, render_scaling, scaling_report


def _weir(partitions: int, eps: float, correct: bool = True) -> dict:
    return {"system": f"weir, {partitions} partitions", "events": 10_000_000,
            "events_per_second": eps, "latency_p50_ms": 900.0, "latency_p99_ms": 2_500.0,
            "peak_rss_mb": 1_000.0 * partitions, "correct": correct,
            "detail": "10000 keys, counts and sums exact" if correct else "WRONG: 3 keys missing",
            "partitions": partitions, "extra": {"partitions": partitions}}


SPARK = {"system": "spark-structured-streaming", "events": 20_000_000,
         "events_per_second": 2_000_000.0, "correct": True}


def test_each_partition_count_is_a_ratio_to_one_partition_and_to_spark():
    runs = [_weir(1, 1_000_000), _weir(2, 1_500_000), _weir(4, 1_200_000)]
    report = scaling_report(runs, [SPARK], cores=8)

    assert [r["partitions"] for r in report["runs"]] == [1, 2, 4]
    assert [r["ratio_to_1_partition"] for r in report["runs"]] == [1.0, 1.5, 1.2]
    assert [r["ratio_to_spark_streaming"] for r in report["runs"]] == [0.5, 0.75, 0.6]
    assert report["spark_streaming_events_per_second"] == 2_000_000.0
    assert report["note"] == ""  # 8 cores: 4 partitions can each have one
    assert json.loads(json.dumps(report)) == report  # goes into latest.json as it is

    lines = render_scaling(report).splitlines()
    assert lines[1].split() == ["partitions", "containers", "events", "events/s", "p99",
                                "ms", "peak", "MB", "correct", "events/s", "÷", "1",
                                "partition", "events/s", "÷", "Spark", "SS"]
    assert [line.split() for line in lines[3:6]] == [
        ["1", "2", "10,000,000", "1,000,000", "2,500", "1,000", "yes", "1.00", "0.50"],
        ["2", "3", "10,000,000", "1,500,000", "2,500", "2,000", "yes", "1.50", "0.75"],
        ["4", "5", "10,000,000", "1,200,000", "2,500", "4,000", "yes", "1.20", "0.60"],
    ]
    assert len(lines) == 6


def test_more_partitions_than_cores_is_noted():
    report = scaling_report([_weir(1, 1_000_000), _weir(4, 400_000)], [SPARK], cores=2)

    assert "2 cores" in report["note"] and "cannot add cores" in report["note"]
    assert render_scaling(report).splitlines()[-1] == f"  note: {report['note']}"
    assert scaling_report([_weir(2, 1)], [SPARK], cores=2)["note"] == ""


def test_a_wrong_run_has_no_ratio_and_its_detail_is_shown():
    runs = [_weir(1, 1_000_000), _weir(2, 3_000_000, correct=False)]
    report = scaling_report(runs, [SPARK], cores=8)

    wrong = report["runs"][1]
    assert wrong["ratio_to_1_partition"] is None
    assert wrong["ratio_to_spark_streaming"] is None
    text = render_scaling(report)
    row = text.splitlines()[4].split()
    assert row[6:] == ["NO", "-", "-"]
    assert "  2 partitions: WRONG: 3 keys missing" in text.splitlines()


def test_a_wrong_one_partition_run_gives_no_base_to_the_others():
    runs = [_weir(1, 1_000_000, correct=False), _weir(2, 1_500_000)]
    report = scaling_report(runs, [SPARK], cores=8)

    assert [r["ratio_to_1_partition"] for r in report["runs"]] == [None, None]
    assert report["runs"][1]["ratio_to_spark_streaming"] == 0.75


@pytest.mark.parametrize("results", [
    [],  # Spark Structured Streaming skipped
    [{**SPARK, "correct": False}],  # or wrong: no base to compare with
    [{"system": "weir", "events_per_second": 1_800_000.0, "correct": True}],
])
def test_without_a_correct_spark_result_the_spark_ratio_is_missing(results):
    report = scaling_report([_weir(1, 1_000_000), _weir(2, 1_500_000)], results, cores=8)

    assert [r["ratio_to_spark_streaming"] for r in report["runs"]] == [None, None]
    assert [r["ratio_to_1_partition"] for r in report["runs"]] == [1.0, 1.5]
    assert report["spark_streaming_events_per_second"] is None
    text = render_scaling(report)
    assert [line.split()[-1] for line in text.splitlines()[3:5]] == ["-", "-"]
    assert "no correct Spark Structured Streaming result in this run" in text


def test_partition_counts_are_parsed_and_checked():
    assert _partition_counts("1,2,4") == [1, 2, 4]
    assert _partition_counts(" 3 ") == [3]
    for bad in ("", "0,2", "two", "1,-2"):
        with pytest.raises(SystemExit, match="--scaling-partitions"):
            _partition_counts(bad)


_ALL_BUT_SCALING = ["--skip", "weir", "--skip", "weir-paced", "--skip", "weir-kafka",
                    "--skip", "bytewax", "--skip", "event-time", "--skip", "running-count",
                    "--skip", "startup", "--skip", "recovery", "--skip", "master-restart",
                    "--skip", "control-plane", "--skip", "latency", "--skip", "nexmark",
                    "--repeat", "1"]


@pytest.fixture
def fake_runs(monkeypatch):
    """``_run`` answering from made-up figures; every call is recorded."""
    calls: list[tuple[str, tuple[str, ...], float | None, int]] = []
    figures = {1: 1_000_000.0, 2: 1_600_000.0, 3: 900_000.0}

    def fake_run(system, spec, timeout_s, *extra):
        calls.append((system, extra, spec.rate_per_second, spec.events))
        if system == "spark-streaming":
            return dict(SPARK)
        count = int(extra[extra.index("--partitions") + 1])
        return {**_weir(count, figures[count]), "extra": {}}

    monkeypatch.setattr(bench_main, "_run", fake_run)
    monkeypatch.setattr(bench_main, "_machine", lambda: {"cores": 2})
    return calls


def test_the_bench_runs_each_partition_count_and_writes_the_scaling_section(
        fake_runs, tmp_path, capsys):
    code = bench_main.main([*_ALL_BUT_SCALING, "--scaling-partitions", "1,2,3",
                            "--scaling-events", "1000", "--max-rate", "5000",
                            "--out", str(tmp_path)])

    assert code == 0
    assert [(system, extra[-2:], rate, events) for system, extra, rate, events in fake_runs
            if system == "weir"] == [("weir", ("--partitions", str(n)), 5000.0, 1000)
                                     for n in (1, 2, 3)]
    scaling = json.loads((tmp_path / "latest.json").read_text())["scaling"]
    assert [r["partitions"] for r in scaling["runs"]] == [1, 2, 3]
    assert [r["ratio_to_1_partition"] for r in scaling["runs"]] == [1.0, 1.6, 0.9]
    assert [r["ratio_to_spark_streaming"] for r in scaling["runs"]] == [0.5, 0.8, 0.45]
    assert [r["extra"]["offered_events_per_second"] for r in scaling["runs"]] == [5000.0] * 3
    assert "cannot add cores" in scaling["note"]
    out = capsys.readouterr().out
    assert "scaling: the aggregation as N partitions" in out
    assert "scaling: the aggregation as N partitions" in (tmp_path / "latest.txt").read_text()


def test_skip_scaling_runs_no_partitioned_job(fake_runs, tmp_path, capsys):
    assert bench_main.main([*_ALL_BUT_SCALING, "--skip", "scaling",
                            "--out", str(tmp_path)]) == 0

    assert [system for system, *_ in fake_runs] == ["spark-streaming"]
    assert "scaling" not in json.loads((tmp_path / "latest.json").read_text())
    assert "scaling:" not in capsys.readouterr().out

"""One Nexmark query on Weir end to end: the files written, a real master with two
container processes and Spark running q2 (``SparkSql``), the output checked exactly
against the reference, the run timed from outside as ``one`` does. Small Spark settings;
no timing threshold asserted, only the figures' order."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench.nexmark import one, weir_queries
from bench.nexmark.generator import write_files
from bench.nexmark.model import NexmarkSpec
from bench.nexmark.reference import answer, read_events

SMALL_SPARK = {"SPARK_MASTER": "local[1]", "SPARK_SHUFFLE_PARTITIONS": 1,
               "SPARK_DRIVER_MEMORY": "1g", "SPARK_WARMUP_ROWS": 1_000}


def test_q2_on_weir_equals_the_reference(tmp_path: Path) -> None:
    spec = NexmarkSpec(events=30_000, events_per_file=5_000)
    data = tmp_path / "data"
    write_files(spec, data, csv=False)
    expected = answer("q2", read_events(data), spec)
    assert expected.num_rows > 100  # the check below has rows to check

    launched = time.time()
    result = weir_queries.run("q2", spec, data, events_per_second=20_000,
                              work=tmp_path / "work", timeout_s=240, spark=SMALL_SPARK)

    assert result.detail == f"{expected.num_rows:,} rows, exact"
    assert result.correct
    assert result.seconds > 0 and result.latencies_ms  # windows timed from the master's stats
    assert result.extra["breakdown"]["jobs"] >= 1  # the SparkSql operator's cost breakdown
    outside = one._outside(result, launched, tmp_path / "work", weir_queries.OUT_DIR,
                           weir_queries.RESULT_FILES)
    first, last, exit_s = (outside[k] for k in ("launch_to_first_result_s",
                                                "launch_to_last_result_s", "launch_to_exit_s"))
    assert first is not None and last is not None and exit_s is not None
    assert 0 < first <= last <= exit_s
    assert outside["events_per_second_outside"] == round(spec.events / last, 1)
    # the start-up as the master saw it, in the order a run goes through it: the sources
    # began once every setup() was done, while the SparkSql still activated
    moments = result.extra["timeline_ms"]
    assert list(moments) == ["submitted", "container launched", "every setup() done",
                             "sources' first window began",
                             "every operator activated (Spark warm)", "first result",
                             "last result", "finished"]
    seen = list(moments.values())
    assert all(ms > 0 for ms in seen), moments
    assert seen[:3] == sorted(seen[:3]) and seen[2] <= seen[3] < seen[4]
    assert seen[4] <= seen[5] <= seen[6] <= seen[7]


@pytest.mark.parametrize("query", ["q4", "q18", "q19"])
def test_keyed_queries_on_weir_equal_the_reference(tmp_path: Path, query: str) -> None:
    """``Deduplicate`` (q18), ``TopN`` (q19) and two ``KeyedProcess`` operators (q4: the
    winning bids, then their average per category) in real containers, on event time."""
    spec = NexmarkSpec(events=30_000, events_per_file=5_000)
    data = tmp_path / "data"
    write_files(spec, data, csv=False)
    expected = answer(query, read_events(data), spec)
    assert expected.num_rows > 1

    result = weir_queries.run(query, spec, data, events_per_second=20_000,
                              work=tmp_path / "work", timeout_s=240, spark=SMALL_SPARK)

    assert result.detail == f"{expected.num_rows:,} rows, exact"
    assert result.correct
    costs = result.extra["breakdown"]  # no Spark job: the operator's thread, per window
    assert "jobs" not in costs and costs["windows"] >= 1 and costs["rows_per_window"] > 0
    assert "operator_cpu_ms" in costs and "waiting_ms" in costs

"""make bench's latency row: its events, checks, figures, table and verdict (no timing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from bench import __main__ as bench_main
from bench import latency_jobs
from bench.latency import (
    SPARK,
    WEIR,
    LatencySpec,
    check_counts,
    check_map,
    event_batch,
    expected_counts,
    figures,
    keeps_up,
    map_batch,
    map_value,
    render_latency,
)
from bench.verdict import failed_rows


def test_events_are_due_on_the_schedule_and_every_key_comes_once_per_round() -> None:
    batch = event_batch(0, 20_000, 10_000, start_ms=1_000, rate=100_000)
    assert batch.column("seq").to_pylist()[:3] == [0, 1, 2]
    created = batch.column("created_ms").to_numpy()
    assert created[0] == 1_000 and created[99] == 1_000 and created[100] == 1_001
    keys = batch.column("key").to_pylist()
    assert len(set(keys[:10_000])) == 10_000 and keys[0] == "k0000"
    values = batch.column("value").to_numpy()
    assert values.min() >= 0 and values.max() <= 99 and len(set(values.tolist())) == 100
    later = event_batch(5, 3, 10_000, start_ms=1_000, rate=100_000)
    assert later.column("key").to_pylist() == keys[5:8]


def test_the_map_is_the_same_per_batch_and_per_value() -> None:
    batch = event_batch(0, 1_000, 100, start_ms=0, rate=1_000)
    mapped = map_batch(batch)
    assert mapped.column("mapped").to_pylist() == [
        map_value(v) for v in batch.column("value").to_pylist()]
    assert mapped.column("seq").equals(batch.column("seq"))


def test_the_map_check_finds_missing_repeated_and_wrong_events() -> None:
    batch = map_batch(event_batch(0, 1_000, 100, start_ms=0, rate=1_000))
    seq, mapped = batch.column("seq").to_numpy(), batch.column("mapped").to_numpy()
    order = np.random.default_rng(1).permutation(1_000)
    assert check_map(seq[order], mapped[order], 1_000, 100)[0]
    ok, detail = check_map(seq[:-1], mapped[:-1], 1_000, 100)
    assert not ok and "1 events missing" in detail
    ok, detail = check_map(np.append(seq, 3), np.append(mapped, mapped[3]), 1_000, 100)
    assert not ok and "1 out more than once" in detail
    wrong = mapped.copy()
    wrong[7] += 1
    ok, detail = check_map(seq, wrong, 1_000, 100)
    assert not ok and "1 with a wrong value" in detail
    assert not check_map(seq, mapped, 0, 100)[0]


def _window_counts(first: int, n: int, keys: int) -> pa.Table:
    batch = pa.Table.from_batches([event_batch(first, n, keys, start_ms=0, rate=1_000)])
    out = batch.group_by("key").aggregate([("value", "count"), ("value", "sum")])
    return pa.table({"key": out["key"], "count": out["value_count"], "sum": out["value_sum"]})


def test_the_count_check_adds_windows_up_per_key() -> None:
    windows = pa.concat_tables([_window_counts(0, 700, 50), _window_counts(700, 300, 50)])
    ok, detail = check_counts(windows, 1_000, 50)
    assert ok, detail
    assert sum(c for c, _ in expected_counts(1_000, 50).values()) == 1_000
    ok, detail = check_counts(_window_counts(0, 700, 50), 1_000, 50)
    assert not ok and "700 events counted of 1000" in detail


def test_figures_leave_the_warm_up_out() -> None:
    created = np.array([0, 50, 1_000, 1_100, 1_200], np.int64)
    arrival = created + np.array([900, 900, 10, 20, 30])
    got = figures(created, arrival, np.array([5, 5, 10, 10, 10]), boundary_ms=500)
    assert got["results_measured"] == 3 and got["latency_max_ms"] == 30
    assert got["latency_p50_ms"] == 20 and got["latency_p99_ms"] == 30
    assert got["events_per_second"] == round(30 * 1000 / (1_230 - 500))
    assert figures(created, arrival, np.ones(5), boundary_ms=10_000)["latency_p99_ms"] == 0


def test_a_trigger_is_kept_up_when_few_batches_fall_behind() -> None:
    assert keeps_up(100, [90] * 19 + [150])
    assert not keeps_up(100, [90] * 8 + [150] * 2 + [160])
    assert not keeps_up(100, [])


def test_the_paced_source_emits_what_is_due_stamped_with_its_due_time(monkeypatch,
                                                                      tmp_path) -> None:
    clock = [10_000]
    monkeypatch.setattr(latency_jobs, "_now_ms", lambda: clock[0])
    source = latency_jobs.PacedEvents(rate=1_000, keys=10, total=25, log=str(tmp_path / "log"))
    out: list[pa.RecordBatch] = []
    source.connect_outputs(lambda port, batch: out.append(batch))
    source.begin_window(7)
    assert source.emit_tuples() and out[-1].num_rows == 1  # event 0, due at the start
    clock[0] += 9
    assert source.emit_tuples() and out[-1].column("created_ms").to_pylist() == list(
        range(10_001, 10_010))
    clock[0] += 100
    assert not source.emit_tuples() and source.emitted == 25
    source.end_window()
    assert (tmp_path / "log").read_text() == "7 0 25 10024 10000\n"


def _summary(system: str, job: str, p99s: list[float], correct: bool = True,
             trigger: int = 0) -> dict:
    runs = [{"latency_p99_ms": p, "events_per_second": 100_000} for p in p99s]
    return {"system": system, "job": job, "repeats": len(p99s), "correct": correct,
            "events_per_second": 100_000, "latency_p50_ms": 10, "latency_p99_ms":
            sorted(p99s)[len(p99s) // 2], "latency_max_ms": max(p99s),
            "spread": {"latency_p99_ms": [min(p99s), max(p99s)]}, "runs": runs,
            "detail": "" if correct else "WRONG: 3 events missing",
            "extra": {"trigger_ms": trigger} if system == SPARK else {"window_ms": 100}}


def test_the_table_shows_ratio_spread_trigger_and_goal_runs() -> None:
    text = render_latency([_summary(WEIR, "map", [20, 30, 120]),
                           _summary(SPARK, "map", [400, 500, 600], trigger=500),
                           _summary(WEIR, "count", [200, 200, 100]),
                           _summary(SPARK, "count", [150, 1000, 1000], trigger=200)])
    rows = {tuple(line.split()[:2]): line for line in text.splitlines()
            if line.split()[:1] in (["map"], ["count"])}
    assert "trigger 500 ms" in rows[("map", SPARK)] and "window 100 ms" in rows[("map", WEIR)]
    assert "20-120" in rows[("map", WEIR)] and "0.06" in rows[("map", WEIR)]
    assert rows[("map", WEIR)].endswith("2 of 3")  # 120 ms misses the 100 ms goal
    assert rows[("count", WEIR)].endswith("2 of 3")  # 200 ms, but over Spark SS's 150
    assert rows[("count", SPARK)].rstrip().endswith("-")


def test_a_wrong_latency_run_is_printed_as_failed_and_fails_make_bench(monkeypatch, tmp_path,
                                                                       capsys) -> None:
    def fake_run(system, spec, timeout_s, *extra):
        if "--probe" in extra:
            return {"system": SPARK, "trigger_ms": 200, "probes": []}
        spec = LatencySpec.from_json(extra[extra.index("--latency-spec") + 1])
        wrong = system == WEIR and spec.job == "count"
        return {**_summary(system, spec.job, [50.0], correct=not wrong,
                           trigger=spec.trigger_ms), "repeats": 1}

    monkeypatch.setattr(bench_main, "_run", fake_run)
    monkeypatch.setattr(bench_main, "_machine", lambda: {"cores": 2})
    skip = [f"--skip={row}" for row in (
        "weir", "weir-paced", "spark-streaming", "event-time", "running-count", "weir-kafka",
        "bytewax", "scaling", "startup", "recovery", "master-restart", "control-plane",
        "nexmark")]
    status = bench_main.main(["--repeat", "2", "--out", str(tmp_path), *skip])
    out = capsys.readouterr().out
    assert status == 1
    assert f"FAILED latency count {WEIR}: WRONG: 3 events missing" in out
    assert f"FAILED latency map {WEIR}" not in out and "trigger 200 ms" in out


@pytest.mark.parametrize("job", ["map", "count"])
def test_the_weir_dag_puts_the_source_alone_in_container_0(job: str, tmp_path) -> None:
    dag = latency_jobs.build_dag(LatencySpec(job=job), tmp_path)
    descriptor = dag.to_descriptor()
    assert descriptor is not None
    assert failed_rows({"latency": [_summary(WEIR, job, [1.0])]}) == []


def test_weirs_count_runs_on_the_smallest_application_window_that_keeps_up() -> None:
    """Weir's counterpart of Spark SS's trigger probe: 100 ms streaming windows, counted
    over the smallest number of them per Spark job at which the rate is sustained."""
    from types import SimpleNamespace

    from bench.latency import latency_jobs as jobs_of

    seen: list[tuple[str, int]] = []

    def fake_run(system, shown, timeout_s, *extra):
        if "--probe" in extra:
            return {"system": SPARK, "trigger_ms": 500, "probes": []}
        spec = LatencySpec.from_json(extra[extra.index("--latency-spec") + 1])
        seen.append((spec.job, spec.app_windows))
        rate = 100_000 if spec.app_windows >= 4 else 40_000
        return {"system": system, "correct": True, "events_per_second": rate}

    jobs = dict(jobs_of(SimpleNamespace(latency_seconds=30.0, timeout=60.0), fake_run))
    assert seen == [("count", 1), ("count", 2), ("count", 4)]  # the probe stops at 4
    jobs[f"{WEIR} count"]()
    jobs[f"{WEIR} map"]()
    assert seen[-2:] == [("count", 4), ("map", 1)]
    dag = latency_jobs.build_dag(LatencySpec(job="count", app_windows=3), Path("/tmp"))
    aggregate = next(o for o in dag.to_descriptor().operators if o.name == "aggregate")
    assert aggregate.attributes["APPLICATION_WINDOW_COUNT"] == "3"

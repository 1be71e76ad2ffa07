"""make bench's repeated runs: medians with their spread, ratios to Spark SS, no hidden failures."""

from __future__ import annotations

from bench.__main__ import SPARK_STREAMING, render, summarize


def run(system: str, eps: float, p99: float, correct: bool = True) -> dict:
    return {"system": system, "events": 100, "events_per_second": eps, "latency_p50_ms": p99 / 2,
            "latency_p99_ms": p99, "correct": correct, "detail": "" if correct else "WRONG: x",
            "peak_rss_mb": eps / 10}


def test_repeats_give_the_median_and_the_spread() -> None:
    summary = summarize([run("weir", 30, 900), run("weir", 10, 300), run("weir", 20, 600)])
    assert summary["repeats"] == 3
    assert summary["events_per_second"] == 20 and summary["latency_p99_ms"] == 600
    assert summary["spread"]["events_per_second"] == [10, 30]
    assert summary["peak_rss_mb"] == 3  # the worst run's memory, not the median's
    assert [r["events_per_second"] for r in summary["runs"]] == [30, 10, 20]


def test_an_even_count_takes_the_middle_two() -> None:
    assert summarize([run("weir", 10, 100), run("weir", 20, 300)])["events_per_second"] == 15


def test_one_wrong_run_makes_the_result_wrong() -> None:
    summary = summarize([run("weir", 30, 900), run("weir", 10, 300, correct=False)])
    assert not summary["correct"] and summary["detail"] == "WRONG: x"


def test_the_table_shows_ratios_to_spark_streaming() -> None:
    results = [summarize([run("weir", 30, 300), run("weir", 36, 600)]),
               summarize([run(SPARK_STREAMING, 20, 600), run(SPARK_STREAMING, 30, 600)])]
    lines = render(results).splitlines()
    weir = lines[2].split()
    assert weir[0] == "weir" and weir[2] == "2" and weir[3] == "33" and weir[4] == "30-36"
    assert weir[-2:] == ["1.32", "0.75"]  # 33 / 25 events/s, 450 / 600 ms
    assert lines[3].split()[-2:] == ["1.00", "1.00"]


def test_a_failed_or_wrong_row_is_reported_and_makes_make_bench_fail(monkeypatch, tmp_path,
                                                                     capsys) -> None:
    import bench.__main__ as bench_main

    def fake_run(system, spec, timeout_s, *extra):
        if system == "recovery":  # the warm spare of issue 30: never ready
            return ({"error": "no window was committed (or no spare became ready)"}
                    if "--spares" in extra else
                    {"killed": "c1", "moved_to": "c3 (a new container)",
                     "seconds_until_windows_move_again": 11.5, "windows_replayed": 4,
                     "final_state": "FINISHED", "every_event_counted_at_least_once": True})
        return run(system, 10, 100, correct=system != "spark-streaming")

    monkeypatch.setattr(bench_main, "_run", fake_run)
    monkeypatch.setattr(bench_main, "_machine", lambda: {"cores": 2})
    skip = [f"--skip={row}" for row in ("event-time", "running-count", "weir-kafka",
                                         "bytewax", "scaling", "startup", "master-restart",
                                         "control-plane", "latency", "nexmark")]
    status = bench_main.main(["--repeat", "1", "--out", str(tmp_path), *skip])
    out = capsys.readouterr().out
    assert status == 1
    assert "FAILED spark-streaming: WRONG: x" in out
    assert "FAILED recovery: no window was committed (or no spare became ready)" in out
    assert "FAILED recovery without spare" not in out
    assert out.index("FAILED") > out.index("wrote ")  # after everything else was printed


def test_recovery_runs_give_the_median_and_spread_and_a_failed_run_fails_the_row() -> None:
    from bench.__main__ import summarize_recovery
    from bench.verdict import failed_rows

    def recovery(seconds, **extra):
        return {"seconds_until_windows_move_again": seconds, "final_state": "FINISHED",
                "every_event_counted_at_least_once": True, **extra}

    row = summarize_recovery([recovery(0.9), recovery(2.5), recovery(0.7)])
    assert row["seconds_until_windows_move_again"] == 0.9 and row["repeats"] == 3
    assert row["spread"]["seconds_until_windows_move_again"] == [0.7, 2.5]
    assert failed_rows({"recovery": row}) == []
    row = summarize_recovery([recovery(0.9),
                              recovery(0.8, every_event_counted_at_least_once=False)])
    assert failed_rows({"recovery": row}) == ["recovery: not every event was counted"]


def test_a_failed_recovery_on_ray_fails_the_bench():
    from bench.verdict import failed_rows

    ok = {"final_state": "FINISHED", "every_event_counted_at_least_once": True,
          "seconds_until_windows_move_again": 3.8}
    assert failed_rows({"recovery_on_ray": {"runs": [ok, ok]}}) == []
    assert failed_rows({"recovery_on_ray": {"runs": [ok, {"error": "no spare"}]}}) == [
        "recovery on ray: no spare"]


def test_rows_that_measured_nothing_or_missed_their_target_fail_by_name():
    from bench.verdict import failed_rows

    ok = {"final_state": "FINISHED", "every_event_counted_at_least_once": True,
          "seconds_until_windows_move_again": 0.8, "failure_count": 1}
    missed_kill = {**ok, "seconds_until_windows_move_again": -0.0, "failure_count": 0}
    assert failed_rows({"recovery_on_ray": {"runs": [ok, ok]}}) == []
    [why] = failed_rows({"recovery_on_ray": {"runs": [missed_kill, ok]}})
    assert why.startswith("recovery on ray: the kill missed") and "measured nothing" in why
    rows = [{"system": "weir-kafka", "events": 1_000, "events_per_second": 240_000.0,
             "correct": True},
            {"system": "kafka-consumer-ceiling", "events": 1_000,
             "events_per_second": 232_000.0, "correct": True}]
    assert failed_rows({"results": rows}) == [
        "kafka-consumer-ceiling: the ceiling (232,000 events/s) is below the system it "
        "bounds (weir-kafka, 240,000 events/s): no ceiling in this run"]
    rows[1]["events_per_second"] = 400_000.0
    assert failed_rows({"results": rows}) == []
    assert failed_rows({"results": [{"system": "weir", "events": 0, "events_per_second": 0,
                                     "correct": True}]}) == [
        "weir: it measured nothing: 0 events at 0 events/s"]
    plane = {"meets_targets": False, "rtt_p99_ms": 1452.0, "heartbeats_per_s": 846.0,
             "target_heartbeats_per_s": 1000.0, "false_losses": 0, "operators_not_active": 0,
             "rpc_errors_measured": 0}
    assert failed_rows({"control_plane": plane}) == [
        "control plane: targets NOT met: round trip p99 1452.0 ms (target < 100 ms); 846.0 "
        "heartbeats/s of 1000.0 targeted"]
    assert failed_rows({"control_plane": {**plane, "meets_targets": True}}) == []


def test_missed_targets_are_listed_with_the_readmes_claim_beside_them(tmp_path) -> None:
    from bench.claims import missed_targets, readme_ratios

    readme = tmp_path / "README.md"
    readme.write_text("| query | Weir | Spark SS | ratio |\n|---|---|---|---|\n"
                      "| q7 highest bid (tumbling) | 8.9 s | 16.5 s | **1.85×** |\n")
    assert readme_ratios(readme) == {"q7": "1.85×"}

    def query(weir_s, spark_s):
        return [{"system": "weir", "correct": True, "launch_to_last_result_s": weir_s},
                {"system": "spark-structured-streaming", "correct": True,
                 "launch_to_last_result_s": spark_s}]

    report = {"nexmark": {"queries": {"q7": query(20.0, 16.0), "q1": query(10.0, 12.0),
                                      "q5": query(30.0, 15.0)}},
              "control_plane": {"meets_targets": False, "rtt_p99_ms": 1452.0,
                                "heartbeats_per_s": 846.0, "target_heartbeats_per_s": 1000.0}}
    missed = missed_targets(report, readme)
    assert missed[0] == ("nexmark q7: Weir 0.80x Spark SS from launch to last result (20.0 s "
                         "against 16.0 s; target: ahead) - README claims 1.85×")
    assert missed[1].startswith("nexmark q5: Weir 0.50x") and "no figure for it" in missed[1]
    assert missed[2].startswith("control plane: round trip p99 1452.0 ms")
    assert len(missed) == 3  # q1 was ahead
    report["control_plane"]["meets_targets"] = True
    assert len(missed_targets(report, readme)) == 2


def test_the_readme_ratios_are_found_in_the_real_readme() -> None:
    """The README's performance table is what a run is compared with: if its layout
    changes so that no ratio is found, this fails instead of the bench going quiet."""
    from bench.claims import readme_ratios

    ratios = readme_ratios()
    assert {"q1", "q7"} <= set(ratios) and all(r.endswith("×") for r in ratios.values())

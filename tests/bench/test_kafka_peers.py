"""The Kafka row in context (the consumer ceiling, Quix Streams): their checks, their
latency, their line and table cells, and a failed run coming out as FAILED."""

from __future__ import annotations

import pytest

from bench import kafka_peers
from bench.__main__ import render
from bench.common import JobResult, JobSpec
from bench.kafka_peers import check_ceiling, render_kafka_context, window_latencies
from bench.kafka_topics import BOOTSTRAP_VARIABLE
from bench.verdict import failed_rows

EXPECTED = {"a": (2, 10), "b": (1, 5)}


def test_the_ceiling_is_correct_only_with_every_message_read_once_and_exact_totals() -> None:
    assert check_ceiling(3, EXPECTED, EXPECTED) == (True, "2 keys, counts and sums exact")
    correct, detail = check_ceiling(4, EXPECTED, EXPECTED)
    assert not correct and detail == "WRONG: read 4 messages of 3"
    correct, detail = check_ceiling(3, {"a": (2, 11), "b": (1, 5)}, EXPECTED)
    assert not correct and "1 with wrong count/sum" in detail


def test_a_window_is_out_at_the_first_commit_past_its_closing_record() -> None:
    closed = {(0, 0): (10.0, 99), (1, 0): (10.5, 40), (1, 500): (11.0, 80)}
    commits = [(10.2, {0: 50, 1: 41}), (10.8, {0: 100, 1: 41}), (11.4, {0: 100, 1: 81})]
    # (1, 0): the commit at 10.2 was seen before the window closed, so it is 10.8's
    assert window_latencies(closed, commits) == [800.0, 300.0, 400.0]
    assert window_latencies({(2, 0): (1.0, 5)}, commits) == []  # never committed: none


def result(system: str, eps: float, correct: bool = True, latencies: tuple = ()) -> dict:
    return {"system": system, "events": 1000, "events_per_second": eps, "correct": correct,
            "detail": "" if correct else "WRONG: x", "latencies_ms": list(latencies),
            "latency_p50_ms": max(latencies, default=0.0),
            "latency_p99_ms": max(latencies, default=0.0)}


def test_the_context_line_gives_weir_kafka_as_ratios_to_its_peers() -> None:
    line = render_kafka_context([
        result("weir kafka (noida-db broker)", 300_000, latencies=(900.0,)),
        result("kafka consumer ceiling (noida-db broker)", 350_000),
        result("quixstreams (noida-db broker)", 15_000, latencies=(700.0, 1200.0))])
    assert "weir kafka 300,000 events/s" in line
    assert "0.86× the ceiling of one plain confluent-kafka consumer (350,000 messages/s" in line
    assert "20.00× Quix Streams (15,000 events/s, p99 1,200 ms)" in line


def test_no_context_line_without_a_correct_weir_kafka_row_and_a_correct_peer() -> None:
    assert render_kafka_context([result("kafka consumer ceiling", 350_000)]) == ""
    assert render_kafka_context([result("weir kafka", 300_000),
                                 result("quixstreams", 1, correct=False)]) == ""


def test_the_ceiling_row_shows_no_latency_in_the_table() -> None:
    row = render([result("kafka consumer ceiling", 350_000)]).splitlines()[2].split()
    assert row[-6:-4] == ["-", "-"] and row[-1] == "-"  # p50, p99; p99 ÷ Spark SS


@pytest.mark.parametrize("run", [
    lambda spec: kafka_peers.consumer_ceiling(spec),
    lambda spec: kafka_peers.quixstreams_job(spec, work=None),  # type: ignore[arg-type]
])
def test_without_a_broker_the_rows_fail_and_say_why(run, monkeypatch) -> None:
    monkeypatch.delenv(BOOTSTRAP_VARIABLE, raising=False)
    monkeypatch.setattr("tests.kafka_broker.find_broker", lambda: None)
    row = run(JobSpec(events=10)).to_dict()
    assert not row["correct"]
    assert failed_rows({"results": [row]}) == [
        f"{row['system']}: no Kafka broker: pip install noida-db==0.2.2, or set "
        f"{BOOTSTRAP_VARIABLE}"]


def test_a_wrong_or_crashed_peer_fails_make_bench(monkeypatch, tmp_path, capsys) -> None:
    import bench.__main__ as bench_main

    def fake_run(system, spec, timeout_s, *extra):
        if system == "quixstreams":
            return JobResult("quixstreams", spec.events, 3.0, [500.0], False,
                             "WRONG: 1 keys missing").to_dict()
        if system == "kafka-consumer-ceiling":  # what _run returns for a crashed subprocess
            return {"system": system, "correct": False, "detail": "exit 1: Traceback"}
        return result(system, 10, latencies=(100.0,))

    monkeypatch.setattr(bench_main, "_run", fake_run)
    monkeypatch.setattr(bench_main, "_machine", lambda: {"cores": 2})
    skip = [f"--skip={row}" for row in ("weir", "weir-paced", "spark-streaming", "event-time",
                                         "running-count", "bytewax", "scaling", "startup",
                                         "recovery", "master-restart", "control-plane",
                                         "latency", "nexmark")]
    status = bench_main.main(["--repeat", "1", "--out", str(tmp_path), *skip])
    out = capsys.readouterr().out
    assert status == 1
    assert "FAILED quixstreams: WRONG: 1 keys missing" in out
    assert "FAILED kafka-consumer-ceiling: exit 1: Traceback" in out
    assert "FAILED weir-kafka" not in out


def test_skipping_the_kafka_row_skips_its_peers(monkeypatch, tmp_path) -> None:
    import bench.__main__ as bench_main

    calls: list[str] = []
    monkeypatch.setattr(bench_main, "_run", lambda system, *a: calls.append(system) or {
        "system": system, "correct": True})
    monkeypatch.setattr(bench_main, "_machine", lambda: {"cores": 2})
    skip = [f"--skip={row}" for row in ("weir", "weir-paced", "spark-streaming", "event-time",
                                         "running-count", "weir-kafka", "scaling", "startup",
                                         "recovery", "master-restart", "control-plane",
                                         "latency", "nexmark")]
    bench_main.main(["--repeat", "1", "--out", str(tmp_path), *skip])
    assert calls == ["bytewax"]

"""The walking skeleton end to end: word count, Spark doing the work, through both drivers
(the local runner, and a master with two container processes); in containers the
master's figures match the input too. Their durations are printed side by side at the end
of the test run (``tests/conftest.py``), apart from the start of the local runner's one
SparkSession (fixture ``local_spark``)."""

from __future__ import annotations

import collections
from typing import Any

import pytest

from tests.e2e.wordcount import (
    WORDCOUNT_DAG,
    WORDCOUNT_LINES,
    published_counts,
    words_of,
    write_wordcount_app,
)
from weir.master.client import WeirClient
from weir.operators.app import load_app

_SAMPLED = ("cpu_percent", "memory_rss_mb", "memory_mb_free", "gc_collection_count")


@pytest.mark.timed("wordcount")
def test_wordcount_matches_counter_and_master_stats_match_input(run_dag, request, tmp_path):
    if run_dag.driver == "local":
        request.getfixturevalue("local_spark")  # started once per process, timed apart
    app, lines = write_wordcount_app(tmp_path, "wordcount", WORDCOUNT_LINES, WORDCOUNT_DAG)
    words = words_of(lines)
    peak: dict[str, dict[str, float]] = collections.defaultdict(dict)

    def sample(client: WeirClient, app_id: str) -> None:
        for c in client.containers(app_id):
            for field in _SAMPLED:
                peak[c.id][field] = max(peak[c.id].get(field, 0), getattr(c, field))

    run = run_dag(load_app(app), during=sample)
    counted, rows = published_counts(tmp_path / "out")
    assert counted == collections.Counter(words)
    if run.driver == "containers":
        _the_master_counted_the_input(run, len(lines), len(words), rows, peak)


def _the_master_counted_the_input(run: Any, lines: int, words: int, rows: int,
                                  peak: dict[str, dict[str, float]]) -> None:
    with WeirClient(run.master.address) as client:
        operators = {op.name: op for op in client.operators(run.app_id)}
        containers = client.containers(run.app_id)
    assert operators["source"].total_tuples_emitted == lines
    assert operators["tokenize"].total_tuples_processed == lines
    assert operators["tokenize"].total_tuples_emitted == words
    assert operators["count"].total_tuples_processed == words
    assert operators["files"].total_tuples_processed == rows
    assert all(op.state == "SHUTDOWN" for op in operators.values())
    assert operators["source"].container_id != operators["files"].container_id

    assert len(containers) == 2
    for c in containers:
        assert c.heartbeats > 0, c
        assert c.process_name.split("@")[0].isdigit(), c
        for field in _SAMPLED:
            assert peak[c.id][field] > 0, (c.id, field, peak[c.id])

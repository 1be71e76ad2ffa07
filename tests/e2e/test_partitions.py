"""Static partitions end to end: a word count whose source reads its file as 2 partitions
(byte ranges), each tokenized by its parallel partition, and whose Spark counter runs as 3
partitions over 3 containers (each fed its share of the words by a unifier of the 2
tokenizers, a unifier adding the partial counts up in front of the sink) publishes
exactly Python's counts."""

from __future__ import annotations

import collections
from typing import Any

from tests.e2e.wordcount import published_counts, words_of, write_wordcount_app
from weir.master.client import WeirClient
from weir.operators.app import load_app

LINES = 2_000


def test_three_partitions_of_a_spark_counter_over_three_containers_equal_the_reference(
        run_dag, tmp_path):
    """Through both drivers: the local runner runs each operator as one instance (its
    result is a partitioned operator's with its unifier); in containers the master's
    figures show the partitions, unifiers and placement."""
    app, lines = write_wordcount_app(
        tmp_path, "partitioned", LINES,
        'CONTAINERS=3, STREAMING_WINDOW_SIZE_MILLIS=300, HEARTBEAT_INTERVAL_MILLIS=200, '
        'SPARK_MASTER="local[1]", SPARK_SHUFFLE_PARTITIONS=1, SPARK_WARMUP_ROWS=0',
        count='PARTITIONS=3, PARTITION_KEY="word", APPLICATION_WINDOW_COUNT=2',
        lines_per_window=500, pinned=False, source=", PARTITIONS=2",
        tokenize=", PARALLEL_PARTITION=True")
    words = words_of(lines)
    run = run_dag(load_app(app))
    counted, rows = published_counts(tmp_path / "out")
    assert counted == collections.Counter(words)
    if run.driver == "containers":
        _the_master_shows_the_partitions(run, len(words), rows)


def _the_master_shows_the_partitions(run: Any, words: int, rows: int) -> None:
    with WeirClient(run.master.address) as client:
        info = client.application(run.app_id)
        operators = {op.name: op for op in client.operators(run.app_id)}
    logical = {op.name: op for op in info.logical_operators}
    partitions = [operators[f"count#{i}"] for i in range(3)]
    assert len({op.container_id for op in partitions}) == 3
    assert all(op.logical_name == "count" for op in partitions)
    # every word went to exactly one partition, and each partition had a share
    assert sum(op.total_tuples_processed for op in partitions) == words
    assert all(op.total_tuples_processed > words / 6 for op in partitions)
    assert logical["count"].total_tuples_processed == words
    assert sorted(logical["count"].partition_ids) == sorted(op.id for op in partitions)
    sources = [operators[f"source#{i}"] for i in range(2)]
    assert all(op.total_tuples_emitted > LINES / 4 for op in sources)
    assert sum(op.total_tuples_emitted for op in sources) == LINES
    assert [op.name for op in operators.values() if op.name.startswith("tokenize#unifier")] \
        == [f"tokenize#unifier@count#{i}.input" for i in range(3)]
    unifier = operators["count#unifier"]
    assert unifier.container_id == operators["files"].container_id
    assert unifier.total_tuples_processed == sum(op.total_tuples_emitted for op in partitions)
    assert operators["files"].total_tuples_processed == rows
    assert all(op.state == "SHUTDOWN" for op in operators.values())
    # nothing was lost on the way: three Spark JVMs warming up at once on two cores are
    # slow, but no operator may be blamed for the wait (it once was, and recovered)
    assert all(op.failure_count == 0 for op in operators.values()), \
        {op.name: op.failure_count for op in operators.values()}
    assert not info.last_recovery, info.last_recovery

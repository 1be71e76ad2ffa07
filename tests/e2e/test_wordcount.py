"""The walking skeleton end to end: word count over two containers, Spark doing the work."""

from __future__ import annotations

import collections
import time

import pytest

from master.client import WeirClient
from operators.app import load_app
from tests.e2e.conftest import container_logs
from tests.e2e.wordcount import (
    WORDCOUNT_DAG,
    WORDCOUNT_LINES,
    published_counts,
    words_of,
    write_wordcount_app,
)


@pytest.mark.timed("wordcount", "real processes")  # beside the local runner's (tests/conftest)
def test_wordcount_matches_counter_and_master_stats_match_input(master, tmp_path):
    app, lines = write_wordcount_app(tmp_path, "wordcount", WORDCOUNT_LINES, WORDCOUNT_DAG)
    words = words_of(lines)
    expected = collections.Counter(words)

    peak: dict[str, dict[str, float]] = collections.defaultdict(dict)
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        deadline = time.monotonic() + 240
        while (info := client.application(app_id)).state in ("ACCEPTED", "RUNNING"):
            assert time.monotonic() < deadline, "wordcount did not finish in 240 s\n" + \
                container_logs(master)
            for c in client.containers(app_id):
                for field in ("cpu_percent", "memory_rss_mb", "memory_mb_free",
                              "gc_collection_count"):
                    peak[c.id][field] = max(peak[c.id].get(field, 0), getattr(c, field))
            time.sleep(0.2)
        assert info.state == "FINISHED", f"{info.diagnostics}\n{container_logs(master)}"
        operators = {op.name: op for op in client.operators(app_id)}
        containers = client.containers(app_id)

    counted, rows = published_counts(tmp_path / "out")
    assert counted == expected

    assert operators["source"].total_tuples_emitted == len(lines)
    assert operators["tokenize"].total_tuples_processed == len(lines)
    assert operators["tokenize"].total_tuples_emitted == len(words)
    assert operators["count"].total_tuples_processed == len(words)
    assert operators["files"].total_tuples_processed == rows
    assert all(op.state == "SHUTDOWN" for op in operators.values())
    assert operators["source"].container_id != operators["files"].container_id

    assert len(containers) == 2
    for c in containers:
        assert c.heartbeats > 0, c
        assert c.process_name.split("@")[0].isdigit(), c
        assert peak[c.id]["cpu_percent"] > 0, (c.id, peak[c.id])
        assert peak[c.id]["memory_rss_mb"] > 0, (c.id, peak[c.id])
        assert peak[c.id]["memory_mb_free"] > 0, (c.id, peak[c.id])
        assert peak[c.id]["gc_collection_count"] > 0, (c.id, peak[c.id])

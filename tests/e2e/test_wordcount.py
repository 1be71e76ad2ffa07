"""The walking skeleton end to end: word count over two containers, Spark doing the work."""

from __future__ import annotations

import collections
import json
import pydoc_data.topics
import re
import textwrap
import time

from master.client import WeirClient
from operators.app import load_app
from tests.e2e.conftest import container_logs

LINES = 3_000


def write_app(tmp_path) -> tuple[str, list[str]]:
    text = "\n".join(pydoc_data.topics.topics.values()).splitlines()[:LINES]
    (tmp_path / "text.txt").write_text("\n".join(text) + "\n")
    app = tmp_path / "wordcount_app.py"
    app.write_text(textwrap.dedent(f"""
        from operators import Dag
        from operators.library import FileSink, TextFileSource, Tokenize, WindowedCount

        dag = Dag("wordcount", CONTAINERS=2, STREAMING_WINDOW_SIZE_MILLIS=200,
                  HEARTBEAT_INTERVAL_MILLIS=200, SPARK_MASTER="local[1]",
                  SPARK_SHUFFLE_PARTITIONS=1, SPARK_WARMUP_ROWS=1000)
        source = dag.add_operator("source", TextFileSource({str(tmp_path / 'text.txt')!r},
                                                             lines_per_window=600), CONTAINER=0)
        tokenize = dag.add_operator("tokenize", Tokenize(), CONTAINER=0)
        count = dag.add_operator("count", WindowedCount(key="word"), CONTAINER=0,
                                 APPLICATION_WINDOW_COUNT=2)
        files = dag.add_operator("files", FileSink({str(tmp_path / 'out')!r}), CONTAINER=1)
        dag.add_stream("lines", source.output, tokenize.input)
        dag.add_stream("words", tokenize.output, count.input)
        dag.add_stream("counts", count.output, files.input)
    """))
    return str(app), text


def test_wordcount_matches_counter_and_master_stats_match_input(master, tmp_path):
    app, lines = write_app(tmp_path)
    words = re.findall(r"[a-z]+", "\n".join(lines).lower())
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

    counted: collections.Counter[str] = collections.Counter()
    rows = 0
    for file in sorted((tmp_path / "out").glob("*.jsonl")):
        for line in file.read_text().splitlines():
            row = json.loads(line)
            counted[row["word"]] += row["count"]
            rows += 1
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

"""The word-count application several end-to-end tests run, and how they read its output."""

from __future__ import annotations

import collections
import json
import pydoc_data.topics
import re
import textwrap
from pathlib import Path

WORDCOUNT_LINES = 3_000
"""Lines of the word-count test (through real processes, and with the local runner)."""
WORDCOUNT_DAG = ('CONTAINERS=2, STREAMING_WINDOW_SIZE_MILLIS=200, HEARTBEAT_INTERVAL_MILLIS=200, '
                 'SPARK_MASTER="local[1]", SPARK_SHUFFLE_PARTITIONS=1, SPARK_WARMUP_ROWS=0')
"""Its ``Dag(...)`` keyword arguments."""


def write_wordcount_app(tmp_path: Path, name: str, lines: int, dag: str,
                        count: str = "APPLICATION_WINDOW_COUNT=2",
                        lines_per_window: int = 600, pinned: bool = True,
                        source: str = "", tokenize: str = "") -> tuple[str, list[str]]:
    """TextFileSource → Tokenize → WindowedCount → FileSink over Python's own docs.

    Args:
        dag: the ``Dag(...)`` keyword arguments, as code.
        count: extra keyword arguments of the counter, as code.
        source, tokenize: extra keyword arguments of those, as code.
        pinned: source, tokenizer and counter in container 0, the sink in container 1.

    Returns:
        The app file and the lines it counts.
    """
    text = "\n".join(pydoc_data.topics.topics.values()).splitlines()[:lines]
    (tmp_path / "text.txt").write_text("\n".join(text) + "\n")
    first, last = (", CONTAINER=0", ", CONTAINER=1") if pinned else ("", "")
    app = tmp_path / f"{name}_app.py"
    app.write_text(textwrap.dedent(f"""
        from weir.operators import Dag
        from weir.operators.library import FileSink, TextFileSource, Tokenize, WindowedCount

        dag = Dag({name!r}, {dag})
        source = dag.add_operator("source", TextFileSource({str(tmp_path / 'text.txt')!r},
                                  lines_per_window={lines_per_window}){first}{source})
        tokenize = dag.add_operator("tokenize", Tokenize(){first}{tokenize})
        count = dag.add_operator("count", WindowedCount(key="word"){first}, {count})
        files = dag.add_operator("files", FileSink({str(tmp_path / 'out')!r}){last})
        dag.add_stream("lines", source.output, tokenize.input)
        dag.add_stream("words", tokenize.output, count.input)
        dag.add_stream("counts", count.output, files.input)
    """))
    return str(app), text


def words_of(lines: list[str]) -> list[str]:
    """The words Tokenize finds: runs of ASCII letters after lower-casing."""
    return re.findall(r"[a-z]+", "\n".join(lines).lower())


def published_counts(out: Path) -> tuple[collections.Counter[str], int]:
    """Word counts summed over every published window file, and how many rows they hold."""
    counted: collections.Counter[str] = collections.Counter()
    rows = 0
    for file in sorted(out.glob("*.jsonl")):
        for line in file.read_text().splitlines():
            row = json.loads(line)
            counted[row["word"]] += row["count"]
            rows += 1
    return counted, rows

"""Word count over the help text every Python installation ships, with Spark doing the work.

    make run                       # or: weir run examples/wordcount.py

source (reads the text, 1,000 lines per 500 ms window)
  -> tokenize (Spark: lower-case, split on non-letters)
  -> count    (Spark: words per window)
  -> console  (prints each window's top words and, at the end, the top words overall)
  -> files    (JSON lines per window under out/wordcount/)
"""

import pydoc_data.topics
from pathlib import Path

from weir.operators import Dag
from weir.operators.library import ConsoleSink, FileSink, TextFileSource, Tokenize, WindowedCount

# pydoc_data/topics.py holds the help text as Python string literals; write the text
# itself out, so the words counted are English, not escape sequences.
TEXT = Path("out/pydoc-topics.txt")
TEXT.parent.mkdir(parents=True, exist_ok=True)
TEXT.write_text("\n".join(pydoc_data.topics.topics.values()), encoding="utf-8")

dag = Dag("wordcount", STREAMING_WINDOW_SIZE_MILLIS=500, CONTAINERS=2)
source = dag.add_operator("source", TextFileSource(str(TEXT.resolve()), lines_per_window=1_000),
                          CONTAINER=0)
tokenize = dag.add_operator("tokenize", Tokenize(column="line", output_column="word"),
                            CONTAINER=0)
count = dag.add_operator("count", WindowedCount(key="word"), CONTAINER=0,
                         APPLICATION_WINDOW_COUNT=2)
console = dag.add_operator(
    "console",
    ConsoleSink(limit=5, sort_by="count", title="top words", summarize=("word", "count")),
    CONTAINER=1,
)
files = dag.add_operator("files", FileSink("out/wordcount", format="jsonl"), CONTAINER=1)

dag.add_stream("lines", source.output, tokenize.input)
dag.add_stream("words", tokenize.output, count.input)
dag.add_stream("counts", count.output, console.input, files.input)

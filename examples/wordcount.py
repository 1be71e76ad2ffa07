"""Word count over the help text every Python installation ships, with Spark doing the work.

    make run                       # or: weir run examples/wordcount.py

source (reads the text, a few hundred lines per 500 ms window)
  -> tokenize (Spark: lower-case, split on non-letters)
  -> count    (Spark: words per window)
  -> console  (prints each window's top words and, at the end, the top words overall)
  -> files    (JSON lines per window under out/wordcount/)
"""

import pydoc_data.topics

from operators import Dag
from operators.library import ConsoleSink, FileSink, TextFileSource, Tokenize, WindowedCount

TEXT = pydoc_data.topics.__file__

dag = Dag("wordcount", STREAMING_WINDOW_SIZE_MILLIS=500, CONTAINERS=2)
source = dag.add_operator("source", TextFileSource(TEXT, lines_per_window=2_000))
tokenize = dag.add_operator("tokenize", Tokenize(column="line", output_column="word"))
count = dag.add_operator("count", WindowedCount(key="word"), APPLICATION_WINDOW_COUNT=2)
console = dag.add_operator(
    "console",
    ConsoleSink(limit=5, sort_by="count", title="top words", summarize=("word", "count")),
    CONTAINER=1,
)
files = dag.add_operator("files", FileSink("out/wordcount", format="jsonl"), CONTAINER=1)

dag.add_stream("lines", source.output, tokenize.input)
dag.add_stream("words", tokenize.output, count.input)
dag.add_stream("counts", count.output, console.input, files.input)

"""The word count of the README's Kubernetes section: the Python help text baked into the
image (deploy/Dockerfile), counted per window by Spark in two pods, the top words printed
to the sink's pod log (`kubectl logs -n weir -l weir.dev/container=app-0001-c1`)."""

from weir.operators import Dag
from weir.operators.library import ConsoleSink, TextFileSource, Tokenize, WindowedCount

dag = Dag("wordcount", STREAMING_WINDOW_SIZE_MILLIS=500, CONTAINERS=2,
          CONTAINER_MEMORY_MB=2048, CONTAINER_CORES=1)
source = dag.add_operator("source", TextFileSource("/opt/weir/pydoc-topics.txt",
                                                   lines_per_window=1_000), CONTAINER=0)
tokenize = dag.add_operator("tokenize", Tokenize(column="line", output_column="word"),
                            CONTAINER=0)
count = dag.add_operator("count", WindowedCount(key="word"), CONTAINER=0,
                         APPLICATION_WINDOW_COUNT=2)
console = dag.add_operator("console", ConsoleSink(limit=5, sort_by="count", title="top words",
                                                  summarize=("word", "count")), CONTAINER=1)
dag.add_stream("lines", source.output, tokenize.input)
dag.add_stream("words", tokenize.output, count.input)
dag.add_stream("counts", count.output, console.input)

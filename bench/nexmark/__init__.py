"""Nexmark in ``make bench``: persons, auctions and bids from a seeded generator written
from the Nexmark specification, written once as files, and the standard queries run on
Weir, Spark Structured Streaming and Apache Flink, each output checked against a
plain reference computed from the same files (issue 32).

One job per module: ``model`` (the spec and the schemas), ``generator`` (the events and
their files), ``reference`` (the queries' answers), ``compare`` (exact checks),
``weir_queries``, ``spark_queries``, ``flink_job`` (run in its own venv) and
``flink_runner``, ``one`` (one system and query in a subprocess, timed from outside by
``bench.output_times``: its spawn to its output files' times) and ``__main__`` (the
command and the table).
"""

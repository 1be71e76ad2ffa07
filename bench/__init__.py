"""`make bench`: Weir against Spark Structured Streaming and Bytewax on one job, in one run."""

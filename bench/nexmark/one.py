"""Runs one system on one Nexmark query in this process and prints its result as JSON
(the last line): the runner starts one of these per run, so each system's whole
process tree is measured alone and nothing of one run stays for the next.

    python -m bench.nexmark.one weir q1 --data DIR --spec JSON [--launched-at EPOCH]

Besides the system's own clock (its processing span), the result carries the run timed
from outside (``bench.output_times``): from ``--launched-at`` (the runner's spawn of this
process) to the first and the last output file with rows, and to the system's run
returning, read before the work folder is removed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import psutil

from bench.common import JobResult
from bench.nexmark.model import QUERIES, NexmarkSpec
from bench.output_times import outside_figures, result_times

__all__ = ["SYSTEMS", "main"]

SYSTEMS = ("weir", "spark-structured-streaming", "flink")


def _outside(result: JobResult, launched_at: float, work: Path, out_dir: str,
             pattern: str) -> dict[str, float | None]:
    """The run's figures from outside (``bench.output_times.outside_figures``)."""
    returned_at = result.extra.pop("system_returned_at", None)
    return outside_figures(launched_at, returned_at, result_times(work / out_dir, pattern),
                           result.events)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("system", choices=SYSTEMS)
    parser.add_argument("query", choices=QUERIES)
    parser.add_argument("--data", type=Path, required=True, help="the generated files")
    parser.add_argument("--spec", required=True, help="the NexmarkSpec as JSON")
    parser.add_argument("--rate", type=float, default=2_000_000,
                        help="Weir: events/s its sources are offered")
    parser.add_argument("--files-per-trigger", type=int, default=10,
                        help="Spark Structured Streaming: maxFilesPerTrigger")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--launched-at", type=float,
                        help="epoch seconds the runner spawned this process (default: this "
                             "process's start as the kernel recorded it)")
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                        help="Spark SS and Flink: no untimed warm-up before the query (as a "
                             "user runs it; Weir runs none anyway)")
    args = parser.parse_args(argv)
    launched_at = (args.launched_at if args.launched_at is not None
                   else psutil.Process().create_time())
    spec = NexmarkSpec.from_json(args.spec)
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    work = Path(tempfile.mkdtemp(prefix=f"weir-nexmark-{args.system}-{args.query}-", dir=shm))
    try:
        if args.system == "weir":
            from bench.nexmark import weir_queries

            result = weir_queries.run(args.query, spec, args.data, args.rate, work,
                                      timeout_s=args.timeout)
            output = weir_queries.OUT_DIR, weir_queries.RESULT_FILES
        elif args.system == "flink":
            from bench.nexmark import flink_runner

            result = flink_runner.run(args.query, spec, args.data, work,
                                      timeout_s=args.timeout, warm_up=args.warm_up)
            output = flink_runner.OUT_DIR, flink_runner.RESULT_FILES
        else:
            from bench.nexmark import spark_queries

            result = spark_queries.run(args.query, spec, args.data, work,
                                       args.files_per_trigger, warm_up=args.warm_up)
            output = spark_queries.OUT_DIR, spark_queries.RESULT_FILES
        outside = _outside(result, launched_at, work, *output)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sys.stdout.flush()
    print("\n" + json.dumps({**result.to_dict(), **outside, "launched_at": launched_at}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

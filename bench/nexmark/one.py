"""Runs one system on one Nexmark query in this process and prints its result as JSON
(the last line): the runner starts one of these per run, so each system's whole
process tree is measured alone and nothing of one run stays for the next.

    python -m bench.nexmark.one weir q1 --data DIR --spec JSON
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from bench.nexmark.model import QUERIES, NexmarkSpec

__all__ = ["SYSTEMS", "main"]

SYSTEMS = ("weir", "spark-structured-streaming", "flink")


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
    args = parser.parse_args(argv)
    spec = NexmarkSpec.from_json(args.spec)
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    work = Path(tempfile.mkdtemp(prefix=f"weir-nexmark-{args.system}-{args.query}-", dir=shm))
    try:
        if args.system == "weir":
            from bench.nexmark import weir_queries

            result = weir_queries.run(args.query, spec, args.data, args.rate, work,
                                      timeout_s=args.timeout)
        elif args.system == "flink":
            from bench.nexmark import flink_runner

            result = flink_runner.run(args.query, spec, args.data, work,
                                      timeout_s=args.timeout)
        else:
            from bench.nexmark import spark_queries

            result = spark_queries.run(args.query, spec, args.data, work,
                                       args.files_per_trigger)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sys.stdout.flush()
    print("\n" + json.dumps(result.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m bench.nexmark``: the Nexmark queries on Weir, Spark Structured Streaming
and Apache Flink over the same generated events, every output checked; prints the table
and a ``FAILED`` line per failed run, and exits 1 if there is one.

    python -m bench.nexmark --events 2000000 --queries q0,q1,q2,q5,q7 --repeat 3

Each run is timed from outside (the spawn of its process to its first and last result
file, and to its run returning), as a user waits, and by the system's own clock over its
processing span.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.nexmark.model import QUERIES
from bench.nexmark.one import SYSTEMS
from bench.nexmark.runner import nexmark_failed, parse_queries, render_nexmark, run_nexmark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.nexmark", description=__doc__)
    parser.add_argument("--events", type=int, default=10_000_000,
                        help="events generated once (persons, auctions, bids); 2,000,000 is "
                             "the quick option")
    parser.add_argument("--queries", default=",".join(QUERIES),
                        help=f"comma-separated, of {','.join(QUERIES)}")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved runs per system")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated, of {','.join(SYSTEMS)}")
    parser.add_argument("--rate", type=float, default=4_000_000,
                        help="events/s offered to Weir's sources (its ceiling when above "
                             "what it sustains)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per run, seconds")
    parser.add_argument("--warm-up", action="store_true",
                        help="Spark SS and Flink first run their untimed warm-ups (off: as "
                             "their users run them; on, the figures from outside include "
                             "them)")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="N processes spinning a CPU each beside every run (a machine "
                             "also doing other work); 0 = none")
    parser.add_argument("--json", type=Path, help="also write the section as JSON here")
    args = parser.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not systems or set(systems) - set(SYSTEMS):
        raise SystemExit(f"--systems {args.systems!r}: give some of {','.join(SYSTEMS)}")
    section = run_nexmark(args.events, parse_queries(args.queries), args.repeat, systems,
                          args.rate, args.timeout, warm_up=args.warm_up, busy=args.busy)
    print(render_nexmark(section))
    if args.json:
        args.json.write_text(json.dumps(section, indent=2))
    failed = nexmark_failed(section)
    for line in failed:
        print(f"FAILED {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

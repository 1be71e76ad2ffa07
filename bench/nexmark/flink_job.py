"""One Nexmark query on Apache Flink (PyFlink's local mini-cluster), run by the Flink
venv's Python (``.venv-flink``), never imported by the project's: PyFlink pins old
apache-beam, protobuf and grpc. Standard library and pyflink only.

Reads the kinds' CSV files (Flink's built-in filesystem connector and CSV format, the
only ones offline) with ``WATERMARK FOR date_time AS date_time - <delay + 1 ms>`` (Flink
counts a window whose last millisecond equals the watermark as closed; the others
close at the end, so one more millisecond keeps the same events on time), runs the query
in streaming mode and writes its rows as CSV under ``--out``. With ``--warm``, first a
warm-up run of the same query over those files (a few thousand rows), then the timed run;
without, the timed run alone, as a user runs a query. Prints one JSON line: the timed
run's seconds (from submitting the job to its end, the mini-cluster's start included)
and the warm-up's (null: none).

    .venv-flink/bin/python bench/nexmark/flink_job.py q7 --csv DIR --out DIR \
        --spec '{"window_ms": 10000, ...}' [--warm DIR --warm-out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

_COLUMNS = {
    "person": "id BIGINT, name STRING, email_address STRING, credit_card STRING, "
              "city STRING, state STRING, date_time TIMESTAMP(3), extra STRING",
    "auction": "id BIGINT, item_name STRING, description STRING, initial_bid BIGINT, "
               "reserve BIGINT, date_time TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, "
               "category BIGINT, extra STRING",
    "bid": "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, "
           "date_time TIMESTAMP(3), extra STRING",
}

_OUTPUT = {
    "q0": "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, "
          "date_time TIMESTAMP(3), extra STRING",
    "q1": "auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), date_time TIMESTAMP(3), "
          "extra STRING",
    "q2": "auction BIGINT, price BIGINT",
    "q5": "auction BIGINT, num BIGINT, window_start TIMESTAMP(3)",
    "q7": "window_start TIMESTAMP(3), maxprice BIGINT",
    "q8": "id BIGINT, name STRING, window_start TIMESTAMP(3)",
    "q11": "bidder BIGINT, bid_count BIGINT, window_start TIMESTAMP(3), "
           "window_end TIMESTAMP(3)",
    "q3": "name STRING, city STRING, state STRING, id BIGINT",
    "q18": "bidder BIGINT, auction BIGINT, price BIGINT, date_time TIMESTAMP(3)",
    "q19": "auction BIGINT, window_start TIMESTAMP(3), rank BIGINT, price BIGINT",
    "q20": "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, "
           "date_time TIMESTAMP(3), item_name STRING, description STRING, initial_bid BIGINT, "
           "reserve BIGINT, expires TIMESTAMP(3), seller BIGINT, category BIGINT",
}

_INPUTS = {"q3": ("person", "auction"), "q8": ("person", "auction"), "q20": ("auction", "bid")}


def _seconds(ms: int) -> str:
    return f"INTERVAL '{ms / 1000:.3f}' SECOND"


def query_sql(query: str, spec: dict) -> tuple[list[str], str]:
    """The query in Flink SQL over tables ``person``, ``auction``, ``bid``: the temporary
    views it needs (``CREATE TEMPORARY VIEW ...``) and its SELECT.

    Every step is insert-only, as the filesystem sink needs: q5 is Nexmark's "counts
    joined with their maximum", with the maximum a cascaded window aggregation (a 2 s
    tumbling window over the counts' ``window_time``: one hop window each) instead of a
    plain GROUP BY, which would send updates.
    """
    size, slide = _seconds(spec["window_ms"]), _seconds(spec["slide_ms"])
    if query == "q0":
        return [], "SELECT auction, bidder, price, channel, url, date_time, extra FROM bid"
    if query == "q1":
        return [], ("SELECT auction, bidder, CAST(0.908 * price AS DECIMAL(23, 3)) AS price, "
                    "date_time, extra FROM bid")
    if query == "q2":
        return [], f"SELECT auction, price FROM bid WHERE MOD(auction, {spec['q2_modulo']}) = 0"
    if query == "q5":
        # the inner window's bounds renamed, as Flink asks of a cascaded window aggregation
        counts = ("CREATE TEMPORARY VIEW counts AS SELECT auction, COUNT(*) AS num, "
                  "window_start AS hop_start, window_end AS hop_end, window_time AS rowtime "
                  f"FROM TABLE(HOP(TABLE bid, DESCRIPTOR(date_time), {slide}, {size})) "
                  "GROUP BY auction, window_start, window_end, window_time")
        best = ("CREATE TEMPORARY VIEW best AS SELECT MAX(num) AS maxn, window_end AS ends "
                f"FROM TABLE(TUMBLE(TABLE counts, DESCRIPTOR(rowtime), {slide})) "
                "GROUP BY window_start, window_end")
        return [counts, best], (
            "SELECT C.auction, C.num, C.hop_start AS window_start FROM (SELECT auction, num, "
            "hop_start, hop_end FROM counts) C JOIN best M ON C.hop_end = M.ends "
            "WHERE C.num >= M.maxn")
    if query == "q7":
        return [], (f"SELECT window_start, MAX(price) AS maxprice FROM TABLE(TUMBLE(TABLE bid, "
                    f"DESCRIPTOR(date_time), {size})) GROUP BY window_start, window_end")
    if query == "q8":  # the union grouped per person, as on the other systems
        union = ("CREATE TEMPORARY VIEW people_and_sellers AS "
                 "SELECT id, name, date_time, 1 AS is_person FROM person UNION ALL "
                 "SELECT seller AS id, CAST(NULL AS STRING) AS name, date_time, 0 AS is_person "
                 "FROM auction")
        return [union], (
            "SELECT id, MAX(name) AS name, window_start FROM TABLE(TUMBLE(TABLE "
            f"people_and_sellers, DESCRIPTOR(date_time), {size})) GROUP BY id, window_start, "
            "window_end HAVING SUM(is_person) > 0 AND SUM(1 - is_person) > 0")
    if query == "q3":
        states = ", ".join(f"'{s}'" for s in spec["q3_states"])
        return [], ("SELECT P.name, P.city, P.state, A.id FROM auction AS A INNER JOIN person "
                    f"AS P ON A.seller = P.id WHERE A.category = {spec['category']} AND "
                    f"P.state IN ({states})")
    if query == "q18":  # keep the first row by processing time: rows only added
        return [], ("SELECT bidder, auction, price, date_time FROM (SELECT bidder, auction, "
                    "price, CAST(date_time AS TIMESTAMP(3)) AS date_time, ROW_NUMBER() OVER "
                    "(PARTITION BY bidder, auction ORDER BY pt ASC) AS rownum FROM bid) "
                    "WHERE rownum = 1")
    if query == "q19":  # window Top-N: each window's rows once, when it closes
        return [], ("SELECT auction, window_start, rownum, price FROM (SELECT auction, price, "
                    "window_start, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, "
                    "auction ORDER BY price DESC) AS rownum FROM TABLE(TUMBLE(TABLE bid, "
                    f"DESCRIPTOR(date_time), {size}))) WHERE rownum <= {spec['top_n']}")
    if query == "q20":  # a regular join; the bid's time a plain timestamp in its output
        return [], ("SELECT B.auction, B.bidder, B.price, B.channel, B.url, CAST(B.date_time "
                    "AS TIMESTAMP(3)) AS date_time, A.item_name, A.description, A.initial_bid, "
                    "A.reserve, CAST(A.expires AS TIMESTAMP(3)) AS expires, A.seller, "
                    "A.category FROM bid AS B INNER JOIN auction AS A ON B.auction = A.id "
                    f"WHERE A.category = {spec['category']}")
    if query == "q11":
        gap = _seconds(spec["session_gap_ms"])
        return [], (f"SELECT bidder, COUNT(*) AS bid_count, window_start, window_end FROM "
                    f"TABLE(SESSION(TABLE bid PARTITION BY bidder, DESCRIPTOR(date_time), "
                    f"{gap})) GROUP BY bidder, window_start, window_end")
    raise ValueError(f"unknown query {query!r}")


def _kinds(query: str) -> tuple[str, ...]:
    return _INPUTS.get(query, ("bid",))


def _quoted(columns: str) -> str:
    """A table's columns with each name quoted (``rank`` is a reserved word)."""
    return re.sub(r"(^|, )([a-z_]+) ", r"\1`\2` ", columns)


def run_once(query: str, spec: dict, csv_dir: str, out_dir: str, parallelism: int) -> float:
    """Runs the query once in a fresh table environment; the seconds it took."""
    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    config.set("parallelism.default", str(parallelism))
    # files are committed at checkpoints; the last one runs when the bounded input ends
    config.set("execution.checkpointing.interval", "10 s")
    # the joins' state outgrows the default in-memory checkpoint storage (5 MB)
    config.set("execution.checkpointing.storage", "filesystem")
    config.set("execution.checkpointing.dir", f"file://{os.getcwd()}/flink-checkpoints")
    config.set("table.exec.source.idle-timeout", "1 s")
    config.set("table.local-time-zone", "UTC")
    delay = _seconds(spec["watermark_delay_ms"] + 1)
    for kind in _kinds(query):
        columns = _COLUMNS[kind] + (", pt AS PROCTIME()" if query == "q18" else "")
        env.execute_sql(
            f"CREATE TABLE {kind} ({columns}, WATERMARK FOR date_time AS date_time - {delay})"
            f" WITH ('connector' = 'filesystem', 'path' = '{csv_dir}/{kind}', "
            "'format' = 'csv')")
    env.execute_sql(f"CREATE TABLE results ({_quoted(_OUTPUT[query])}) WITH ('connector' = "
                    f"'filesystem', 'path' = '{out_dir}', 'format' = 'csv')")
    views, select = query_sql(query, spec)
    for view in views:
        env.execute_sql(view)
    started = time.perf_counter()
    env.execute_sql(f"INSERT INTO results {select}").wait()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("query")
    parser.add_argument("--csv", required=True, help="folder with person/, auction/, bid/")
    parser.add_argument("--warm", help="the same, a few rows: a warm-up run first")
    parser.add_argument("--out", required=True, help="the timed run's output folder")
    parser.add_argument("--warm-out", help="the warm-up's output folder (with --warm)")
    parser.add_argument("--spec", required=True, help="window_ms, slide_ms, session_gap_ms, "
                        "q2_modulo, watermark_delay_ms as JSON")
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args(argv)
    spec = json.loads(args.spec)
    if args.warm and not args.warm_out:
        parser.error("--warm needs --warm-out")
    warm_s = (run_once(args.query, spec, args.warm, args.warm_out, args.parallelism)
              if args.warm else None)
    seconds = run_once(args.query, spec, args.csv, args.out, args.parallelism)
    from pyflink.version import __version__

    print(json.dumps({"seconds": seconds, "warm_up_seconds": warm_s,
                      "flink_version": __version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

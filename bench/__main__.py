"""``make bench``: every system on the same job in one run, then a table, JSON and a chart.

Each system runs in its own subprocess (``python -m bench.one SYSTEM``) while this process
samples the memory of that subprocess and everything it started; systems run one after
another, never side by side.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.claims import missed_targets
from bench.common import JobSpec, render_breakdown, render_table, run_json_subprocess
from bench.event_time import event_time_jobs, render_event_time
from bench.kafka_peers import KAFKA_PEERS, render_kafka_context
from bench.latency import latency_jobs, render_latency
from bench.nexmark.model import QUERIES as NEXMARK_QUERIES
from bench.nexmark.runner import nexmark_failed, parse_queries, render_nexmark, run_nexmark
from bench.recovery_rows import print_recovery_rows, summarize_recovery
from bench.running_count import render as render_running_count
from bench.verdict import failed_rows

_ROOT = Path(__file__).resolve().parent.parent


def _run(system: str, spec: JobSpec, timeout_s: float, *extra: str) -> dict[str, Any]:
    """One system in a subprocess; its result dict with the peak memory of its tree."""
    argv = [sys.executable, "-m", "bench.one", system, "--spec", spec.to_json(), *extra]
    print(f"  running {system} ({spec.events:,} events"
          f"{f', {spec.rate_per_second:,.0f}/s' if spec.rate_per_second else ''}) ...",
          file=sys.stderr, flush=True)
    return run_json_subprocess(system, argv, timeout_s)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One system's repeated runs as one result: the median run's figures (events/s and
    p50/p99 are each the median over the runs), the spread (min and max), and each run.

    A wrong run makes the result wrong (with that run's detail): a median never hides one.
    """
    first = runs[0]
    wrong = [r for r in runs if not r.get("correct")]
    if wrong:
        return {**wrong[0], "repeats": len(runs), "runs": runs}
    eps = [float(r.get("events_per_second", 0)) for r in runs]
    p50 = [float(r.get("latency_p50_ms", 0)) for r in runs]
    p99 = [float(r.get("latency_p99_ms", 0)) for r in runs]
    median_run = min(runs, key=lambda r: abs(float(r.get("events_per_second", 0))
                                             - statistics.median(eps)))
    return {**median_run, "system": first["system"], "repeats": len(runs),
            "events_per_second": statistics.median(eps), "latency_p50_ms": statistics.median(p50),
            "latency_p99_ms": statistics.median(p99),
            "spread": {"events_per_second": [min(eps), max(eps)],
                       "latency_p99_ms": [min(p99), max(p99)]},
            "peak_rss_mb": max(float(r.get("peak_rss_mb", 0)) for r in runs),
            "runs": [{k: r.get(k) for k in ("events_per_second", "latency_p50_ms",
                                             "latency_p99_ms", "run_seconds")}
                     for r in runs]}


def _repeated(jobs: list[tuple[str, Any]], repeat: int) -> list[dict[str, Any]]:
    """Runs each ``(name, run)`` job ``repeat`` times, interleaved (A B A B ...) so a
    machine that slows down over the run slows every system alike; one summary each."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in jobs}
    for round_ in range(repeat):
        for name, run in jobs:
            if repeat > 1:
                print(f"  [{round_ + 1}/{repeat}] {name}", file=sys.stderr, flush=True)
            runs[name].append(run())
    return [summarize(runs[name]) for name, _ in jobs]


def _machine() -> dict[str, Any]:
    import psutil

    def version(cmd: list[str]) -> str:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            return (out.stdout or out.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "?"

    import pyarrow
    import pyspark

    return {"cores": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30),
            "python": platform.python_version(), "java": version(["java", "-version"]),
            "pyspark": pyspark.__version__, "pyarrow": pyarrow.__version__,
            "platform": platform.platform()}


def _fmt(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def render(results: list[dict[str, Any]]) -> str:
    """The comparison table: medians over the repeats with their spread, and every
    system's figures as a ratio to Spark Structured Streaming's in the same run."""
    spark = next((r for r in results if r["system"] == SPARK_STREAMING and r.get("correct")),
                 None)
    headers = ["system", "events", "runs", "events/s (median)", "min-max", "p50 ms",
               "p99 ms", "peak MB", "correct", "events/s ÷ Spark SS", "p99 ÷ Spark SS"]
    rows = []
    for r in results:
        eps, p50, p99 = (r.get("events_per_second", 0), r.get("latency_p50_ms", 0),
                         r.get("latency_p99_ms", 0))
        timed = r.get("latencies_ms") != []  # e.g. the Kafka consumer ceiling: no windows
        low, high = r.get("spread", {}).get("events_per_second", [eps, eps])
        ratio = (f"{eps / spark['events_per_second']:.2f}"
                 if spark and spark.get("events_per_second") and r.get("correct") else "-")
        p99_ratio = (f"{p99 / spark['latency_p99_ms']:.2f}"
                     if spark and spark.get("latency_p99_ms") and r.get("correct") and timed
                     else "-")
        rows.append([r["system"], _fmt(r.get("events", 0)), str(r.get("repeats", 1)),
                     _fmt(eps), f"{_fmt(low)}-{_fmt(high)}",
                     *([_fmt(p50), _fmt(p99)] if timed else ["-", "-"]),
                     _fmt(r.get("peak_rss_mb", 0)), "yes" if r.get("correct") else "NO",
                     ratio, p99_ratio])
    lines = render_table(headers, rows)
    wrong = [r for r in results if not r.get("correct")]
    lines += [f"  {r['system']}: {r.get('detail', '')}" for r in wrong]
    for r in results:
        costs = r.get("extra", {}).get("breakdown")
        if costs and r.get("correct"):
            lines.append(f"  {r['system']}: {render_breakdown(costs)}")
    return "\n".join(lines)


SPARK_STREAMING = "spark-structured-streaming"
"""The ``system`` of Spark Structured Streaming's result: what speed figures are ratios to."""


def _ratio(value: float, base: float | None) -> float | None:
    return round(value / base, 2) if base else None


def scaling_report(runs: list[dict[str, Any]], results: list[dict[str, Any]],
                   cores: int | None) -> dict[str, Any]:
    """The scaling section of the JSON: each partition count's run with its ratios.

    ``runs``: the results of the scaling job, one per partition count (``extra.partitions``).
    Each gets ``partitions``, ``ratio_to_1_partition`` (events/s over the correct
    1-partition run's) and ``ratio_to_spark_streaming`` (over the correct Spark
    Structured Streaming result in ``results``, the same run's); ``None`` where the base
    is missing or wrong, and for a wrong run itself. ``note`` says why, on a machine with
    fewer cores than partitions, the row cannot show more cores at work.
    """
    def eps(r: dict[str, Any] | None) -> float | None:
        if r is None or not r.get("correct"):
            return None
        return r.get("events_per_second") or None

    rows = []
    for r in runs:
        row = dict(r)
        row["partitions"] = int(r.get("partitions") or r.get("extra", {}).get("partitions", 0))
        rows.append(row)
    one = next((r for r in rows if r["partitions"] == 1), None)
    spark = next((r for r in results if r.get("system") == SPARK_STREAMING), None)
    one_eps, spark_eps = eps(one), eps(spark)
    for row in rows:
        mine = eps(row)
        row["ratio_to_1_partition"] = _ratio(mine, one_eps) if mine else None
        row["ratio_to_spark_streaming"] = _ratio(mine, spark_eps) if mine else None
    most = max((r["partitions"] for r in rows), default=0)
    note = ""
    if cores and most > cores:
        note = (f"this machine has {cores} cores: more than {cores} partitions cannot add "
                "cores, so the row shows the cost of partitioning (hash split, more JVMs, "
                "the unifier) as much as any scaling")
    return {"cores": cores, "spark_streaming_events_per_second": spark_eps,
            "note": note, "runs": rows}


def render_scaling(scaling: dict[str, Any]) -> str:
    """The scaling table: events/s per partition count, as ratios to 1 partition and Spark."""
    headers = ["partitions", "containers", "events", "events/s", "p99 ms", "peak MB",
               "correct", "events/s ÷ 1 partition", "events/s ÷ Spark SS"]
    rows = []
    for r in scaling["runs"]:
        ratios = [f"{x:.2f}" if x is not None else "-"
                  for x in (r.get("ratio_to_1_partition"), r.get("ratio_to_spark_streaming"))]
        rows.append([str(r["partitions"]), str(r["partitions"] + 1), _fmt(r.get("events", 0)),
                     _fmt(r.get("events_per_second", 0)), _fmt(r.get("latency_p99_ms", 0)),
                     _fmt(r.get("peak_rss_mb", 0)), "yes" if r.get("correct") else "NO",
                     *ratios])
    lines = ["scaling: the aggregation as N partitions (one Spark local[1] session each, a "
             "unifier in front of the sink when N > 1)", *render_table(headers, rows)]
    lines += [f"  {r['partitions']} partitions: {r.get('detail', '')}"
              for r in scaling["runs"] if not r.get("correct")]
    if not scaling.get("spark_streaming_events_per_second"):
        lines.append("  ÷ Spark SS: no correct Spark Structured Streaming result in this run")
    if scaling.get("note"):
        lines.append(f"  note: {scaling['note']}")
    return "\n".join(lines)


def chart(results: list[dict[str, Any]], path: Path) -> bool:
    """A PNG of throughput and latency per system; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ok = [r for r in results if r.get("correct")]
    names = [r["system"] for r in ok]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.bar(names, [r["events_per_second"] / 1e6 for r in ok], color="#3a7ca5")
    left.set_ylabel("million events / s (higher is better)")
    left.set_title("Throughput")
    x = range(len(ok))
    right.bar([i - 0.2 for i in x], [r["latency_p50_ms"] for r in ok], 0.4, label="p50")
    right.bar([i + 0.2 for i in x], [r["latency_p99_ms"] for r in ok], 0.4, label="p99")
    right.set_xticks(list(x), names)
    right.set_ylabel("ms, window close to result out (lower is better)")
    right.set_title("Window latency")
    right.legend()
    for axis in (left, right):
        axis.tick_params(axis="x", labelrotation=15)
    fig.suptitle("Keyed windowed count + sum, 10,000 keys, same machine, same run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _partition_counts(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``.

    Raises:
        SystemExit: not positive whole numbers.
    """
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise SystemExit(f"--scaling-partitions {text!r}: give partition counts from 1, "
                         "comma-separated, e.g. 1,2,4")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make bench", description=__doc__)
    parser.add_argument("--events", type=int, default=20_000_000,
                        help="events for Weir and Spark Structured Streaming")
    parser.add_argument("--rate", type=float, default=1_000_000,
                        help="events/s of Weir's paced run (the latency target's setting)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each of Weir, Weir paced and Spark Structured "
                             "Streaming (interleaved); the table shows medians and spread")
    parser.add_argument("--max-rate", type=float, default=4_000_000,
                        help="events/s offered in Weir's throughput run: above what Spark "
                             "sustains here, so the figure is Weir's ceiling, while windows "
                             "stay bounded (an unpaced source makes one giant first window)")
    parser.add_argument("--bytewax-events", type=int, default=1_000_000)
    parser.add_argument("--kafka-events", type=int, default=1_000_000,
                        help="events of the Kafka row (a pre-filled topic through the job)")
    parser.add_argument("--app-windows", type=int, default=2,
                        help="Weir: streaming windows per Spark job")
    parser.add_argument("--containers", type=int, default=1000, help="control-plane load")
    parser.add_argument("--control-seconds", type=float, default=300.0,
                        help="control plane: how long the containers are played")
    parser.add_argument("--control-warmup", type=float, default=60.0,
                        help="control plane: figures (round trips, memory growth) from then "
                             "on; the master's recent-window rings fill in the first ~50 s")
    parser.add_argument("--scaling-partitions", default="1,2,4",
                        help="partition counts of the scaling row, comma-separated")
    parser.add_argument("--scaling-events", type=int, default=10_000_000,
                        help="events per scaling run (offered at --max-rate)")
    parser.add_argument("--event-time-events", type=int, default=8_000_000,
                        help="events of the event-time row (Weir and Spark SS, same files)")
    parser.add_argument("--event-time-rate", type=float, default=2_000_000,
                        help="event-time row: events/s offered to Weir (above what it "
                             "sustains: its ceiling; its delay then includes a backlog)")
    parser.add_argument("--nexmark-events", type=int, default=10_000_000,
                        help="nexmark row: events generated once (persons, auctions, bids), "
                             "read by Weir, Spark SS and Flink; 2,000,000 is the quick "
                             "option")
    parser.add_argument("--nexmark-rate", type=float, default=4_000_000,
                        help="nexmark row: events/s offered to Weir's sources (Spark SS's "
                             "maxFilesPerTrigger is sized to the same events per 500 ms)")
    parser.add_argument("--nexmark-queries", default=",".join(NEXMARK_QUERIES),
                        help="nexmark row: the queries, comma-separated")
    parser.add_argument("--latency-seconds", type=float, default=30.0,
                        help="latency row: seconds of events per run (the first 5 s left out)")
    parser.add_argument("--skip", action="append", default=[],
                        choices=["weir", "weir-paced", "weir-kafka", "spark-streaming",
                                 "event-time", "running-count", "bytewax", "startup",
                                 "recovery", "master-restart", "control-plane", "scaling",
                                 "latency", "nexmark"])
    parser.add_argument("--timeout", type=float, default=600.0, help="per system, seconds")
    parser.add_argument("--out", type=Path, default=_ROOT / "bench-results")
    args = parser.parse_args(argv)

    spec = JobSpec(events=args.events)
    results: list[dict[str, Any]] = []
    report: dict[str, Any] = {"machine": _machine(), "spec": dataclasses.asdict(spec),
                              "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    print(f"weir bench on {report['machine']['cores']} cores: {spec.events:,} events, "
          f"{spec.keys:,} keys, {spec.window_ms} ms windows", file=sys.stderr)
    app_windows = ["--app-windows", str(args.app_windows)]
    jobs: list[tuple[str, Any]] = []
    if "weir" not in args.skip:
        offered = dataclasses.replace(spec, rate_per_second=args.max_rate)

        def weir() -> dict[str, Any]:
            result = _run("weir", offered, args.timeout, *app_windows, "--from-files")
            result["system"] = "weir"
            result.setdefault("extra", {})["offered_events_per_second"] = args.max_rate
            return result
        jobs.append(("weir", weir))
    if "weir-paced" not in args.skip:
        paced = dataclasses.replace(spec, rate_per_second=args.rate)
        jobs.append(("weir-paced", lambda: _run("weir", paced, args.timeout, *app_windows,
                                                "--from-files")))
    if "spark-streaming" not in args.skip:
        jobs.append(("spark-streaming", lambda: _run("spark-streaming", spec, args.timeout)))
    results.extend(_repeated(jobs, max(1, args.repeat)))
    if "event-time" not in args.skip:
        report["event_time"] = _repeated(event_time_jobs(args, _run), max(1, args.repeat))
    if "latency" not in args.skip:
        report["latency"] = _repeated(latency_jobs(args, _run), max(1, args.repeat))
    if "nexmark" not in args.skip:
        report["nexmark"] = run_nexmark(args.nexmark_events,
                                        parse_queries(args.nexmark_queries), args.repeat,
                                        rate=args.nexmark_rate, timeout_s=args.timeout)
    if "running-count" not in args.skip:
        report["running_count"] = _run("running-count", spec, args.timeout)
    if "weir-kafka" not in args.skip:
        kafka = dataclasses.replace(spec, events=args.kafka_events)
        results.append(_run("weir-kafka", kafka, args.timeout, *app_windows))
        # the same events read by one plain consumer (the ceiling) and by Quix Streams
        results += [_run(peer, kafka, args.timeout) for peer in KAFKA_PEERS]
    if "bytewax" not in args.skip:
        small = dataclasses.replace(spec, events=args.bytewax_events)
        results.append(_run("bytewax", small, args.timeout))
    report["results"] = results
    if "scaling" not in args.skip:
        offered = JobSpec(events=args.scaling_events, rate_per_second=args.max_rate)
        runs = []
        for count in _partition_counts(args.scaling_partitions):
            result = _run("weir", offered, args.timeout, *app_windows,
                          "--partitions", str(count))
            result["partitions"] = count
            result.setdefault("extra", {})["offered_events_per_second"] = args.max_rate
            runs.append(result)
        report["scaling"] = scaling_report(runs, results, report["machine"]["cores"])
    if "startup" not in args.skip:
        report["startup"] = _run("startup", spec, args.timeout)
    if "recovery" not in args.skip:
        paced = JobSpec(events=min(args.events, 8_000_000), rate_per_second=500_000)
        repeats = max(3, args.repeat)
        report["recovery"] = summarize_recovery(
            [_run("recovery", paced, args.timeout, "--spares", "1") for _ in range(repeats)])
        report["recovery_without_spare"] = summarize_recovery(
            [_run("recovery", paced, args.timeout) for _ in range(repeats)])
        report["recovery_on_ray"] = summarize_recovery(
            [_run("recovery", paced, args.timeout, "--spares", "1", "--ray")
             for _ in range(repeats)])
    if "master-restart" not in args.skip:
        report["master_restart"] = _run("master-restart", spec, args.timeout)
    if "control-plane" not in args.skip:
        plane = ("--containers", str(args.containers), "--duration", str(args.control_seconds),
                 "--warmup", str(min(args.control_warmup, args.control_seconds / 2)))
        report["control_plane"] = _run("control-plane", spec, args.timeout, *plane)
        # applications of 100 containers: 10 application masters (about 110 MB each),
        # where 100 applications of 10 would start 100 (docs/benchmarks.md)
        report["control_plane_application_masters"] = _run(
            "control-plane", spec, args.timeout, *plane, "--application-masters",
            "--containers-per-app", "100")

    args.out.mkdir(parents=True, exist_ok=True)
    sections = [render(results)] if results else []
    if kafka_context := render_kafka_context(results):
        sections.append(kafka_context)
    if "event_time" in report:
        sections.append(render_event_time(report["event_time"]))
    if "latency" in report:
        sections.append(render_latency(report["latency"]))
    if "scaling" in report:
        sections.append(render_scaling(report["scaling"]))
    if "nexmark" in report:
        sections.append(render_nexmark(report["nexmark"]))
    if "running_count" in report:
        sections.append(render_running_count(report["running_count"]))
    table = "\n\n".join(sections)
    print(table)
    if "startup" in report:
        s = report["startup"]
        print(f"\nstartup: first window result {s.get('first_result_seconds', '?')} s after the "
              f"master started; idle (source-only) container {s.get('source_container_rss_mb')}"
              f" MB, Spark container {s.get('spark_container_rss_mb')} MB")
    print_recovery_rows(report)
    if "master_restart" in report:
        m = report["master_restart"]
        journal, back = m.get("journal", {}), m.get("restart", {})
        print(f"master restart: SIGKILLed mid-run, answering again after "
              f"{back.get('master_back_seconds', '?')} s, committed window moving after "
              f"{back.get('committed_window_moving_again_seconds', '?')} s, "
              f"{back.get('operators_redeployed', '?')} operators redeployed; journal "
              f"{journal.get('journal_ms_per_heartbeat', '?')} ms per heartbeat "
              f"({journal.get('operators', '?')} operators, "
              f"{journal.get('journal_records_per_heartbeat', '?')} records per heartbeat)")
    for key, name in (("control_plane", "control plane"),
                      ("control_plane_application_masters",
                       "control plane, a master process per application")):
        if key not in report:
            continue
        c = report[key]
        flat = {k: v for k, v in c.items() if not isinstance(v, list | dict)}
        if "rtt_p99_ms" in c:
            print(f"{name}: round trip p99 {c['rtt_p99_ms']:g} ms (target < 100 ms), "
                  f"master CPU {c.get('master_cpu_ms_per_heartbeat', '?')} ms per heartbeat "
                  f"({c.get('master_cpu_percent', '?')} % of a core), targets "
                  f"{'met' if c.get('meets_targets') else 'NOT met'}")
        print(f"{name}: {json.dumps(flat)}")
    (args.out / "latest.json").write_text(json.dumps(report, indent=2))
    (args.out / "latest.txt").write_text(table + "\n")
    if chart(results, args.out / "latest.png"):
        print(f"\nwrote {args.out / 'latest.json'} and {args.out / 'latest.png'}")
    else:
        print(f"\nwrote {args.out / 'latest.json'} (no chart: matplotlib is not installed)")
    failed = failed_rows(report) + nexmark_failed(report.get("nexmark", {}))
    for line in failed:
        print(f"FAILED {line}")
    missed = missed_targets(report)
    if missed:
        print("\nmissed targets (the README's claim beside each):")
        for line in missed:
            print(f"  MISSED {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The Nexmark section of ``make bench``: the events generated once, every query run on
every system as its own subprocess (``bench.nexmark.one``), repeats interleaved (A B C
A B C ...) so that a machine slowing down slows every system alike, medians with their
min-max, ratios to Spark Structured Streaming and Flink, and the failed runs.

Each run is timed from outside first, as a user who starts it waits (from the spawn of
its process to its first and last result file, and to its run returning), then by the
system's own clock over its processing span (the breakdown: how much of the wait is
start-up).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import BusyCpus, render_breakdown, render_table, run_json_subprocess
from bench.nexmark.generator import write_files
from bench.nexmark.model import NOT_EXPRESSIBLE, QUERIES, NexmarkSpec
from bench.nexmark.one import SYSTEMS
from bench.output_times import OUTSIDE_FIGURES
from bench.verdict import _why
from bench.weir_job import render_timeline

__all__ = ["nexmark_failed", "parse_queries", "render_nexmark", "run_nexmark", "spec_for"]

_ROOT = Path(__file__).resolve().parents[2]
WEIR, SPARK, FLINK = SYSTEMS
STREAMING_WINDOW_MS = 500

PUBLISHED_FLINK_PER_CORE = {"q0": 155_020, "q1": 157_940, "q2": 175_210, "q3": 152_120,
                            "q4": 34_330, "q5": 22_140, "q7": 12_330, "q8": 146_140, "q9": 14_240,
                            "q11": 39_700, "q18": 53_700, "q19": 44_040, "q20": 18_980}
"""Flink's published throughput per core (nexmark/nexmark's README: Flink 1.13, 8
TaskManagers of one slot, 100 M events). Its q7 is the join form, heavier than the max
run here; its q18 keeps each pair's last bid and q19 the top 10 bids per auction over
all time (updating results), where here q18 keeps the first and q19 ranks per 10 s
window (results that only grow)."""

NOTES = (
    "from outside, as a user waits: launch -> first / last result, from the runner's spawn "
    "of the run's process (time.time() just before Popen, passed as --launched-at: the "
    "Python start of that process counts against every system alike) to the mtime of the "
    "first / last output data file holding a row (Weir's FileSink window files, Spark SS's "
    "foreachBatch part files, Flink's committed part files; in-progress, hidden and _SUCCESS "
    "files left out), read before the work folder is removed. launch -> exit: to the "
    "system's run returning (Weir: the application finished and its master stopped; Spark "
    "SS: the session stopped; Flink: its process exited), before the bench's check. "
    "events/s from outside: all N events over launch -> last result; weir ÷ a peer from "
    "outside: the peer's median launch -> last result seconds over Weir's. Every system "
    "runs as its users run it: no untimed warm-up for Spark SS or Flink (--warm-up puts "
    "theirs back, then inside this clock); Weir as `weir run` does, a master in the "
    "process and the DAG submitted, its containers' own Spark warm-up (the runtime's "
    "default) inside this clock.",
    "processing span (the breakdown: the part of the wait after start-up): all N Nexmark events "
    "(persons, auctions and bids) over the seconds from the first input read to the last "
    "result out, by each system's own clock; the same files for every system, written "
    "before any clock starts. Weir: from when its sources' first window began (as the "
    "container reports it: a source that reads everything early ends that window early) to "
    "the sink's last result (the master's window stats). Spark SS: query start to the "
    "last micro-batch collected (the session's start outside it). Flink: the job's "
    "submission to its end (PyFlink starts a mini-cluster per job: included).",
    "latency: Weir, per streaming window with results, its close at the sources to its "
    "END_WINDOW at the sink; Spark SS, each micro-batch's triggerExecution; Flink: not "
    "measured.",
    "per core: processing-span events/s over this machine's cores (every system here uses "
    "all of them), beside Flink's published per-core figure (nexmark/nexmark README, Flink "
    "1.13 on 3 x 8 cores, 100 M events; its q7 is a join, its q18 and q19 update their "
    "results where the forms here only add rows).",
    "correct: every output row equals the plain reference computed from the same files, "
    "as a multiset. Spark's watermark never passes the last windows of a bounded input: "
    "those are left out of its check; Weir and Flink close them at the end.",
)


def spec_for(events: int) -> NexmarkSpec:
    """The spec of a run of ``events``: files of 1/50 of the events (10k to 100k each) and
    at least 60 s of event time (at most 100k events a second), so that even a small run
    has windows that Spark's watermark closes (it stops 2 s short of the end)."""
    return NexmarkSpec(events=events, events_per_file=min(100_000, max(10_000, events // 50)),
                       events_per_second=max(1, min(100_000, events // 60)))


def parse_queries(text: str) -> list[str]:
    """``"q0,q1"`` -> ``["q0", "q1"]``.

    Raises:
        SystemExit: a query that is not run here.
    """
    queries = [q.strip() for q in text.split(",") if q.strip()]
    unknown = [q for q in queries if q not in QUERIES]
    if not queries or unknown:
        raise SystemExit(f"--queries {text!r}: give some of {','.join(QUERIES)}")
    return queries


def _run_one(system: str, query: str, spec: NexmarkSpec, data: Path, rate: float,
             timeout_s: float, warm_up: bool = False) -> dict[str, Any]:
    """One run in a subprocess; its result with the peak memory of its process tree and
    its figures from outside, timed from the spawn (``--launched-at``). ``warm_up``: Spark
    SS and Flink run their untimed warm-ups first (off: as their users run them)."""
    files_per_trigger = max(1, round(rate * STREAMING_WINDOW_MS / 1000 / spec.events_per_file))
    argv = [sys.executable, "-m", "bench.nexmark.one", system, query, "--data", str(data),
            "--spec", spec.to_json(), "--rate", str(rate), "--files-per-trigger",
            str(files_per_trigger), "--timeout", str(timeout_s),
            *(() if warm_up else ("--no-warm-up",))]
    print(f"  nexmark {query} on {system} ({spec.events:,} events) ...", file=sys.stderr,
          flush=True)
    result = run_json_subprocess(system, argv, timeout_s + 120, launched_at_flag="--launched-at")
    result["system"] = system
    return result


def _median_and_spread(runs: list[dict[str, Any]], key: str
                       ) -> tuple[float | None, list[float] | None]:
    """The median and [min, max] of ``key`` over the runs; None when a run lacks it (a
    median of fewer runs than the others' would not compare)."""
    numbers = [float(r[key]) for r in runs if isinstance(r.get(key), int | float)]
    if not numbers or len(numbers) < len(runs):
        return None, None
    return statistics.median(numbers), [min(numbers), max(numbers)]


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One system's repeated runs of a query: the median events/s and latencies, and of
    each figure from outside (``OUTSIDE_FIGURES``; None when a run lacks it), their
    min-max (``spread``), every run's figures; a wrong or failed run makes the whole
    result wrong."""
    wrong = [r for r in runs if not r.get("correct")]
    if wrong:
        return {**wrong[0], "repeats": len(runs), "runs": runs}
    eps = [float(r.get("events_per_second", 0)) for r in runs]
    middle = statistics.median(eps)
    median_run = min(runs, key=lambda r: abs(float(r["events_per_second"]) - middle))
    p50 = [float(r.get("latency_p50_ms", 0)) for r in runs]
    p99 = [float(r.get("latency_p99_ms", 0)) for r in runs]
    outside = {key: _median_and_spread(runs, key) for key in OUTSIDE_FIGURES}
    return {**median_run, "repeats": len(runs), "events_per_second": middle,
            "latency_p50_ms": statistics.median(p50), "latency_p99_ms": statistics.median(p99),
            **{key: median for key, (median, _) in outside.items()},
            "spread": {"events_per_second": [min(eps), max(eps)],
                       **{key: spread for key, (_, spread) in outside.items()}},
            "peak_rss_mb": max(float(r.get("peak_rss_mb", 0)) for r in runs),
            "runs": [{k: r.get(k) for k in ("events_per_second", "latency_p50_ms",
                                             "latency_p99_ms", "run_seconds",
                                             *OUTSIDE_FIGURES)} for r in runs]}


def run_nexmark(events: int, queries: Sequence[str], repeat: int = 3,
                systems: Sequence[str] = SYSTEMS, rate: float = 4_000_000,
                timeout_s: float = 600.0, warm_up: bool = False, busy: int = 0
                ) -> dict[str, Any]:
    """The section: per query, one summary per system (``summarize``), in ``systems``'
    order. The events are written once, on tmpfs, and removed at the end. ``warm_up``:
    Spark SS and Flink run their untimed warm-ups (off by default: the figures from
    outside are of each system as its users run it). ``busy``: CPU-burning processes
    beside every run (``bench.common.BusyCpus``), none while the events are written."""
    spec = spec_for(events)
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    data = Path(tempfile.mkdtemp(prefix="weir-nexmark-data-", dir=shm))
    try:
        print(f"nexmark: writing {events:,} events ...", file=sys.stderr, flush=True)
        rows = write_files(spec, data, csv=FLINK in systems)
        results: dict[str, list[dict[str, Any]]] = {}
        for query in queries:
            runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
            able = [s for s in systems if (s, query) not in NOT_EXPRESSIBLE]
            for _ in range(max(1, repeat)):
                for system in able:
                    with BusyCpus(busy):
                        runs[system].append(_run_one(system, query, spec, data, rate,
                                                     timeout_s, warm_up=warm_up))
            results[query] = [summarize(runs[s]) if s in able else
                              {"system": s, "not_run": NOT_EXPRESSIBLE[(s, query)]}
                              for s in systems]
    finally:
        shutil.rmtree(data, ignore_errors=True)
    return {"spec": dataclasses.asdict(spec), "rows": rows, "offered_to_weir": rate,
            "cores": os.cpu_count() or 1, "warm_up": warm_up, "busy": busy,
            "repeats": max(1, repeat), "queries": results}


def _ratio(mine: dict[str, Any] | None, base: dict[str, Any] | None) -> str:
    """Weir's processing-span events/s over a peer's; "-" unless both are correct."""
    if not (mine and base and mine.get("correct") and base.get("correct")
            and base.get("events_per_second")):
        return "-"
    return f"{mine['events_per_second'] / base['events_per_second']:.2f}"


def _outside_ratio(mine: dict[str, Any] | None, base: dict[str, Any] | None) -> str:
    """Weir's events/s from outside over a peer's: the peer's median seconds from launch to
    its last result over Weir's (the same events); "-" unless both are correct and
    timed."""
    key = "launch_to_last_result_s"
    if not (mine and base and mine.get("correct") and base.get("correct")
            and mine.get(key) and base.get(key)):
        return "-"
    return f"{base[key] / mine[key]:.2f}"


def _seconds(r: dict[str, Any], key: str) -> tuple[str, str]:
    """A figure from outside as cells: its median and its min-max, in seconds ("-": not
    measured)."""
    median = r.get(key)
    if not isinstance(median, int | float):
        return "-", "-"
    low, high = (r.get("spread") or {}).get(key) or [median, median]
    return f"{median:,.1f}", f"{low:,.1f}-{high:,.1f}"


def render_nexmark(section: dict[str, Any]) -> str:
    """The Nexmark table: query x system, first as a user waits (launch -> last and ->
    first result, median and min-max, Weir's events/s from outside as ratios to Spark SS's
    and Flink's, launch -> exit), then by each system's own clock (processing-span
    events/s, median and min-max, per core, latency, memory, correct, the same ratios);
    Weir's cost breakdowns."""

    headers = ["query", "system", "runs", "launch→last result s", "min-max",
               "launch→first result s", "min-max", "weir ÷ Spark SS outside",
               "weir ÷ Flink outside", "launch→exit s", "events/s outside",
               "processing span events/s", "min-max", "per core", "published Flink per core",
               "p50 ms", "p99 ms", "peak MB", "correct", "weir ÷ Spark SS span",
               "weir ÷ Flink span"]
    cores = int(section.get("cores") or 1)
    rows, lines = [], []
    for query, results in section["queries"].items():
        by = {r["system"]: r for r in results}
        weir = by.get(WEIR)
        for r in results:
            if "not_run" in r:
                rows.append([query, r["system"], "0", "not run", *[""] * (len(headers) - 4)])
                lines.append(f"  {query} {r['system']}: not run: {r['not_run']}")
                continue
            eps = r.get("events_per_second", 0)
            low, high = r.get("spread", {}).get("events_per_second", [eps, eps])
            timed = bool(r.get("latencies_ms"))
            mine = r["system"] == WEIR
            outside_eps = r.get("events_per_second_outside")
            rows.append([query, r["system"], str(r.get("repeats", 1)),
                         *_seconds(r, "launch_to_last_result_s"),
                         *_seconds(r, "launch_to_first_result_s"),
                         _outside_ratio(weir, by.get(SPARK)) if mine else "",
                         _outside_ratio(weir, by.get(FLINK)) if mine else "",
                         _seconds(r, "launch_to_exit_s")[0],
                         f"{outside_eps:,.0f}" if isinstance(outside_eps, int | float) else "-",
                         f"{eps:,.0f}", f"{low:,.0f}-{high:,.0f}", f"{eps / cores:,.0f}",
                         f"{PUBLISHED_FLINK_PER_CORE.get(query, 0):,}"
                         if r["system"] == FLINK else "",
                         f"{r.get('latency_p50_ms', 0):,.0f}" if timed else "-",
                         f"{r.get('latency_p99_ms', 0):,.0f}" if timed else "-",
                         f"{r.get('peak_rss_mb', 0):,.0f}", "yes" if r.get("correct") else "NO",
                         _ratio(weir, by.get(SPARK)) if mine else "",
                         _ratio(weir, by.get(FLINK)) if mine else ""])
            if not r.get("correct"):
                lines.append(f"  {query} {r['system']}: {r.get('detail', '')}")
            costs = r.get("extra", {}).get("breakdown")
            if mine and r.get("correct") and costs:
                lines.append(f"  {query} weir: {render_breakdown(costs)}")
            timeline = r.get("extra", {}).get("timeline_ms")
            if mine and r.get("correct") and timeline and r.get("launched_at"):
                lines.append(f"  {query} weir, one run from its launch: "
                             f"{render_timeline(timeline, float(r['launched_at']))}")
    spec = section.get("spec", {})
    head = (f"nexmark: {spec.get('events', 0):,} events (persons, auctions, bids 1:3:46; "
            f"{spec.get('out_of_order', 0):.0%} up to {spec.get('max_disorder_ms', 0):,} ms "
            f"out of order), Weir offered {section.get('offered_to_weir', 0):,.0f} events/s, "
            f"{section.get('repeats', 1)} interleaved runs each, Spark SS and Flink "
            f"{'with' if section.get('warm_up') else 'without'} their untimed warm-ups"
            + (f", {section['busy']} CPU-burning processes beside every run"
               if section.get("busy") else ""))
    notes = [textwrap.fill(n, 100, initial_indent="  ", subsequent_indent="    ")
             for n in NOTES]
    return "\n".join([head, *render_table(headers, rows), *lines, *notes])


def nexmark_failed(section: dict[str, Any]) -> list[str]:
    """``"nexmark <query> <system>: <why>"`` for every failed result (``bench.verdict``'s
    rule: an error or a wrong output).

    >>> nexmark_failed({"queries": {"q1": [{"system": "weir", "correct": True},
    ...                                    {"system": "flink", "correct": False,
    ...                                     "detail": "exit 1"}]}})
    ['nexmark q1 flink: exit 1']
    """
    failed = []
    for query, results in section.get("queries", {}).items():
        for r in results:
            why = _why(r)
            if why is not None:
                failed.append(f"nexmark {query} {r.get('system')}: {why}")
    return failed

"""Runs one system on the job in this process and prints its result as JSON (the last line).

The orchestrator starts one of these per system, so each system's whole process tree
(master, containers, JVMs) can be measured alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from bench.common import JobSpec

__all__ = ["SYSTEMS", "main"]

SYSTEMS = ("weir", "weir-kafka", "spark-streaming", "bytewax", "startup", "recovery",
           "master-restart", "control-plane", "weir-event-time", "spark-event-time",
           "running-count", "kafka-consumer-ceiling", "quixstreams", "weir-latency",
           "spark-latency")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("system", choices=SYSTEMS)
    parser.add_argument("--spec", default=JobSpec().to_json(), help="the JobSpec as JSON")
    parser.add_argument("--app-windows", type=int, default=2,
                        help="Weir: streaming windows per Spark job")
    parser.add_argument("--partitions", type=int, default=0,
                        help="Weir: the scaling job with N partitions of the aggregation "
                             "(0 = the two-container job)")
    parser.add_argument("--from-files", action="store_true",
                        help="Weir: read the events from Parquet files written first, as "
                             "Spark Structured Streaming does (ParquetSource)")
    parser.add_argument("--events-per-trigger", type=int, default=0,
                        help="Spark Structured Streaming: events per micro-batch (0 = default)")
    parser.add_argument("--spares", type=int, default=0,
                        help="recovery: SPARE_CONTAINERS (warm standbys the lost container's "
                             "operators go to)")
    parser.add_argument("--ray", action="store_true",
                        help="recovery: containers as Ray actors; their node is killed")
    parser.add_argument("--event-time-spec", default="",
                        help="weir-event-time, spark-event-time: the EventTimeSpec as JSON "
                             "(default: EventTimeSpec() with --spec's events)")
    parser.add_argument("--containers", type=int, default=1000, help="control plane")
    parser.add_argument("--operators", type=int, default=10, help="control plane")
    parser.add_argument("--application-masters", action="store_true",
                        help="control plane: a dispatcher, a master process per application")
    parser.add_argument("--containers-per-app", type=int, default=10,
                        help="control plane: containers of each application")
    parser.add_argument("--duration", type=float, default=30.0, help="control plane, seconds")
    parser.add_argument("--warmup", type=float, default=5.0,
                        help="control plane: seconds before the figures are taken")
    parser.add_argument("--latency-spec", default="",
                        help="weir-latency, spark-latency: the bench.latency.LatencySpec as "
                             "JSON (its job: map or count)")
    parser.add_argument("--probe", action="store_true",
                        help="spark-latency: only find the smallest trigger it sustains")
    args = parser.parse_args(argv)
    spec = JobSpec.from_json(args.spec)
    # Memory-backed like Weir's Spark scratch files, so both read their input from RAM.
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    work = Path(tempfile.mkdtemp(prefix=f"weir-bench-{args.system}-", dir=shm))
    try:
        result = _run(args, spec, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sys.stdout.flush()
    print("\n" + json.dumps(result))
    return 0


def _run(args: argparse.Namespace, spec: JobSpec, work: Path) -> dict:
    if args.system == "weir":
        from bench import weir_job

        result = weir_job.run(spec, args.app_windows, work_dir=work, partitions=args.partitions,
                              from_files=args.from_files).to_dict()
    elif args.system in ("weir-event-time", "spark-event-time"):
        from bench import event_time_jobs
        from bench.event_time import EventTimeSpec

        et = (EventTimeSpec.from_json(args.event_time_spec) if args.event_time_spec
              else EventTimeSpec(events=spec.events))
        run = event_time_jobs.run_weir if args.system == "weir-event-time" \
            else event_time_jobs.run_spark
        result = run(et, work).to_dict()
    elif args.system in ("weir-latency", "spark-latency"):
        result = _latency(args, work)
    elif args.system == "running-count":
        from bench import running_count

        result = running_count.run(work_dir=work)
    elif args.system == "weir-kafka":
        from bench import kafka_job

        result = kafka_job.run(spec, args.app_windows, work_dir=work).to_dict()
    elif args.system == "spark-streaming":
        from bench import spark_streaming

        files = None
        if args.events_per_trigger:
            files = max(1, args.events_per_trigger // spec.batch_rows)
        result = spark_streaming.run(spec, work, files_per_trigger=files).to_dict()
    elif args.system in ("kafka-consumer-ceiling", "quixstreams"):
        from bench import kafka_peers

        result = (kafka_peers.consumer_ceiling(spec) if args.system == "kafka-consumer-ceiling"
                  else kafka_peers.quixstreams_job(spec, work)).to_dict()
    elif args.system == "bytewax":
        from bench import bytewax_job

        result = bytewax_job.run(spec).to_dict()
    elif args.system == "startup":
        from bench import weir_job

        result = weir_job.startup()
    elif args.system == "recovery":
        from bench import weir_job

        result = weir_job.recovery(spec, spares=args.spares, on_ray=args.ray)
    elif args.system == "master-restart":
        from bench import master_restart

        result = master_restart.run()
    else:
        from bench import control_plane

        result = control_plane.run(containers=args.containers,
                                   operators_per_container=args.operators,
                                   duration_s=args.duration, warmup_s=args.warmup,
                                   application_masters=args.application_masters,
                                   containers_per_app=args.containers_per_app)
    return result


def _latency(args: argparse.Namespace, work: Path) -> dict:
    """The latency row's runs (``bench.latency``)."""
    from bench.latency import LatencySpec

    spec = LatencySpec.from_json(args.latency_spec) if args.latency_spec else LatencySpec()
    if args.system == "weir-latency":
        from bench.latency_jobs import run_weir

        return run_weir(spec, work)
    from bench import latency_spark

    return latency_spark.probe(spec, work) if args.probe else latency_spark.run(spec, work)


if __name__ == "__main__":
    sys.exit(main())

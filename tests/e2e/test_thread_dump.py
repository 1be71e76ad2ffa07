"""`kill -USR1` on a container writes every thread's stack to its log and changes
nothing else: how a stalled container is diagnosed while it runs."""

from __future__ import annotations

import os
import signal

from tests.e2e.test_exactly_once import live_container_pids
from tests.harness import poll_for
from weir.master.client import WeirClient
from weir.operators import Dag
from weir.operators.library import ConsoleSink, EventGenerator


def test_sigusr1_dumps_the_threads_to_the_log_and_the_container_runs_on(master):
    dag = Dag("dump", CONTAINERS=1, HEARTBEAT_INTERVAL_MILLIS=200,
              STREAMING_WINDOW_SIZE_MILLIS=100)
    gen = dag.add_operator("gen", EventGenerator(rate_per_second=1_000, keys=10))
    sink = dag.add_operator("sink", ConsoleSink(limit=0))
    dag.add_stream("events", gen.output, sink.input)
    with WeirClient(master.address) as client:
        app_id = client.submit(dag.to_descriptor())
        try:
            poll_for(lambda: client.operator_stats(app_id, "sink").total_tuples_processed, 60,
                     "the sink to process a first window")
            [(container_id, pid)] = live_container_pids(client, app_id).items()
            os.kill(pid, signal.SIGUSR1)
            log = master.log_dir / f"{container_id}.log"
            dump = poll_for(lambda: "heartbeat_loop.py" in log.read_text(errors="replace")
                            and log.read_text(errors="replace"), 30, "a thread dump in the log")
            assert "Thread 0x" in dump and "window_loop.py" in dump
            processed = client.operator_stats(app_id, "sink").total_tuples_processed
            poll_for(lambda: client.operator_stats(app_id, "sink").total_tuples_processed
                     > processed, 30, "the sink to go on after the dump")
            assert [c.state for c in client.containers(app_id)] == ["ACTIVE"]
        finally:
            client.kill(app_id)

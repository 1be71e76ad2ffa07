"""A spare container end to end (SPARE_CONTAINERS=1), through real processes and real Spark:
the Spark container is SIGKILLed mid-run, its operators move to the warm spare, a new
spare is launched, and every event is still counted exactly once."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from collections import Counter

import pytest

from tests.e2e.conftest import container_logs
from tests.harness import poll_for
from weir.master.client import WeirClient
from weir.operators.app import load_app
from weir.operators.library import EventGenerator

pytestmark = pytest.mark.timeout(300)

EVENTS, KEYS, RATE = 60_000, 50, 5_000

APP = """
    from weir.operators import Dag
    from weir.operators.library import EventGenerator, FileSink, WindowedCount

    dag = Dag("spares", CONTAINERS=2, SPARE_CONTAINERS=1, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, HEARTBEAT_TIMEOUT_MILLIS=5000,
              CHECKPOINT_WINDOW_COUNT=5, STATE_DIR={state!r}, SPARK_MASTER="local[1]",
              SPARK_SHUFFLE_PARTITIONS=1, SPARK_DRIVER_MEMORY="512m", SPARK_WARMUP_ROWS=1000)
    source = dag.add_operator("source", EventGenerator(rate_per_second={rate}, keys={keys},
                                                       total={events}), CONTAINER=0)
    count = dag.add_operator("count", WindowedCount(key="key", value="value"), CONTAINER=1)
    sink = dag.add_operator("sink", FileSink({out!r}, exactly_once=True), CONTAINER=1)
    dag.add_stream("events", source.output, count.input)
    dag.add_stream("counts", count.output, sink.input)
"""


def published_totals(out_dir) -> dict[str, list[int]]:
    """Per key, count and sum over every published window file."""
    totals: Counter[str] = Counter()
    sums: Counter[str] = Counter()
    for path in sorted(out_dir.glob("window-*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            totals[row["key"]] += row["count"]
            sums[row["key"]] += row["sum"]
    return {key: [totals[key], sums[key]] for key in totals}


def expected() -> dict[str, list[int]]:
    counts = EventGenerator(keys=KEYS, total=EVENTS).expected_counts()
    return {key: [count, total] for key, (count, total) in counts.items()}


def test_the_spark_container_killed_moves_to_the_warm_spare_and_counts_stay_exact(
        master, tmp_path):
    app_file = tmp_path / "spares_app.py"
    app_file.write_text(textwrap.dedent(APP.format(
        state=str(tmp_path / "state"), rate=RATE, keys=KEYS, events=EVENTS,
        out=str(tmp_path / "out"))))
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app_file).to_descriptor())

        def ready_spare() -> str:
            return next((c.id for c in client.containers(app_id) if c.state == "SPARE"), "")

        poll_for(lambda: client.application(app_id).committed_window_id >= 0, 120,
                 f"a first committed window\n{container_logs(master)}")
        spare = poll_for(ready_spare, 120, f"a spare with warm Spark\n{container_logs(master)}")
        before = {c.id for c in client.containers(app_id)}
        count = next(o for o in client.operators(app_id) if o.name == "count")
        victim = next(c for c in client.containers(app_id) if c.id == count.container_id)
        assert client.application(app_id).state == "RUNNING"
        os.kill(int(victim.process_name.split("@")[0]), signal.SIGKILL)

        info = client.wait(app_id, 180)
        assert info.state == "FINISHED", f"{info.diagnostics}\n{container_logs(master)}"
        operators = {o.name: o for o in client.operators(app_id)}
        assert operators["count"].container_id == spare
        assert operators["sink"].container_id == spare
        assert operators["count"].failure_count == 1
        containers = {c.id: c for c in client.containers(app_id)}
        assert containers[victim.id].state == "KILLED"
        assert (containers[victim.id].replaced_by, containers[spare].replaces) == (
            spare, victim.id)
        assert not containers[spare].spare  # it took over: a spare no more
        new_spares = [c for c in containers.values() if c.id not in before]
        assert [c.spare for c in new_spares] == [True], "one new spare launched, nothing else"
        assert info.recoveries == 1
        assert published_totals(tmp_path / "out") == expected()

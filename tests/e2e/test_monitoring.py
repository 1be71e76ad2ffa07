"""Monitoring end to end: the figures of a run with known input, the operators' own through
both drivers, and the master's over the JSON API and Prometheus' /metrics while it runs
and after it ended. No Spark: pure-Python operators.
"""

from __future__ import annotations

import json
import textwrap
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from weir.master.auth import http_token
from weir.master.client import WeirClient
from weir.operators.app import load_app

pytestmark = pytest.mark.timeout(240)

EVENTS, RATE, WINDOW_MS, HEARTBEAT_MS = 24_000, 4_000, 200, 200
# A window's end passes each operator within a few windows unless the machine stalls;
# twenty windows leave room for a loaded two-core machine without hiding a wrong figure
# (a latency measured against another window, or a clock mixed up, is seconds off or
# negative).
LATENCY_BOUND_MS = 20 * WINDOW_MS

APP = """
    import pyarrow.compute as pc
    from weir.operators import Dag, Operator, InputPort, OutputPort, metric
    from weir.operators.library import EventGenerator, FileSink

    class Evens(Operator):
        '''Keeps events with an even value; counts what it saw (user metrics).'''
        input = InputPort()
        output = OutputPort()
        METRICS = ("rows_seen",)

        def __init__(self):
            self.rows_seen = 0
            self.rows_kept = 0

        def process(self, port, batch):
            kept = batch.filter(pc.equal(pc.bit_wise_and(batch.column("value"), 1), 0))
            self.rows_seen += batch.num_rows
            self.rows_kept += kept.num_rows
            self.output.emit(kept)

        @metric
        def rows_dropped(self):
            return self.rows_seen - self.rows_kept

    dag = Dag("monitored", CONTAINERS=2, STREAMING_WINDOW_SIZE_MILLIS={window},
              HEARTBEAT_INTERVAL_MILLIS={heartbeat}, CHECKPOINT_WINDOW_COUNT=5,
              THROUGHPUT_CALCULATION_INTERVAL_MILLIS=2000, STATE_DIR={state!r})
    source = dag.add_operator("source", EventGenerator(rate_per_second={rate}, keys=20,
                                                       total={events}, batch_rows=1000),
                              CONTAINER=0)
    evens = dag.add_operator("evens", Evens(), CONTAINER=0)
    sink = dag.add_operator("sink", FileSink({out!r}), CONTAINER=1)
    dag.add_stream("events", source.output, evens.input)
    dag.add_stream("kept", evens.output, sink.input)
"""


def get(master, path: str) -> bytes:
    request = urllib.request.Request(master.core.dashboard_url + path.lstrip("/"),
                                     headers={"Authorization":
                                              f"Bearer {http_token(master.secret)}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read()


def api(master, path: str) -> dict:
    return json.loads(get(master, path))


def scrape(master) -> dict[str, list]:
    """/metrics parsed by Prometheus' own parser: samples by family name."""
    text = get(master, "metrics").decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def sample(families: dict, family: str, **labels: str) -> float:
    found = [s.value for s in families[family]
             if all(s.labels.get(k) == v for k, v in labels.items())
             and not s.name.endswith("_created")]
    assert len(found) == 1, (family, labels, found)
    return found[0]


def test_figures_of_a_run_with_known_input(run_dag, request, tmp_path):
    """Through both drivers: the operators' own figures (a user metric) and the output; in
    containers, the master's figures over its API and /metrics, while it runs and after."""
    app_file = tmp_path / "monitored_app.py"
    app_file.write_text(textwrap.dedent(APP.format(
        window=WINDOW_MS, heartbeat=HEARTBEAT_MS, rate=RATE, events=EVENTS,
        state=str(tmp_path / "state"), out=str(tmp_path / "out"))))
    running: dict[str, Any] = {}

    def while_running(client: WeirClient, app_id: str) -> None:
        if running:
            return
        master = request.getfixturevalue("cluster")  # the one run_dag submits to
        info = api(master, f"api/apps/{app_id}")
        if info["state"] == "RUNNING" and info["tuples_processed_per_second"] > 0:
            running.update(info=info, families=scrape(master))

    run = run_dag(load_app(app_file), during=while_running)
    evens = run.operator("evens")
    kept = sum(len(file.read_text().splitlines()) for file in (tmp_path / "out").glob("*"))
    assert 0 < kept < EVENTS
    assert (evens.rows_seen, evens.rows_dropped()) == (EVENTS, EVENTS - kept)
    if run.driver == "containers":
        assert running, "the master never showed the application running with throughput"
        _the_master_figures(run.master, run.app_id, running, kept)


def _the_master_figures(master: Any, app_id: str, running: dict[str, Any], kept: int) -> None:
    assert int(running["info"]["total_tuples_processed"]) < 2 * EVENTS
    families = running["families"]  # while it ran
    assert sample(families, "weir_application_state", app=app_id, state="RUNNING") == 1
    assert sample(families, "weir_operator_tuples_emitted", app=app_id, operator="source") > 0
    assert sample(families, "weir_application_tuples_processed_per_second", app=app_id) > 0
    assert sample(families, "weir_container_memory_rss_bytes", app=app_id,
                  container=f"{app_id}-c0") > 0

    operators = {op["name"]: op for op in api(master, f"api/apps/{app_id}/operators")["operators"]}
    source, evens, sink = operators["source"], operators["evens"], operators["sink"]
    assert int(source["total_tuples_emitted"]) == EVENTS
    assert int(evens["total_tuples_processed"]) == EVENTS
    assert int(evens["total_tuples_emitted"]) == kept
    assert int(sink["total_tuples_processed"]) == kept
    assert evens["metrics"] == {"rows_seen": EVENTS, "rows_dropped": EVENTS - kept}

    app = api(master, f"api/apps/{app_id}")
    assert int(app["total_tuples_processed"]) == EVENTS + kept
    assert int(app["committed_window_id"]) >= int(app["current_window_id"]) >= 0
    assert app["critical_path"] == ["source", "evens", "sink"]
    logical = {op["name"]: op for op in app["logical_operators"]}
    assert logical["evens"]["metrics"]["rows_seen"] == EVENTS
    for op in (evens, sink):
        assert 0 <= op["latency_ms"] <= LATENCY_BOUND_MS, op
        windows = api(master, f"api/apps/{app_id}/operators/{op['name']}/windows")
        latencies = [w["latency_ms"] for w in windows["recent_windows"] if w["latency_ms"] >= 0]
        assert latencies and all(0 <= ms <= LATENCY_BOUND_MS for ms in latencies), latencies
    assert 0 <= app["latency_ms"] <= 2 * LATENCY_BOUND_MS
    assert source["latency_ms"] == 0
    # each window says when it began in the container: after the one before it ended
    ran = api(master, f"api/apps/{app_id}/operators/source/windows")["recent_windows"]
    spans = [(int(w["begin_window_ms"]), int(w["end_window_ms"])) for w in ran]
    assert len(spans) > 1 and all(0 < begin <= end for begin, end in spans), spans
    assert all(later[0] >= earlier[1]
               for earlier, later in zip(spans, spans[1:], strict=False)), spans

    families = scrape(master)  # after the end: totals stay
    assert sample(families, "weir_application_state", app=app_id, state="FINISHED") == 1
    assert sample(families, "weir_operator_tuples_processed", app=app_id,
                  operator="evens") == EVENTS
    assert sample(families, "weir_operator_user_metric", app=app_id, operator="evens",
                  metric="rows_seen") == EVENTS
    assert sample(families, "weir_operator_latency_seconds", app=app_id,
                  operator="sink") <= LATENCY_BOUND_MS / 1000

"""Which transport each input really takes, through the real processes: an input whose
upstream runs in its own container reads the buffer server's stream directly, one in
another container reads over Flight, and each input port's stats say which. A broken
choice (a bind address that differs from the advertised one, say) would fall back to
Flight silently, with the same rows out; this test is what notices."""

from __future__ import annotations

import pytest

from tests.harness import poll_for
from weir.master.client import WeirClient
from weir.operators import Dag
from weir.operators.library import ConsoleSink, EventGenerator

pytestmark = pytest.mark.timeout(180)


def _input_transport(client: WeirClient, app_id: str, operator: str) -> str:
    [port] = [p for p in client.operator_stats(app_id, operator).ports if p.type == "input"]
    return port.transport


def test_an_input_reads_locally_beside_its_upstream_and_over_flight_across(master):
    dag = Dag("local-reads", CONTAINERS=2, HEARTBEAT_INTERVAL_MILLIS=200,
              STREAMING_WINDOW_SIZE_MILLIS=100)
    gen = dag.add_operator("gen", EventGenerator(rate_per_second=1_000, keys=10), CONTAINER=0)
    beside = dag.add_operator("beside", ConsoleSink(limit=0), CONTAINER=0)
    across = dag.add_operator("across", ConsoleSink(limit=0), CONTAINER=1)
    dag.add_stream("events", gen.output, beside.input, across.input)
    with WeirClient(master.address) as client:
        app_id = client.submit(dag.to_descriptor())
        try:
            for sink in ("beside", "across"):
                poll_for(lambda sink=sink: client.operator_stats(app_id, sink)
                         .total_tuples_processed, 60, f"{sink} to process a first window")
            poll_for(lambda: _input_transport(client, app_id, "across"), 30,
                     "the Flight input's transport in its stats")
            assert _input_transport(client, app_id, "beside") == "local"
            assert _input_transport(client, app_id, "across") == "flight"
            placed = {name: client.operator_stats(app_id, name).container_id
                      for name in ("gen", "beside", "across")}
            assert placed["gen"] == placed["beside"] != placed["across"], placed
        finally:
            client.kill(app_id)

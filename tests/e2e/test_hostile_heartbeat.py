"""A forged heartbeat with window id 2^63-1 is rejected, and the operator's stats keep moving.

Real master and container; the forged heartbeat goes through the umbilical client the
containers use (with whatever credentials they present), in the name of the running
container, for its running operator.
"""

from __future__ import annotations

import logging
import time

import pytest

from tests.e2e.conftest import container_logs
from tests.harness import poll_for
from weir.container.umbilical_client import UmbilicalClient
from weir.master.client import WeirClient
from weir.operators import Dag
from weir.operators.library import EventGenerator
from weir.operators.testing import CollectSink
from weir.operators.windows import window_base_seconds
from weir.proto import plan_pb2, umbilical_pb2

pytestmark = pytest.mark.timeout(120)

FORGED = 2**63 - 1


def forged_heartbeat(container, operator_id: int) -> umbilical_pb2.ContainerHeartbeat:
    """The container's own heartbeat as far as the master can tell, with one bogus window."""
    host, port = container.buffer_server_address.rsplit(":", 1)
    now_ms = time.time_ns() // 1_000_000
    window = umbilical_pb2.OperatorStats(
        window_id=FORGED, checkpoint=plan_pb2.Checkpoint(window_id=FORGED),
        input_ports=[umbilical_pb2.PortStats(id="input", tuple_count=10**9,
                                             end_window_timestamp=now_ms)])
    report = umbilical_pb2.OperatorHeartbeat(
        node_id=operator_id, generated_tms=now_ms, state=umbilical_pb2.OPERATOR_STATE_ACTIVE,
        ready=True, window_stats=[window])
    return umbilical_pb2.ContainerHeartbeat(
        container_id=container.id, buffer_server_host=host, buffer_server_port=int(port),
        jvm_name=container.process_name, sent_tms=now_ms,
        stats=umbilical_pb2.ContainerStats(id=container.id, operators=[report]))


def test_a_forged_window_id_is_rejected_and_stats_keep_moving(master, caplog):
    caplog.set_level(logging.WARNING, "weir.master.heartbeat")
    dag = Dag("hostile", CONTAINERS=1, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, CHECKPOINT_WINDOW_COUNT=5)
    source = dag.add_operator("source", EventGenerator(rate_per_second=2_000, keys=10))
    sink = dag.add_operator("sink", CollectSink())
    dag.add_stream("events", source.output, sink.input)
    with WeirClient(master.address) as client:
        app_id = client.submit(dag.to_descriptor())

        def sink_stats():
            return client.operator_stats(app_id, "sink")

        poll_for(lambda: sink_stats().total_tuples_processed > 0
                 and client.application(app_id).committed_window_id >= 0, 60,
                 f"the sink to count tuples and a first committed window\n"
                 f"{container_logs(master)}")
        op = sink_stats()
        [container] = [c for c in client.containers(app_id) if c.id == op.container_id]

        umbilical = UmbilicalClient(master.address, secret=master.secret,
                                   tls_root_certs=master.tls.cert.read_bytes())
        try:
            response = umbilical.heartbeat(forged_heartbeat(container, op.id))
        finally:
            umbilical.close()
        assert response.shutdown != umbilical_pb2.SHUTDOWN_TYPE_ABORT  # a live container

        after = sink_stats()
        assert after.current_window_id != FORGED and after.total_tuples_processed < 10**9
        committed = client.application(app_id).committed_window_id
        assert committed != FORGED
        base = client.application(app_id).start_window_millis // 1000
        assert window_base_seconds(after.current_window_id) == base
        # the stats keep moving with the real container's windows
        poll_for(lambda: (sink_stats().current_window_id > after.current_window_id
                          and sink_stats().total_tuples_processed
                          > after.total_tuples_processed), 30,
                 f"the sink's stats to move on\n{container_logs(master)}")
        poll_for(lambda: client.application(app_id).committed_window_id > committed, 30,
                 "the committed window to move on")
        assert client.application(app_id).state == "RUNNING"
        [line] = [r.getMessage() for r in caplog.records
                  if r.name == "weir.master.heartbeat" and str(FORGED) in r.getMessage()]
        assert f"container={container.id}" in line and f"operator=sink ({op.id})" in line
        assert "are ignored" in line
        client.kill(app_id, "test over")

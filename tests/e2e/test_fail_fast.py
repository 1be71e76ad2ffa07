"""Errors that cannot succeed on retry fail the application in one attempt, with the message.

Bad SQL in a SparkSql operator (Spark's analysis error) fails the run through both drivers
with Spark's message; in real containers, as an operator whose class the containers
cannot import (a deploy error), it gets no replacement container: the failure count is 1
and no container replaces another.
"""

from __future__ import annotations

import logging
import textwrap

import pytest

from tests.drivers import RunFailed
from tests.e2e.conftest import container_logs
from weir.master.client import WeirClient
from weir.operators import Dag
from weir.operators.library import EventGenerator
from weir.operators.spark import SparkSql
from weir.operators.testing import CollectSink

pytestmark = pytest.mark.timeout(240)

ATTRIBUTES = {"STREAMING_WINDOW_SIZE_MILLIS": 200, "HEARTBEAT_INTERVAL_MILLIS": 200,
              "SPARK_WARMUP_ROWS": 0}


def run_until_ended(master, dag: Dag, timeout_s: float = 150):
    """Submits ``dag``; returns the client, the application id and its final info."""
    client = WeirClient(master.address)
    app_id = client.submit(dag.to_descriptor())
    return client, app_id, client.wait(app_id, timeout_s)


def source_into_sink(name: str, source, sink, **attributes) -> Dag:
    """``source`` -> ``sink`` in one container."""
    dag = Dag(name, CONTAINERS=1, **ATTRIBUTES, **attributes)
    into = dag.add_operator("sink", sink)
    dag.add_stream("rows", dag.add_operator("source", source).output, into.input)
    return dag


def assert_failed_in_one_attempt(client: WeirClient, app_id: str, info, operator: str,
                                 master) -> None:
    logs = container_logs(master)
    assert info.state == "FAILED", f"{info.state}: {info.diagnostics}\n{logs}"
    assert (info.recoveries, info.containers_replaced, info.operator_failures) == (0, 0, 1), (
        f"{info}\n{logs}")
    assert all(not c.replaces for c in client.containers(app_id)), "a replacement was launched"
    op = client.operator_stats(app_id, operator)
    assert (op.state, op.failure_count) == ("FAILED", 1)
    assert info.diagnostics.startswith(f"operator {operator!r} ({op.id}) failed: ")
    assert info.diagnostics.endswith("(not retried: this error cannot succeed on retry)")
    assert "\n" not in info.diagnostics


def test_bad_sql_fails_the_run_in_one_attempt_with_sparks_message(run_dag):
    dag = Dag("bad-sql", CONTAINERS=1, MAX_RESTARTS=5, **ATTRIBUTES)
    source = dag.add_operator("source", EventGenerator(rate_per_second=5_000, keys=10))
    sql = dag.add_operator("sql", SparkSql("SELECT no_such_column, count(*) AS n FROM input "
                                           "GROUP BY no_such_column"))
    sink = dag.add_operator("sink", CollectSink())
    dag.add_stream("events", source.output, sql.input)
    dag.add_stream("counts", sql.output, sink.input)
    with pytest.raises(RunFailed) as failed:
        run_dag(dag)
    # Spark's own message, through either driver
    assert "AnalysisException: [UNRESOLVED_COLUMN" in str(failed.value), failed.value
    assert "`no_such_column` cannot be resolved" in str(failed.value)
    master, app_id = failed.value.master, failed.value.app_id
    if master is None:  # the local runner: the error is raised where the run was called
        return
    with WeirClient(master.address) as client:  # MAX_RESTARTS is 5, yet no retry
        info = client.application(app_id)
        assert_failed_in_one_attempt(client, app_id, info, "sql", master)
        # one line, with where the operator called it
        assert "AnalysisException: [UNRESOLVED_COLUMN" in info.diagnostics, info.diagnostics
        assert "(at spark_sql.py:" in info.diagnostics and "in transform)" in info.diagnostics
        # the container log has the whole Python traceback, the plan included
        logs = container_logs(master)
        assert "Traceback (most recent call last)" in logs and "in transform" in logs, logs
        assert "fatal: it cannot succeed on retry" in logs


def test_an_operator_the_containers_cannot_import_fails_the_application_at_once(
        master, tmp_path, monkeypatch, caplog):
    """Its class lives in a module only this process can import: unpickling fails there."""
    caplog.set_level(logging.WARNING, "weir.master")
    module = tmp_path / "weir_only_here.py"
    module.write_text(textwrap.dedent("""
        from weir.operators import Operator, InputPort

        class LocalSink(Operator):
            input = InputPort()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    from weir_only_here import LocalSink  # type: ignore[import-not-found]

    dag = source_into_sink("not-importable", EventGenerator(rate_per_second=1_000, keys=10),
                           LocalSink())
    client, app_id, info = run_until_ended(master, dag, timeout_s=60)
    with client:
        assert_failed_in_one_attempt(client, app_id, info, "sink", master)
        assert "cannot be rebuilt" in info.diagnostics
        assert "No module named 'weir_only_here'" in info.diagnostics


def test_a_kafka_source_that_reaches_no_broker_fails_the_application_at_once(master):
    """At its first deployment: no container relaunched, one message, and the client's own
    repeated complaints come once each, not a line per retry."""
    from weir.operators.library import KafkaSource

    dag = source_into_sink("no-broker", KafkaSource(
        "orders", "127.0.0.1:1", config={"socket.connection.setup.timeout.ms": 2000}),
        CollectSink(), MAX_RESTARTS=5)
    client, app_id, info = run_until_ended(master, dag, timeout_s=90)
    with client:
        assert_failed_in_one_attempt(client, app_id, info, "source", master)
        assert "no Kafka broker answers at '127.0.0.1:1'" in info.diagnostics
    refused = [line for line in container_logs(master).splitlines()
               if "Connection refused" in line]
    assert len(refused) <= 3, "\n".join(refused)  # one per kind a minute (metadata: 10 s)

"""Bad values are refused at submit, with a short reply: attributes out of their range or
not fitting together, names too long, schema bytes that are not Arrow; and a request
naming something with a 3 MB id gets a readable NOT_FOUND."""

from __future__ import annotations

import grpc
import pytest

from tests.master.fakes import chain_dag, chain_descriptor
from weir.master.client import WeirClient, WeirClientError
from weir.master.launcher import RecordingLauncher
from weir.master.server import MasterServer
from weir.operators.attributes import InvalidAttribute
from weir.operators.dag import Dag

pytestmark = pytest.mark.timeout(60)

HUGE = "x" * (3 << 20)


@pytest.fixture(scope="module")
def client():
    master = MasterServer(launcher_factory=RecordingLauncher)
    master.start()
    try:
        with WeirClient(master.address, timeout_s=30, secret=master.secret) as weir:
            yield weir
    finally:
        master.stop()


def refused(call, *args, **kwargs) -> WeirClientError:
    with pytest.raises(WeirClientError) as error:
        call(*args, **kwargs)
    assert len(str(error.value)) < 1_000, str(error.value)[:200]
    return error.value


@pytest.mark.parametrize("name, value, says", [
    ("HEARTBEAT_TIMEOUT_MILLIS", "1", "1 is outside 100..3,600,000 ms"),
    ("STREAMING_WINDOW_SIZE_MILLIS", str(2 ** 70), "is outside 1..3,600,000 ms"),
    ("HEARTBEAT_INTERVAL_MILLIS", "0", "0 is outside 10..60,000 ms"),
    ("CHECKPOINT_WINDOW_COUNT", str(10 ** 12), "is outside 1..1,000,000"),
    ("STATE_DIR", "/tmp/" + "d" * 5000, "longer than 4,096"),
    ("SPARK_MASTER", "local[2]\0", "NUL"),
])
def test_an_attribute_out_of_its_range_is_refused_at_submit(client, name, value, says):
    error = refused(client.submit, chain_descriptor(1), {"CONTAINERS": "1", name: value})
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert name in str(error) and says in str(error)


def test_a_heartbeat_timeout_below_twice_the_interval_is_refused(client):
    error = refused(client.submit, chain_descriptor(1), {
        "HEARTBEAT_INTERVAL_MILLIS": "1000", "HEARTBEAT_TIMEOUT_MILLIS": "1500"})
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "less than twice HEARTBEAT_INTERVAL_MILLIS=1000" in str(error)


def test_a_restart_backoff_maximum_below_its_first_delay_is_refused(client):
    error = refused(client.submit, chain_descriptor(1), {
        "RESTART_BACKOFF_MILLIS": "5000", "RESTART_BACKOFF_MAX_MILLIS": "1000"})
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "RESTART_BACKOFF_MAX_MILLIS=1000 is less than RESTART_BACKOFF_MILLIS=5000" in str(
        error)


def test_an_attribute_out_of_range_is_refused_in_the_dag_code_already():
    with pytest.raises(InvalidAttribute, match="is outside 1..3,600,000 ms"):
        Dag("wc", STREAMING_WINDOW_SIZE_MILLIS=2 ** 70)


def test_a_huge_id_in_a_request_is_echoed_cut(client):
    for call in (client.application, client.operators, client.kill_container):
        error = refused(call, HUGE)
        assert error.code == grpc.StatusCode.NOT_FOUND
        assert f"({len(HUGE):,} characters)" in str(error)


def test_a_name_too_long_is_refused_at_submit(client):
    dag = chain_descriptor(1)
    dag.operators[0].name = "o" * 10_000
    error = refused(client.submit, dag, {})
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "10,000 characters" in str(error) and "1 to 200 printable characters" in str(error)


def test_schema_bytes_that_are_not_arrow_are_refused_at_submit(client):
    dag = chain_dag(1).to_descriptor()
    dag.operators[0].outputs[0].schema = b"\xff\xff\xff\xff" + b"not arrow" * 10
    error = refused(client.submit, dag, {})
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"port {dag.operators[0].name}.{dag.operators[0].outputs[0].name} declares a " \
           "schema that is not an Arrow schema" in str(error)

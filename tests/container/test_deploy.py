"""Deployment details that need no process: inputs of an upstream that already ended."""

from container.control import Kind
from container.deploy import Deployment, stream_id
from proto import plan_pb2


def test_input_of_an_ended_upstream_just_ends_without_subscribing():
    info = plan_pb2.InputDeployInfo(port_name="input", source_node_id=4,
                                    source_port_name="output",
                                    context_attributes={"UPSTREAM_END_WINDOW": "7"})
    messages, cancel = Deployment._subscriber(info)(3)  # no buffer server is running
    assert [(m.kind, m.window_id) for m in messages] == [(Kind.END_STREAM, 7)]
    cancel()


def test_stream_ids_name_operator_and_port():
    assert stream_id(3, "output") == "3.output"

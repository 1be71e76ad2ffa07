"""Deployment details that need no process: inputs of an upstream that already ended."""

import pytest

from container.control import Kind
from container.deploy import DeployError, Deployment, partition_filter, stream_id
from operators.partitioning import PartitionFilter
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


def test_a_partitioned_input_subscribes_with_its_buckets_only():
    info = plan_pb2.InputDeployInfo(port_name="input", source_node_id=4,
                                    source_port_name="output", buffer_server_host="127.0.0.1",
                                    buffer_server_port=1, partition_key_column="word",
                                    partition_mask=63, partition_keys=[1, 4])
    subscription, cancel = Deployment._subscriber(info)(3)
    assert subscription.partition == PartitionFilter("word", 63, frozenset({1, 4}))
    cancel()
    assert partition_filter(plan_pb2.InputDeployInfo(port_name="input")) is None
    with pytest.raises(DeployError, match="do not fit mask"):
        partition_filter(plan_pb2.InputDeployInfo(
            port_name="input", partition_key_column="word", partition_mask=3,
            partition_keys=[9]))

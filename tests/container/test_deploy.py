"""Deployment details that need no process: inputs of an upstream that already ended,
partitioned inputs, and generations replacing one another."""

import time
from pathlib import Path

import cloudpickle
import pyarrow as pa
import pytest

from tests.harness import poll_for
from weir.container.buffer_server import BufferServer
from weir.container.deploy import DeployError, Deployment, partition_filter, stream_id
from weir.container.input_subscriptions import subscriber
from weir.container.stream_messages import Kind
from weir.operators.operator import InputOperator, Operator
from weir.operators.partitioning import PartitionFilter
from weir.operators.ports import InputPort
from weir.proto import plan_pb2


def test_input_of_an_ended_upstream_just_ends_without_subscribing():
    info = plan_pb2.InputDeployInfo(port_name="input", source_node_id=4,
                                    source_port_name="output",
                                    upstream_end_window=7)
    messages, cancel = subscriber(info, None, None, ("", 0))(3)  # no buffer server at all
    assert [(m.kind, m.window_id) for m in messages] == [(Kind.END_STREAM, 7)]
    cancel()


def test_stream_ids_name_operator_and_port():
    assert stream_id(3, "output") == "3.output"


def test_a_partitioned_input_subscribes_with_its_buckets_only():
    info = plan_pb2.InputDeployInfo(port_name="input", source_node_id=4,
                                    source_port_name="output", buffer_server_host="127.0.0.1",
                                    buffer_server_port=1, partition_key_column="word",
                                    partition_mask=63, partition_keys=[1, 4])
    subscription, cancel = subscriber(info, partition_filter(info), None, ("", 0))(3)
    assert subscription.partition == PartitionFilter("word", 63, frozenset({1, 4}))
    cancel()
    assert partition_filter(plan_pb2.InputDeployInfo(port_name="input")) is None
    with pytest.raises(DeployError, match="do not fit mask"):
        partition_filter(plan_pb2.InputDeployInfo(
            port_name="input", partition_key_column="word", partition_mask=3,
            partition_keys=[9]))


class Idle(InputOperator):
    """A source that waits for its activation and then emits nothing, until stopped."""

    def emit_tuples(self) -> bool:
        return True


def idle_info(generation: int, first_generation: int = 1) -> plan_pb2.OperatorDeployInfo:
    return plan_pb2.OperatorDeployInfo(
        id=5, name="idle", type=plan_pb2.OPERATOR_TYPE_INPUT, class_name="Idle",
        payload=cloudpickle.dumps(Idle()), generation=generation,
        first_generation=first_generation)


def test_each_run_has_durable_folders_of_its_own_and_earlier_runs_are_deleted(tmp_path):
    """Issue 36: a second run on a STATE_DIR read the first run's source log as its own
    (and replayed files of another inbox); a run's durable folders are named by its first
    generation, and those of earlier runs go when the next run deploys."""
    state = tmp_path / "state"
    earlier = state / "runs" / "1" / "operators" / "5"
    earlier.mkdir(parents=True)
    (earlier / "log").write_text("the first run's")
    deployment = Deployment("app-0002", "app-0002-c0", BufferServer(), None, 0,  # type: ignore[arg-type]
                            {"STATE_DIR": str(state)}, on_change=lambda: None)
    try:
        deployment.deploy(idle_info(4, first_generation=4))
        runner = deployment.runners[5]
        assert runner.context.durable_dir() == str(state / "runs" / "4" / "operators" / "5")
        assert not runner.context.redeployed and not runner.recovering
        assert not (state / "runs" / "1").exists()
        deployment.deploy(idle_info(5, first_generation=4))
        assert deployment.runners[5].context.redeployed
        assert (state / "runs" / "4").is_dir()  # this run's own: kept
    finally:
        deployment.stop_all()


def test_a_newer_generation_replaces_the_one_running_here_and_fences_it(tmp_path):
    state = tmp_path / "state"
    deployment = Deployment("app-0001", "app-0001-c1", BufferServer(), None, 0,  # type: ignore[arg-type]
                            {"STATE_DIR": str(state)}, on_change=lambda: None)
    try:
        deployment.deploy(idle_info(1))
        first = deployment.runners[5]
        deployment.deploy(idle_info(1))  # the same request again: nothing changes
        assert deployment.runners[5] is first
        deployment.deploy(idle_info(2))  # the old deployment is still running here
        second = deployment.runners[5]
        assert second is not first and second.generation == 2
        assert first.join(5), "the replaced deployment's thread still runs"
        assert (state / "checkpoints" / "5" / "FENCE").read_text().strip() == "2"
        deployment.undeploy([5])
        with pytest.raises(DeployError, match=r"idle \(5\) is not deployed: generation 1 of "
                                              r"operator idle \(5\) is fenced off"):
            deployment.deploy(idle_info(1))  # a stale request
    finally:
        deployment.stop_all()


class Stuck(InputOperator):
    """A source stuck in its first ``emit_tuples`` until ``release`` exists (a file); it
    makes ``entered`` when it gets there."""

    def __init__(self, entered: str, release: str) -> None:
        self.entered, self.release = entered, release

    def emit_tuples(self) -> bool:
        import os
        import pathlib
        import time

        pathlib.Path(self.entered).touch()
        while not os.path.exists(self.release):
            time.sleep(0.02)
        return True


def test_an_operator_counts_as_deployed_until_its_thread_exits(tmp_path):
    """Issue 17, item 6: an undeploy whose thread is stuck leaves it in ``stopping``; no
    new deployment of it starts beside it (the container is restarted instead), and one
    starts once it has exited."""
    entered, release = tmp_path / "entered", tmp_path / "release"
    stuck = plan_pb2.OperatorDeployInfo(
        id=5, name="stuck", type=plan_pb2.OPERATOR_TYPE_INPUT, class_name="Stuck",
        payload=cloudpickle.dumps(Stuck(str(entered), str(release))), generation=1)
    deployment = Deployment("app-0001", "app-0001-c1", BufferServer(), None, 0,  # type: ignore[arg-type]
                            {"STATE_DIR": str(tmp_path / "state")}, on_change=lambda: None,
                            undeploy_wait_s=0.2, redeploy_wait_s=0.2)
    try:
        deployment.deploy(stuck)
        runner = deployment.runners[5]
        deployment.activate([5])
        poll_for(entered.exists, 10, "the source to get stuck in emit_tuples")
        deployment.undeploy([5])
        assert 5 not in deployment.runners and deployment.stopping[5] is runner
        assert runner.alive
        with pytest.raises(DeployError, match=r"its previous deployment in container "
                                              r"app-0001-c1 has not stopped"):
            deployment.deploy(idle_info(2))
        assert 5 not in deployment.runners
        release.touch()
        assert runner.join(5)
        deployment.deploy(idle_info(3))  # now it may start
        assert deployment.runners[5].generation == 3 and 5 not in deployment.stopping
    finally:
        release.touch()
        deployment.stop_all()


class SlowSetup(InputOperator):
    """A source whose ``setup`` waits until ``release`` exists (as one starting a cold
    Spark would); it makes ``entered`` when it gets there."""

    def __init__(self, entered: str, release: str) -> None:
        self.entered, self.release = entered, release

    def setup(self, context) -> None:
        import os
        import pathlib
        import time

        pathlib.Path(self.entered).touch()
        while not os.path.exists(self.release):
            time.sleep(0.02)

    def emit_tuples(self) -> bool:
        return True


def undeployed_in_setup(tmp_path, setup_wait_s: float | None, **attributes: str
                        ) -> tuple[Deployment, Path]:
    """A deployment whose operator 5 was undeployed while its setup waits for the returned
    ``release`` file (as one starting a cold Spark would)."""
    entered, release = tmp_path / "entered", tmp_path / "release"
    slow = plan_pb2.OperatorDeployInfo(
        id=5, name="slow", type=plan_pb2.OPERATOR_TYPE_INPUT, class_name="SlowSetup",
        payload=cloudpickle.dumps(SlowSetup(str(entered), str(release))), generation=1)
    deployment = Deployment("app-0001", "app-0001-c1", BufferServer(), None, 0,  # type: ignore[arg-type]
                            {"STATE_DIR": str(tmp_path / "state"), **attributes},
                            on_change=lambda: None,
                            undeploy_wait_s=0.1, redeploy_wait_s=0.1, setup_wait_s=setup_wait_s)
    deployment.deploy(slow)
    poll_for(entered.exists, 10, "the operator to be in its setup")
    deployment.undeploy([5])
    return deployment, release


def test_a_redeploy_waits_longer_for_an_earlier_deployment_still_in_setup(tmp_path):
    """Its setup (a cold JVM starting) will end: the new deployment waits for it instead
    of having the container restarted, which would start another cold JVM."""
    import threading

    deployment, release = undeployed_in_setup(tmp_path, setup_wait_s=30)
    try:
        assert 5 in deployment.stopping and not deployment.stopping[5].ready
        timer = threading.Timer(1.0, release.touch)  # its setup ends a second later
        timer.start()
        deployment.deploy(idle_info(2))  # waits past redeploy_wait_s, then deploys
        assert deployment.runners[5].generation == 2 and 5 not in deployment.stopping
        timer.join()
    finally:
        release.touch()
        deployment.stop_all()


def test_a_redeploy_gives_up_on_a_setup_that_never_ends_naming_where_it_is(tmp_path):
    deployment, release = undeployed_in_setup(tmp_path, setup_wait_s=0.3)
    try:
        with pytest.raises(DeployError, match=r"(?s)has not stopped within 0 s \(stuck in "
                                              r"setup\?\).*in setup"):
            deployment.deploy(idle_info(2))
    finally:
        release.touch()
        deployment.stop_all()


def test_the_wait_for_a_setup_is_the_applications_setup_timeout_stretched_by_load(
        tmp_path, monkeypatch):
    """SETUP_TIMEOUT_MILLIS sets it, times the machine's load (here 1.5x): 1.5 s + 0.1 s."""
    from weir.container import deploy

    monkeypatch.setattr(deploy, "stretched_ms", lambda ms: ms * 1.5)
    deployment, release = undeployed_in_setup(tmp_path, None, SETUP_TIMEOUT_MILLIS="1000")
    try:
        started = time.monotonic()
        with pytest.raises(DeployError, match=r"has not stopped within 2 s \(stuck in setup"):
            deployment.deploy(idle_info(2))
        assert time.monotonic() - started >= 1.5  # it did wait the stretched bound
    finally:
        release.touch()
        deployment.stop_all()


class Reader(Operator):
    """An operator with one input, which never gets anything here."""

    input = InputPort()


def test_the_schemas_the_master_knew_reach_the_operators_context(tmp_path):
    schema = pa.schema([("a", pa.int64())])
    info = plan_pb2.OperatorDeployInfo(
        id=6, name="reader", type=plan_pb2.OPERATOR_TYPE_GENERIC, class_name="Reader",
        payload=cloudpickle.dumps(Reader()), generation=1, first_generation=1,
        inputs=[plan_pb2.InputDeployInfo(
            port_name="input", declared_stream_id="s", source_node_id=5,
            source_port_name="output", buffer_server_host="127.0.0.1", buffer_server_port=1,
            stream_schema=schema.serialize().to_pybytes())])
    with BufferServer() as server:
        deployment = Deployment("app-0002", "app-0002-c0", server, None, 0,  # type: ignore[arg-type]
                                {"STATE_DIR": str(tmp_path / "state")}, on_change=lambda: None)
        try:
            deployment.deploy(info)
            assert deployment.runners[6].context.input_schemas == {"input": schema}
        finally:
            deployment.stop_all()

"""Errors that cannot succeed on retry are told apart, described in one line and reported fatal.

No Spark session here: PySpark's exception classes are built without a JVM.
"""

from __future__ import annotations

import logging
import pickle

import cloudpickle
import pyarrow as pa
import pytest

from tests.container.test_window_loop import SumPerAppWindow, run, stream
from weir.container.deploy import DeployError, Deployment
from weir.container.heartbeat_loop import HeartbeatLoop
from weir.container.operator_errors import describe_error, is_fatal
from weir.container.runner_phase import RunnerState
from weir.container.stream_messages import Kind
from weir.operators.operator import Operator
from weir.operators.ports import InputPort, OutputPort, SchemaMismatch
from weir.operators.spark import SparkSchemaMismatch
from weir.proto import plan_pb2, umbilical_pb2
from weir.runtime.operator_state import OperatorStateError

pytestmark = pytest.mark.timeout(60)


def raised(exc: BaseException) -> BaseException:
    """``exc`` with a traceback, as an operator's thread catches it."""
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - that is the point
        return caught


# -- classification ----------------------------------------------------------------------------
@pytest.mark.parametrize("exc", [
    pickle.PicklingError("cannot pickle '_thread.lock' object"),
    pickle.UnpicklingError("invalid load key"),
    OperatorStateError("attribute 'conn' of operator 'x' cannot be checkpointed"),
    SchemaMismatch("input port 'a': a batch with columns (m: int64) does not fit"),
    SparkSchemaMismatch("operator 'sql', port 'output': the result has no column(s) ['n']"),
])
def test_errors_that_fail_again_on_every_retry_are_fatal(exc):
    assert is_fatal(exc)


@pytest.mark.parametrize("exc", [
    ValueError("bad tuple"), RuntimeError("boom"), ConnectionResetError("peer went away"),
    OSError(28, "No space left on device"), pa.ArrowInvalid("overflow"), KeyboardInterrupt(),
])
def test_other_errors_are_retried(exc):
    assert not is_fatal(exc)


def test_an_error_raised_from_a_fatal_one_is_fatal():
    try:
        try:
            raise pickle.PicklingError("no")
        except pickle.PicklingError as exc:
            raise RuntimeError("could not save the state") from exc
    except RuntimeError as outer:
        assert is_fatal(outer)
    try:
        try:
            raise pickle.PicklingError("no")
        except pickle.PicklingError:
            raise RuntimeError("an unrelated error while handling it") from None
    except RuntimeError as outer:
        assert not is_fatal(outer)


def test_spark_analysis_errors_are_fatal_unless_a_path_is_missing():
    from pyspark.errors import AnalysisException, ParseException

    assert is_fatal(AnalysisException(message="[UNRESOLVED_COLUMN.WITH_SUGGESTION] `nope`"))
    assert is_fatal(ParseException(message="[PARSE_SYNTAX_ERROR] Syntax error at 'SELEC'"))
    missing = AnalysisException(message="[PATH_NOT_FOUND] Path does not exist: /dev/shm/x")
    missing.getCondition = lambda: "PATH_NOT_FOUND"  # type: ignore[method-assign]
    assert not is_fatal(missing)


# -- the one-line description --------------------------------------------------------------
def test_description_is_one_line_with_the_operators_own_frame():
    library: dict[str, object] = {}
    exec(compile("def sql(query):\n    raise ValueError('\\n[PARSE_SYNTAX_ERROR] at SELEC\\n\\n"
                 "== SQL ==\\nSELEC 1\\n')\n", "/venv/site-packages/pyspark/sql/session.py",
                 "exec"), library)

    def transform():
        library["sql"]("SELEC 1")  # type: ignore[operator]

    try:
        transform()
    except ValueError as exc:
        text = describe_error(exc)
    assert text.startswith("ValueError: [PARSE_SYNTAX_ERROR] at SELEC (at test_fatal_errors.py:")
    assert text.endswith(" in transform)") and "\n" not in text


def test_description_names_the_users_file_for_code_shipped_by_value():
    # cloudpickle 3.1.3 on names code it pickles by value <dynamic-code>; its globals keep
    # the module's __file__, the name the user knows
    app: dict[str, object] = {"__file__": "/home/me/app.py"}
    exec(compile("def process(x):\n    raise ValueError('cannot double this')\n",
                 "<dynamic-code>", "exec"), app)
    try:
        app["process"](1)  # type: ignore[operator]
    except ValueError as exc:
        text = describe_error(exc)
    assert text == "ValueError: cannot double this (at app.py:2 in process)"


def test_description_of_a_huge_message_is_cut():
    text = describe_error(raised(ValueError("x" * 5_000)))
    assert len(text) < 600 and "..." in text


# -- the runner: full traceback in the log, one line and the flag for the master ---------------
class StrictInput(SumPerAppWindow):
    a = InputPort(pa.schema([("y", pa.int64())]))


def test_a_batch_that_does_not_fit_its_port_fails_the_operator_fatally(caplog):
    caplog.set_level(logging.ERROR, "weir.container.window_loop")
    runner, _ = run(StrictInput(), {"a": stream({1: [[1, 2]]})})
    assert runner.state is RunnerState.FAILED and runner.fatal
    assert runner.error.startswith("SchemaMismatch: operator 'op', input port 'a': a batch with "
                                   "columns (x: int64) does not fit the schema (y: int64)")
    heartbeat = runner.heartbeat(500)
    assert (heartbeat.state, heartbeat.fatal, heartbeat.error) == (
        umbilical_pb2.OPERATOR_STATE_FAILED, True, runner.error)
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.exc_info is not None  # the full traceback, in the container's log
    assert "cannot succeed on retry" in record.getMessage()


def test_an_ordinary_error_is_logged_with_its_traceback_and_not_fatal(caplog):
    class Broken(SumPerAppWindow):
        def process(self, port, batch):
            raise ValueError("bad tuple")

    caplog.set_level(logging.ERROR, "weir.container.window_loop")
    runner, _ = run(Broken(), {"a": stream({1: [[1]]})})
    assert runner.state is RunnerState.FAILED and not runner.fatal
    assert not runner.heartbeat(500).fatal
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "Traceback" in caplog.text and 'raise ValueError("bad tuple")' in caplog.text
    assert record.exc_info is not None


class Typed(Operator):
    """Declared schemas on both sides: batches are cast to them."""

    a = InputPort(pa.schema([("x", pa.int32())]))
    output = OutputPort(pa.schema([("x", pa.float64())]))

    def __init__(self, bad_output: bool = False) -> None:
        self.bad_output = bad_output
        self.seen: list[pa.Schema] = []

    def process(self, port, batch):
        self.seen.append(batch.schema)
        self.output.emit(pa.record_batch({"z" if self.bad_output else "x": [1]}))


def test_batches_are_cast_to_declared_port_schemas():
    op = Typed()
    runner, out = run(op, {"a": stream({1: [[1, 2]]})})
    assert runner.state is RunnerState.SHUTDOWN, runner.error
    assert op.seen == [pa.schema([("x", pa.int32())])]
    [data] = [m.batch() for m in out.messages if m.kind == Kind.DATA]
    assert data.schema == pa.schema([("x", pa.float64())])


def test_emitting_what_does_not_fit_an_output_port_is_fatal():
    runner, _ = run(Typed(bad_output=True), {"a": stream({1: [[1]]})})
    assert runner.state is RunnerState.FAILED and runner.fatal
    assert "output port Typed.output: a batch with columns (z: int64)" in runner.error


# -- deploy errors ---------------------------------------------------------------------------
@pytest.fixture
def deployment(tmp_path):
    return Deployment("app-0001", "app-0001-c1", None, None, 0,  # type: ignore[arg-type]
                      {"STATE_DIR": str(tmp_path)}, lambda: None)


def deploy_info(payload: bytes, checkpoint: int = -1) -> plan_pb2.OperatorDeployInfo:
    return plan_pb2.OperatorDeployInfo(id=2, name="relay1", class_name="app.Relay",
                                       payload=payload,
                                       checkpoint=plan_pb2.Checkpoint(window_id=checkpoint))


def test_a_payload_that_cannot_be_unpickled_is_a_fatal_deploy_error(deployment):
    with pytest.raises(DeployError, match="cannot be rebuilt") as caught:
        deployment.deploy(deploy_info(b"\x80\x05not a pickle"))
    assert caught.value.fatal
    with pytest.raises(DeployError, match="payload is a int") as caught:
        deployment.deploy(deploy_info(cloudpickle.dumps(42)))
    assert caught.value.fatal


def test_a_checkpoint_that_cannot_be_read_is_retried(deployment):
    with pytest.raises(DeployError, match="cannot be restored from checkpoint") as caught:
        deployment.deploy(deploy_info(cloudpickle.dumps(SumPerAppWindow()), checkpoint=40))
    assert not caught.value.fatal


class RecordingClient:
    def __init__(self) -> None:
        self.errors: list[tuple[str, list[int], str, int]] = []

    def report_error(self, container_id: str, operators: list[int], msg: str,
                     generation: int = 0) -> None:
        self.errors.append((container_id, list(operators), msg, generation))


def test_a_fatal_deploy_error_goes_in_the_heartbeat_not_to_report_error(deployment):
    client = RecordingClient()
    loop = HeartbeatLoop("app-0001-c1", client, deployment, None,  # type: ignore[arg-type]
                         ("127.0.0.1", 7001), 500)
    response = umbilical_pb2.ContainerHeartbeatResponse(
        deploy_request=[deploy_info(b"garbage")], committed_window_id=-1)
    assert loop.apply(response) is None
    assert loop._wake.is_set()  # the next heartbeat goes at once
    assert loop.deploys.wait_idle(10)  # deploys run in their own thread
    assert client.errors == []
    [report] = deployment.heartbeats(500)
    assert (report.node_id, report.state, report.fatal) == (
        2, umbilical_pb2.OPERATOR_STATE_FAILED, True)
    assert report.error.startswith("operator relay1 (app.Relay) cannot be rebuilt")
    deployment.undeploy([2])
    assert deployment.heartbeats(500) == []
    # a checkpoint that cannot be read: the master restarts the container for another try
    info = deploy_info(cloudpickle.dumps(SumPerAppWindow()), checkpoint=40)
    info.generation = 7
    response = umbilical_pb2.ContainerHeartbeatResponse(deploy_request=[info],
                                                        committed_window_id=-1)
    loop.apply(response)
    assert loop.deploys.wait_idle(10)
    loop.close()
    [(_, operators, msg, generation)] = client.errors
    assert operators == [2] and "cannot be restored" in msg
    assert generation == 7  # which deployment failed: the master blames no newer one
    assert deployment.heartbeats(500) == []


"""The one fake cluster of the master's tests: an application whose containers the test
plays by hand (heartbeats, launcher actions, liveness) with a manual clock; no process,
no gRPC. The plans are chains (source -> relay1 -> sink) and fan-ins."""

from __future__ import annotations

from tests.master.fakes import (
    ManualClock,
    chain_descriptor,
    container_heartbeat,
    operator_report,
    window,
)
from weir.master.application import Application, ApplicationState
from weir.master.heartbeat import process_heartbeat
from weir.master.liveness import check_liveness
from weir.master.physical_plan import ContainerState, OperatorState
from weir.master.planner import build_physical_plan
from weir.operators import InputPort, Operator, OutputPort
from weir.proto import umbilical_pb2

__all__ = ["ABORT", "C0", "C1", "C2", "C3", "FAILED", "RELAY", "SHUTDOWN", "SINK", "SOURCE",
           "Cluster", "Merge", "chain", "checkpointed"]

ABORT = umbilical_pb2.SHUTDOWN_TYPE_ABORT
SHUTDOWN = umbilical_pb2.OPERATOR_STATE_SHUTDOWN
FAILED = umbilical_pb2.OPERATOR_STATE_FAILED
C0, C1, C2, C3 = "app-0001-c0", "app-0001-c1", "app-0001-c2", "app-0001-c3"
SOURCE, RELAY, SINK = 1, 2, 3


class Merge(Operator):
    left = InputPort()
    right = InputPort()
    output = OutputPort()


class Cluster:
    """An application and its containers, played by the test; ports are 7000 + index.

    ``plain_window_ids``: the application's windows count from epoch 0, so the tests'
    window ids are plain counters; else they carry the application's own epoch.
    """

    def __init__(self, descriptor, containers: int, *, plain_window_ids: bool = True,
                 clock: ManualClock | None = None, **overrides: str) -> None:
        self.clock = clock or ManualClock()
        plan = build_physical_plan(descriptor, {"CONTAINERS": str(containers), **overrides},
                                   "app-0001")
        self.app = Application("app-0001", descriptor, plan, self.clock())
        if plain_window_ids:
            self.app.start_window_millis = 0
        for container in plan.containers.values():
            container.transition(ContainerState.ALLOCATED)
            container.allocated_ms = self.clock()
        self.launched: list[str] = []
        self.killed: list[str] = []

    @property
    def ops(self):
        return self.app.plan.operators

    def port(self, cid: str) -> int:
        return 7000 + self.app.plan.containers[cid].index

    def beat(self, cid: str, *reports: umbilical_pb2.OperatorHeartbeat, **fields: object
             ) -> umbilical_pb2.ContainerHeartbeatResponse:
        """One heartbeat of ``cid``; ``fields`` set more of it (``spark_warm=True``)."""
        response = process_heartbeat(self.app, container_heartbeat(
            cid, port=self.port(cid), operators=reports, **fields), self.clock())
        if self.app.plan.containers[cid].loss_request is not None:
            self.liveness()  # as the master loop, woken by the ABORT, does at once
        self._launcher()
        return response

    def report(self, op_id: int, *windows: umbilical_pb2.OperatorStats, state: int = 1,
               error: str = "", fatal: bool = False, ready: bool = True,
               activating: bool = False) -> umbilical_pb2.ContainerHeartbeatResponse:
        """One heartbeat of the operator's current container with the operator's report."""
        cid = self.ops[op_id].container_id
        report = operator_report(op_id, state=state, windows=windows, error=error,
                                 ready=ready)
        report.fatal, report.activating = fatal, activating
        return self.beat(cid, report)

    def liveness(self, exit_codes=None):
        losses = check_liveness(self.app, self.clock(), exit_codes or {}, stop_grace_ms=5000)
        self._launcher()
        return losses

    def _launcher(self) -> None:
        """Does what the master core does with the queued actions."""
        for action in self.app.take_launcher_actions():
            if action.kind == "kill":
                self.killed.append(action.container_id)
            else:
                self.launched.append(action.container_id)
                container = self.app.plan.containers[action.container_id]
                container.transition(ContainerState.ALLOCATED)
                container.allocated_ms = self.clock()

    def deploy_all(self, *, in_setup: tuple[int, ...] = ()) -> None:
        """Deploys every operator; those ``in_setup`` are ACTIVE but not ready yet."""
        for cid in list(self.app.plan.containers):
            self.beat(cid)
        for op in self.ops.values():
            infos = {i.id: i for i in self.beat(op.container_id).deploy_request}
            assert infos[op.id].checkpoint.window_id == -1
            self.report(op.id, ready=op.id not in in_setup)
        assert all(op.state == OperatorState.ACTIVE for op in self.ops.values())
        assert self.app.state == ApplicationState.RUNNING


def chain(*, plain_window_ids: bool = True, **overrides: str) -> Cluster:
    """source (c0) -> relay1 (c1) -> sink (c2); overrides as -D gives them (``__`` for ``.``)."""
    cluster = Cluster(chain_descriptor(3), 3, plain_window_ids=plain_window_ids,
                      **{name.replace("__", "."): value for name, value in overrides.items()})
    cluster.deploy_all()
    return cluster


def checkpointed(cluster: Cluster, op_id: int, *window_ids: int
                 ) -> umbilical_pb2.ContainerHeartbeatResponse:
    """The operator reports windows up to the last id, checkpointed at each of them."""
    return cluster.report(op_id, *(window(w, checkpoint=w, checkpoint_ms=w // 10)
                                   for w in window_ids))

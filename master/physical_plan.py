"""The physical plan: a validated logical DAG becomes numbered operators placed in containers.

Pure data and rules, no I/O. Created once per submitted application; the heartbeat rules
and the master loop then move its operators and containers through their states.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Mapping
from typing import Any

from master.errors import InvalidTransition
from master.state_owner import default_state_dir, new_run_id
from operators.attributes import ATTRIBUTES, InvalidAttribute, Scope, parse_attributes, resolve
from operators.dag import topological_order
from proto import plan_pb2

__all__ = [
    "ContainerState",
    "InputLink",
    "OperatorState",
    "OutputLink",
    "PTContainer",
    "PTOperator",
    "PhysicalPlan",
    "PlanError",
    "build_physical_plan",
    "container_id_for",
    "place_operators",
    "resolve_attributes",
]

_LOGGER = logging.getLogger(__name__)


class PlanError(ValueError):
    """The DAG and its attribute overrides cannot be turned into a physical plan."""


class ContainerState(enum.Enum):
    """Life of a container: NEW -> ALLOCATED (launched) -> ACTIVE (first heartbeat) -> KILLED."""

    NEW = "NEW"
    ALLOCATED = "ALLOCATED"
    ACTIVE = "ACTIVE"
    KILLED = "KILLED"


class OperatorState(enum.Enum):
    """Life of a physical operator: PENDING_DEPLOY -> ACTIVE -> SHUTDOWN | FAILED.

    Recovery sends an operator back: to PENDING_UNDEPLOY while its old instance still
    runs in a surviving container, then to PENDING_DEPLOY until its new instance reports.
    """

    PENDING_DEPLOY = "PENDING_DEPLOY"
    ACTIVE = "ACTIVE"
    SHUTDOWN = "SHUTDOWN"
    FAILED = "FAILED"
    PENDING_UNDEPLOY = "PENDING_UNDEPLOY"


_CONTAINER_NEXT: dict[ContainerState, frozenset[ContainerState]] = {
    ContainerState.NEW: frozenset({ContainerState.ALLOCATED, ContainerState.KILLED}),
    ContainerState.ALLOCATED: frozenset({ContainerState.ACTIVE, ContainerState.KILLED}),
    ContainerState.ACTIVE: frozenset({ContainerState.KILLED}),
    ContainerState.KILLED: frozenset(),
}

# An operator may finish or fail before the master heard it was ACTIVE (a short window).
# Recovery may take any operator back to PENDING_UNDEPLOY (its old instance must stop
# first) or straight to PENDING_DEPLOY (its container is gone).
_RECOVER = frozenset({OperatorState.PENDING_UNDEPLOY, OperatorState.PENDING_DEPLOY})
_OPERATOR_NEXT: dict[OperatorState, frozenset[OperatorState]] = {
    OperatorState.PENDING_DEPLOY: frozenset(
        {OperatorState.ACTIVE, OperatorState.SHUTDOWN, OperatorState.FAILED,
         OperatorState.PENDING_UNDEPLOY}),
    OperatorState.ACTIVE: frozenset({OperatorState.SHUTDOWN, OperatorState.FAILED, *_RECOVER}),
    OperatorState.SHUTDOWN: _RECOVER,
    OperatorState.FAILED: _RECOVER,
    OperatorState.PENDING_UNDEPLOY: frozenset({OperatorState.PENDING_DEPLOY,
                                               OperatorState.FAILED}),
}


@dataclasses.dataclass(frozen=True)
class InputLink:
    """One subscribed input port: which upstream operator's output port feeds it."""

    port_name: str
    stream_name: str
    source_operator_id: int
    source_port_name: str


@dataclasses.dataclass(frozen=True)
class OutputLink:
    """One published output port and the logical stream it carries."""

    port_name: str
    stream_name: str


@dataclasses.dataclass(eq=False)
class PTOperator:
    """A physical operator: one partition of a logical operator, deployed in one container.

    Created with the plan; lives as long as its application.
    """

    id: int
    name: str
    class_name: str
    type: int  # plan_pb2.OperatorType
    payload: bytes
    attributes: dict[str, Any]
    container_id: str = ""
    inputs: list[InputLink] = dataclasses.field(default_factory=list)
    outputs: list[OutputLink] = dataclasses.field(default_factory=list)
    state: OperatorState = OperatorState.PENDING_DEPLOY
    error: str = ""
    failure_count: int = 0  # every failure over the application's life
    failures_in_a_row: int = 0  # failures since its last new checkpoint (MAX_RESTARTS)
    recovery_window_id: int = -1
    deploy_window_id: int = -1  # the checkpoint its next (or current) instance starts from
    ready: bool = False  # its container reported setup() done
    ready_ms: int = 0  # when its current instance was deployed or reported ready

    @property
    def is_input(self) -> bool:
        return self.type == plan_pb2.OPERATOR_TYPE_INPUT

    @property
    def terminal(self) -> bool:
        return self.state in (OperatorState.SHUTDOWN, OperatorState.FAILED)

    @property
    def pending(self) -> bool:
        """Between instances: its recovery checkpoint is frozen until it runs again."""
        return self.state in (OperatorState.PENDING_DEPLOY, OperatorState.PENDING_UNDEPLOY)

    @property
    def processing_mode(self) -> str:
        return str(self.attributes.get("PROCESSING_MODE", "AT_LEAST_ONCE"))

    def transition(self, to: OperatorState) -> bool:
        """Moves to ``to``; False if already there; raises InvalidTransition if not allowed."""
        if to == self.state:
            return False
        if to not in _OPERATOR_NEXT[self.state]:
            raise InvalidTransition(f"operator {self.name!r} ({self.id})", self.state, to)
        self.state = to
        return True

    def attribute_text(self) -> dict[str, str]:
        return {name: str(value) for name, value in self.attributes.items()}


@dataclasses.dataclass(eq=False)
class PTContainer:
    """The master's view of one container process and the operators placed in it.

    Created with the plan (NEW); ALLOCATED when launched, ACTIVE from its first
    heartbeat, KILLED when it is lost, killed or has exited. A lost container of a
    running application is replaced by a new one (``replaced_by``) that takes its
    operators; ``operator_ids`` keeps the operators it held, for the record.
    """

    id: str
    index: int
    operator_ids: list[int] = dataclasses.field(default_factory=list)
    replaces: str = ""
    replaced_by: str = ""
    state: ContainerState = ContainerState.NEW
    buffer_server_host: str = ""
    buffer_server_port: int = 0
    allocated_ms: int = 0
    activated_ms: int = 0
    finished_ms: int = 0
    diagnostics: str = ""

    @property
    def buffer_server_address(self) -> str:
        if not self.buffer_server_host:
            return ""
        return f"{self.buffer_server_host}:{self.buffer_server_port}"

    def transition(self, to: ContainerState) -> bool:
        """Moves to ``to``; False if already there; raises InvalidTransition if not allowed."""
        if to == self.state:
            return False
        if to not in _CONTAINER_NEXT[self.state]:
            raise InvalidTransition(f"container {self.id}", self.state, to)
        self.state = to
        return True


@dataclasses.dataclass(eq=False)
class PhysicalPlan:
    """Physical operators (ids 1..N in topological order) and the containers they live in."""

    app_id: str
    name: str
    attributes: dict[str, Any]
    operators: dict[int, PTOperator]
    containers: dict[str, PTContainer]

    def container(self, container_id: str) -> PTContainer | None:
        return self.containers.get(container_id)

    def operator_by_name(self, name: str) -> PTOperator | None:
        return next((op for op in self.operators.values() if op.name == name), None)

    def operators_in(self, container: PTContainer) -> list[PTOperator]:
        """The operators placed in ``container`` now (none once it was replaced)."""
        return [self.operators[i] for i in container.operator_ids
                if self.operators[i].container_id == container.id]

    def upstream_ids(self, operator_id: int) -> list[int]:
        """Physical ids of the operators feeding ``operator_id``, without repeats."""
        ids = [link.source_operator_id for link in self.operators[operator_id].inputs]
        return list(dict.fromkeys(ids))

    def downstream_ids(self, operator_id: int) -> list[int]:
        """Physical ids of the operators ``operator_id`` feeds, without repeats, ascending."""
        return [op.id for op in self.operators.values()
                if any(link.source_operator_id == operator_id for link in op.inputs)]

    def live_containers(self) -> list[PTContainer]:
        return [c for c in self.containers.values() if c.state != ContainerState.KILLED]

    def next_container_index(self) -> int:
        return max((c.index for c in self.containers.values()), default=-1) + 1

    def container_of(self, operator_id: int) -> PTContainer:
        return self.containers[self.operators[operator_id].container_id]

    def attribute_text(self) -> dict[str, str]:
        return {name: str(value) for name, value in self.attributes.items()}


def container_id_for(app_id: str, index: int) -> str:
    """The id of container number ``index`` of an application, e.g. ``app-0001-c0``."""
    return f"{app_id}-c{index}"


def _split_overrides(dag: plan_pb2.DagDescriptor, overrides: Mapping[str, str]
                     ) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Plain overrides and per-operator ones (``<operator>.<ATTR>``), checked."""
    names = [op.name for op in dag.operators]
    plain: dict[str, str] = {}
    per_operator: dict[str, dict[str, str]] = {name: {} for name in names}
    for key, value in overrides.items():
        if "." in key:
            operator, attribute = key.rsplit(".", 1)
            if operator not in per_operator:
                raise PlanError(f"attribute override {key!r} names unknown operator "
                                f"{operator!r}; the operators are {names}")
            scope, target = Scope.OPERATOR, per_operator[operator]
        else:
            attribute, scope, target = key, Scope.BOTH, plain
        try:
            parse_attributes({attribute: value}, scope)
        except InvalidAttribute as exc:
            raise PlanError(f"attribute override {key}={value}: {exc}") from None
        target[attribute] = str(value)
    return plain, per_operator


def resolve_attributes(dag: plan_pb2.DagDescriptor, overrides: Mapping[str, str]
                       ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Typed DAG attributes and each operator's typed context attributes.

    DAG attributes: defaults <- DAG <- plain overrides. Operator context attributes
    (every attribute): defaults <- DAG <- plain overrides <- the operator's own <-
    overrides named ``<operator>.<ATTR>``.

    Raises:
        PlanError: an override names an unknown attribute or operator, or has a bad value.
    """
    plain, per_operator = _split_overrides(dag, overrides)
    dag_layer = dict(dag.attributes)
    dag_attributes = {
        name: resolve(name, plain, dag_layer)
        for name, attribute in ATTRIBUTES.items() if attribute.scope & Scope.DAG
    }
    operator_attributes = {
        op.name: {name: resolve(name, per_operator[op.name], dict(op.attributes), plain, dag_layer)
                  for name in ATTRIBUTES}
        for op in dag.operators
    }
    return dag_attributes, operator_attributes


def place_operators(order: list[str], pinned: Mapping[str, int], containers: int
                    ) -> dict[str, int]:
    """Container index of every operator.

    Pinned operators go to their container; the others, in ``order``, are cut into
    contiguous chunks so that containers end up as evenly loaded as possible.

    Args:
        order: operator names in topological order.
        pinned: operator name -> 0-based container index (the CONTAINER attribute).
        containers: the CONTAINERS attribute.

    Raises:
        PlanError: a pinned index is outside 0..containers-1.
    """
    for name, index in pinned.items():
        if not 0 <= index < containers:
            raise PlanError(f"operator {name!r} has CONTAINER={index} but the application has "
                            f"CONTAINERS={containers} (containers 0..{containers - 1}); "
                            "raise CONTAINERS or pin it to an existing container")
    slots = min(containers, len(order))
    slots = max([slots, *(i + 1 for i in pinned.values())])
    load = [0] * slots
    for index in pinned.values():
        load[index] += 1
    free = [name for name in order if name not in pinned]
    counts = [0] * slots
    for _ in free:
        target = min(range(slots), key=lambda i: (load[i], i))
        load[target] += 1
        counts[target] += 1
    placement = dict(pinned)
    position = 0
    for index, count in enumerate(counts):
        for name in free[position:position + count]:
            placement[name] = index
        position += count
    return placement


def build_physical_plan(dag: plan_pb2.DagDescriptor, overrides: Mapping[str, str],
                        app_id: str, run_id: str = "") -> PhysicalPlan:
    """The physical plan of a DAG already checked by ``validate_descriptor``.

    Raises:
        PlanError: bad overrides or placement.
    """
    dag_attributes, operator_attributes = resolve_attributes(dag, overrides)
    order = topological_order(dag)
    pinned: dict[str, int] = {}
    for name in order:
        index = operator_attributes[name]["CONTAINER"]
        if index < -1:
            raise PlanError(f"operator {name!r} has CONTAINER={index}; use a container number "
                            "from 0, or -1 to let the master place it")
        if index >= 0:
            pinned[name] = index
    placement = place_operators(order, pinned, dag_attributes["CONTAINERS"])
    _check_processing_modes(order, operator_attributes)
    if not dag_attributes["STATE_DIR"]:
        dag_attributes["STATE_DIR"] = default_state_dir(app_id, run_id or new_run_id())
    for attributes in operator_attributes.values():
        attributes["STATE_DIR"] = dag_attributes["STATE_DIR"]
    descriptors = {op.name: op for op in dag.operators}
    ids = {name: number for number, name in enumerate(order, start=1)}
    containers: dict[str, PTContainer] = {}
    for index in sorted(set(placement.values())):
        cid = container_id_for(app_id, index)
        containers[cid] = PTContainer(id=cid, index=index)
    operators: dict[int, PTOperator] = {}
    for name in order:
        desc = descriptors[name]
        cid = container_id_for(app_id, placement[name])
        op = PTOperator(
            id=ids[name], name=name, class_name=desc.class_name,
            type=(plan_pb2.OPERATOR_TYPE_INPUT if desc.kind == plan_pb2.OPERATOR_KIND_INPUT
                  else plan_pb2.OPERATOR_TYPE_GENERIC),
            payload=desc.payload, attributes=operator_attributes[name], container_id=cid)
        operators[op.id] = op
        containers[cid].operator_ids.append(op.id)
    _link_streams(dag, ids, operators)
    return PhysicalPlan(app_id=app_id, name=dag.name, attributes=dag_attributes,
                        operators=operators, containers=containers)


def _check_processing_modes(order: list[str],
                            operator_attributes: Mapping[str, Mapping[str, Any]]) -> None:
    """EXACTLY_ONCE needs a checkpoint after every window (Apex's rule).

    Raises:
        PlanError: an EXACTLY_ONCE operator checkpoints less often.
    """
    for name in order:
        attributes = operator_attributes[name]
        if (attributes["PROCESSING_MODE"] == "EXACTLY_ONCE"
                and attributes["CHECKPOINT_WINDOW_COUNT"] != 1):
            raise PlanError(
                f"operator {name!r} has PROCESSING_MODE=EXACTLY_ONCE but "
                f"CHECKPOINT_WINDOW_COUNT={attributes['CHECKPOINT_WINDOW_COUNT']}; exactly-once "
                "needs a checkpoint after every window: set "
                f"-D {name}.CHECKPOINT_WINDOW_COUNT=1 (or use AT_LEAST_ONCE)")


def _link_streams(dag: plan_pb2.DagDescriptor, ids: Mapping[str, int],
                  operators: Mapping[int, PTOperator]) -> None:
    port_order = {
        op.name: {p.name: i for i, p in enumerate([*op.inputs, *op.outputs])}
        for op in dag.operators
    }
    for stream in dag.streams:
        source = operators[ids[stream.source_operator]]
        if all(link.port_name != stream.source_port for link in source.outputs):
            source.outputs.append(OutputLink(stream.source_port, stream.name))
        for sink in stream.sinks:
            operators[ids[sink.operator]].inputs.append(
                InputLink(sink.port, stream.name, source.id, stream.source_port))
    for op in operators.values():
        rank = port_order[op.name]
        op.inputs.sort(key=lambda link: rank.get(link.port_name, 0))
        op.outputs.sort(key=lambda link: rank.get(link.port_name, 0))


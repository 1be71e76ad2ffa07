"""The physical plan: a validated logical DAG becomes numbered operators placed in containers.

Pure data and rules, no I/O. Created once per submitted application; the heartbeat rules
and the master loop then move its operators and containers through their states.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
from collections.abc import Mapping
from typing import Any

import cloudpickle

from master.errors import InvalidTransition, PlanError
from master.processing_modes import check_processing_modes
from master.state_owner import default_state_dir, new_run_id
from operators.attributes import (
    ATTRIBUTES,
    InvalidAttribute,
    ProcessingMode,
    Scope,
    parse_attributes,
    resolve,
)
from operators.dag import topological_order
from operators.partitioning import partition_keys
from operators.unifiers import ConcatUnifier, unifier_input
from proto import plan_pb2

__all__ = [
    "ContainerState",
    "InputLink",
    "OperatorState",
    "OutputLink",
    "PartitionSpec",
    "PTContainer",
    "PTOperator",
    "PhysicalPlan",
    "PlanError",
    "build_physical_plan",
    "StateSeed",
    "container_id_for",
    "instance_names",
    "instantiate",
    "place_operators",
    "spread",
    "resolve_attributes",
]

_LOGGER = logging.getLogger(__name__)


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
    # SHUTDOWN: a retired operator (removed by a repartition) once it is undeployed
    OperatorState.PENDING_UNDEPLOY: frozenset({OperatorState.PENDING_DEPLOY,
                                               OperatorState.FAILED, OperatorState.SHUTDOWN}),
}


@dataclasses.dataclass(frozen=True)
class PartitionSpec:
    """One partition's share of a stream: rows whose ``column`` hashes (``& mask``) into
    ``keys`` (Apex's partition mask and keys; ``operators.partitioning`` filters)."""

    column: str
    mask: int
    keys: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class StateSeed:
    """How an operator made by a repartition gets its first checkpoint, at ``window_id``:
    from the checkpoints there of the old partitions ``from_ids`` (none: its payload),
    cut to ``share`` (None: every key). ``retired_ids``: the operators the repartition
    removed, whose checkpoints its container deletes once the committed window passes."""

    window_id: int
    from_ids: tuple[int, ...] = ()
    share: PartitionSpec | None = None
    retired_ids: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class InputLink:
    """One subscribed input port: which upstream operator's output port feeds it, and the
    partition of that stream it takes (None: all of it)."""

    port_name: str
    stream_name: str
    source_operator_id: int
    source_port_name: str
    partition: PartitionSpec | None = None


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
    logical_name: str = ""  # the DAG's operator it is a partition (or the unifier) of
    partition_index: int = 0
    partition_count: int = 1
    seed: StateSeed | None = None  # made by a repartition: how its first checkpoint is built
    share: PartitionSpec | None = None  # the keys this partition takes (None: every key)
    # its deployment's number: 1, then one more at every redeploy (the fence of its writes)
    generation: int = 1
    recovering: bool = False  # its container says: redeployed, no window finished yet

    @property
    def shown_state(self) -> str:
        """The state users see: RECOVERING while a redeployed instance is ACTIVE but has
        not finished a window yet (restoring, starting Spark, replaying)."""
        if self.state == OperatorState.ACTIVE and self.recovering:
            return "RECOVERING"
        return self.state.value

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
    def processing_mode(self) -> ProcessingMode:
        return ProcessingMode(self.attributes.get("PROCESSING_MODE",
                                                  ProcessingMode.AT_LEAST_ONCE))

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
    ended_with_app: bool = False  # stopped because its application ended: not a failure

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
    """Physical operators and the containers they live in.

    Ids are 1..N in topological order when the plan is built; a repartition adds
    operators with new ids (``topological_ids`` gives the order then).
    """

    app_id: str
    name: str
    attributes: dict[str, Any]
    operators: dict[int, PTOperator]
    containers: dict[str, PTContainer]
    # operators a repartition removed: PENDING_UNDEPLOY until their container lets them go,
    # then SHUTDOWN; kept for their figures. Their ids are never used again.
    retired: dict[int, PTOperator] = dataclasses.field(default_factory=dict)

    def next_operator_id(self) -> int:
        return max([0, *self.operators, *self.retired]) + 1

    def instances(self, logical_name: str) -> list[PTOperator]:
        """The physical operators of a DAG operator, in partition order (no unifiers)."""
        return [op for op in self.operators.values() if op.logical_name == logical_name
                and op.type != plan_pb2.OPERATOR_TYPE_UNIFIER]

    def container(self, container_id: str) -> PTContainer | None:
        return self.containers.get(container_id)

    def operator_by_name(self, name: str) -> PTOperator | None:
        return next((op for op in self.operators.values() if op.name == name), None)

    def operators_in(self, container: PTContainer) -> list[PTOperator]:
        """The operators placed in ``container`` now (none once it was replaced)."""
        return [op for i in container.operator_ids
                if (op := self.operators.get(i)) is not None and op.container_id == container.id]

    def retired_in(self, container: PTContainer) -> list[PTOperator]:
        """Retired operators still waiting for ``container`` to undeploy them."""
        return [op for op in self.retired.values() if op.container_id == container.id
                and op.state == OperatorState.PENDING_UNDEPLOY]

    def upstream_ids(self, operator_id: int) -> list[int]:
        """Physical ids of the operators feeding ``operator_id``, without repeats."""
        ids = [link.source_operator_id for link in self.operators[operator_id].inputs]
        return list(dict.fromkeys(ids))

    def downstream_ids(self, operator_id: int) -> list[int]:
        """Physical ids of the operators ``operator_id`` feeds, without repeats, ascending."""
        return self.downstream_map()[operator_id]

    def downstream_map(self) -> dict[int, list[int]]:
        """Every operator's ``downstream_ids`` at once (the one place they are derived)."""
        downstream: dict[int, list[int]] = {op_id: [] for op_id in self.operators}
        for op in self.operators.values():
            for upstream in self.upstream_ids(op.id):
                downstream[upstream].append(op.id)
        for ids in downstream.values():
            ids.sort()
        return downstream

    def topological_ids(self) -> list[int]:
        """Operator ids, each after every operator feeding it (ids alone are in that
        order only until a repartition adds operators)."""
        # id -> how many of its upstream operators are not ordered yet
        waiting = {op_id: len(self.upstream_ids(op_id)) for op_id in self.operators}
        downstream = self.downstream_map()
        ready = collections.deque(op_id for op_id, n in waiting.items() if not n)
        order: list[int] = []
        while ready:
            op_id = ready.popleft()
            order.append(op_id)
            for down in downstream[op_id]:
                waiting[down] -= 1
                if not waiting[down]:
                    ready.append(down)
        return order

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

    An operator with ``PARTITIONS=N`` becomes N physical operators ``name#0`` ...
    (``logical_name`` keeps the DAG's name), spread over different containers. Each
    partition reads its share of an unpartitioned upstream stream (a ``PartitionSpec``
    on ``PARTITION_KEY``), or, with ``PARALLEL_PARTITION``, partition i of its upstream.
    Where a partitioned operator feeds one that is not its parallel partner, a unifier
    (the operator's ``unifier()``, else ``ConcatUnifier``) is placed with each reading
    instance and merges the partitions; it takes the reader's share when the reader is
    partitioned. Physical ids stay in topological order (unifiers before their reader).

    Raises:
        PlanError: bad overrides, placement or partitioning.
    """
    dag_attributes, operator_attributes = resolve_attributes(dag, overrides)
    order = topological_order(dag)
    descriptors = {op.name: op for op in dag.operators}
    counts = _partition_counts(dag, order, descriptors, operator_attributes)
    pinned: dict[str, int] = {}
    for name in order:
        index = operator_attributes[name]["CONTAINER"]
        if index < -1:
            raise PlanError(f"operator {name!r} has CONTAINER={index}; use a container number "
                            "from 0, or -1 to let the master place it")
        if index >= 0:
            pinned.update((unit, index) for unit in instance_names(name, counts[name]))
    containers_wanted = dag_attributes["CONTAINERS"]
    _spread_partitions(order, counts, pinned, containers_wanted)
    units = [unit for name in order for unit in instance_names(name, counts[name])]
    placement = place_operators(units, pinned, containers_wanted)
    check_processing_modes(dag, order, operator_attributes)
    if not dag_attributes["STATE_DIR"]:
        dag_attributes["STATE_DIR"] = default_state_dir(app_id, run_id or new_run_id())
    for attributes in operator_attributes.values():
        attributes["STATE_DIR"] = dag_attributes["STATE_DIR"]
    containers: dict[str, PTContainer] = {}
    for index in sorted(set(placement.values())):
        cid = container_id_for(app_id, index)
        containers[cid] = PTContainer(id=cid, index=index)
    operators = instantiate(dag, operator_attributes, counts, app_id, placement)
    for op in operators.values():
        containers[op.container_id].operator_ids.append(op.id)
    return PhysicalPlan(app_id=app_id, name=dag.name, attributes=dag_attributes,
                        operators=operators, containers=containers)


def instantiate(dag: plan_pb2.DagDescriptor, operator_attributes: Mapping[str, dict[str, Any]],
                counts: Mapping[str, int], app_id: str, placement: Mapping[str, int]
                ) -> dict[int, PTOperator]:
    """The physical operators of ``dag`` with ``counts`` partitions each, numbered 1..N in
    topological order, unifiers inserted, in the containers ``placement`` gives each
    instance name (``name`` or ``name#i``; a unifier goes with its reader)."""
    descriptors = {op.name: op for op in dag.operators}
    builder = _Builder(dag, descriptors, operator_attributes, counts, app_id, placement)
    for name in topological_order(dag):
        builder.add(name)
    return builder.operators


def instance_names(name: str, count: int) -> list[str]:
    """The physical names of a logical operator: itself, or ``name#0`` ... when partitioned."""
    return [name] if count == 1 else [f"{name}#{i}" for i in range(count)]


def _upstream(dag: plan_pb2.DagDescriptor, name: str) -> list[str]:
    return list(dict.fromkeys(stream.source_operator for stream in dag.streams
                              if any(sink.operator == name for sink in stream.sinks)))


def _partition_counts(dag: plan_pb2.DagDescriptor, order: list[str],
                      descriptors: Mapping[str, plan_pb2.OperatorDescriptor],
                      operator_attributes: Mapping[str, dict[str, Any]]) -> dict[str, int]:
    """Each operator's number of partitions; sets PARTITIONS of parallel partitions.

    Raises:
        PlanError: a partitioned source, a partitioned operator without PARTITION_KEY, or
            PARALLEL_PARTITION without upstream partitions of one count.
    """
    counts: dict[str, int] = {}
    for name in order:
        attributes = operator_attributes[name]
        count = attributes["PARTITIONS"]
        if attributes["PARALLEL_PARTITION"]:
            upstream = _upstream(dag, name)
            upstream_counts = {counts[u] for u in upstream}
            if not upstream or len(upstream_counts) != 1 or 1 in upstream_counts:
                raise PlanError(
                    f"operator {name!r} has PARALLEL_PARTITION=true but its upstream "
                    f"operators {upstream} are not all partitioned alike (PARTITIONS "
                    f"{[counts[u] for u in upstream]}); parallel partitions follow "
                    "partitioned upstream operators of one count")
            (parallel,) = upstream_counts
            if count not in (1, parallel):
                raise PlanError(f"operator {name!r} has PARALLEL_PARTITION=true and "
                                f"PARTITIONS={count}, but its upstream has {parallel} "
                                "partitions; leave PARTITIONS out (it follows the upstream)")
            count = attributes["PARTITIONS"] = parallel
        elif count > 1:
            if descriptors[name].kind == plan_pb2.OPERATOR_KIND_INPUT:
                if not descriptors[name].splits_input:
                    raise PlanError(
                        f"operator {name!r} ({descriptors[name].class_name}) is a source with "
                        f"PARTITIONS={count} that does not split its input: each partition "
                        "would emit all of it; partition the operators it feeds, or use a "
                        "source with SPLITS_INPUT (TextFileSource, DirectorySource)")
            elif not attributes["PARTITION_KEY"]:
                raise PlanError(f"operator {name!r} has PARTITIONS={count} but no "
                                "PARTITION_KEY: set it to the input column whose hash splits "
                                f"its streams, e.g. -D {name}.PARTITION_KEY=word")
        counts[name] = count
    return counts


def _spread_partitions(order: list[str], counts: Mapping[str, int], pinned: dict[str, int],
                       containers: int) -> None:
    """Pins the partitions of each partitioned operator to different containers, the least
    loaded first, so that its partitions really run side by side."""
    load = dict.fromkeys(range(containers), 0)
    for index in pinned.values():
        if 0 <= index < containers:
            load[index] += 1
    for name in order:
        units = instance_names(name, counts[name])
        if counts[name] == 1 or units[0] in pinned:
            continue
        pinned.update(spread(units, load))


def spread(units: list[str], load: dict[int, int]) -> dict[str, int]:
    """Container index per unit (the partitions of one operator): the least loaded of the
    containers in ``load`` first, each unit on another one while there are enough.
    ``load`` (operators per container index) counts the units placed."""
    placement: dict[str, int] = {}
    targets: list[int] = []
    for position, unit in enumerate(units):
        if position % len(load) == 0:
            targets = sorted(load, key=lambda i: (load[i], i))
        target = targets[position % len(load)]
        placement[unit] = target
        load[target] += 1
    return placement


class _Builder:
    """Makes the physical operators of one plan, numbering them in topological order."""

    def __init__(self, dag: plan_pb2.DagDescriptor,
                 descriptors: Mapping[str, plan_pb2.OperatorDescriptor],
                 operator_attributes: Mapping[str, dict[str, Any]], counts: Mapping[str, int],
                 app_id: str, placement: Mapping[str, int]) -> None:
        self.dag = dag
        self.descriptors = descriptors
        self.attributes = operator_attributes
        self.counts = counts
        self.app_id = app_id
        self.placement = placement
        self.operators: dict[int, PTOperator] = {}
        self.instances: dict[str, list[PTOperator]] = {}
        self.port_order = {op.name: {p.name: i for i, p in enumerate([*op.inputs, *op.outputs])}
                           for op in dag.operators}
        # readers needing a unifier per partitioned operator: one unifier keeps a short name
        self.unifiers_of: dict[str, int] = {}
        for stream in dag.streams:
            if counts[stream.source_operator] > 1:
                for sink in stream.sinks:
                    if not operator_attributes[sink.operator]["PARALLEL_PARTITION"]:
                        self.unifiers_of[stream.source_operator] = (
                            self.unifiers_of.get(stream.source_operator, 0)
                            + counts[sink.operator])

    def _new_id(self) -> int:
        return len(self.operators) + 1

    def add(self, name: str) -> None:
        """Adds the operator's instances, each after the unifiers that feed it."""
        desc = self.descriptors[name]
        count = self.counts[name]
        mask, keys = partition_keys(count) if count > 1 else (0, [])
        key_column = self.attributes[name]["PARTITION_KEY"]
        parallel = self.attributes[name]["PARALLEL_PARTITION"]
        instances = []
        for index, unit in enumerate(instance_names(name, count)):
            share = (PartitionSpec(key_column, mask, tuple(sorted(keys[index])))
                     if count > 1 and not parallel else None)
            container_id = container_id_for(self.app_id, self.placement[unit])
            inputs = [link for stream in self.dag.streams for sink in stream.sinks
                      if sink.operator == name
                      for link in [self._input(stream, sink.port, unit, index, share,
                                               parallel, container_id)]]
            rank = self.port_order[name]
            inputs.sort(key=lambda link: rank.get(link.port_name, 0))
            outputs = [OutputLink(stream.source_port, stream.name) for stream in self.dag.streams
                       if stream.source_operator == name]
            outputs = list({link.port_name: link for link in outputs}.values())
            outputs.sort(key=lambda link: rank.get(link.port_name, 0))
            op = PTOperator(
                id=self._new_id(), name=unit, class_name=desc.class_name,
                type=(plan_pb2.OPERATOR_TYPE_INPUT if desc.kind == plan_pb2.OPERATOR_KIND_INPUT
                      else plan_pb2.OPERATOR_TYPE_GENERIC),
                payload=desc.payload, attributes=dict(self.attributes[name]),
                container_id=container_id, inputs=inputs, outputs=outputs,
                logical_name=name, partition_index=index, partition_count=count,
                share=share if desc.kind != plan_pb2.OPERATOR_KIND_INPUT else None)
            self.operators[op.id] = op
            instances.append(op)
        self.instances[name] = instances

    def _input(self, stream: plan_pb2.StreamDescriptor, port: str, reader: str, index: int,
               share: PartitionSpec | None, parallel: bool, container_id: str) -> InputLink:
        """Where instance ``reader`` (partition ``index``) reads ``stream`` from."""
        upstream = self.instances[stream.source_operator]
        if len(upstream) == 1:
            return InputLink(port, stream.name, upstream[0].id, stream.source_port, share)
        if parallel:  # partition i reads all of upstream partition i
            return InputLink(port, stream.name, upstream[index].id, stream.source_port)
        unifier = self._unifier(stream, upstream, reader, port, share, container_id)
        return InputLink(port, stream.name, unifier.id, "output")

    def _unifier(self, stream: plan_pb2.StreamDescriptor, upstream: list[PTOperator],
                 reader: str, port: str, share: PartitionSpec | None,
                 container_id: str) -> PTOperator:
        """A unifier of ``upstream``'s partitions in the reader's container."""
        source = stream.source_operator
        desc = self.descriptors[source]
        name = f"{source}#unifier"
        if self.unifiers_of.get(source, 0) > 1:
            name += f"@{reader}.{port}"
        if desc.unifier_payload:
            payload, class_name = desc.unifier_payload, desc.unifier_class_name
        else:
            payload = cloudpickle.dumps(ConcatUnifier())
            class_name = f"{ConcatUnifier.__module__}.{ConcatUnifier.__qualname__}"
        attributes = dict(self.attributes[source])
        attributes.update(APPLICATION_WINDOW_COUNT=1, PARTITIONS=1, PARTITION_KEY="",
                          PARALLEL_PARTITION=False, CONTAINER=-1)
        unifier = PTOperator(
            id=self._new_id(), name=name, class_name=class_name,
            type=plan_pb2.OPERATOR_TYPE_UNIFIER, payload=payload, attributes=attributes,
            container_id=container_id,
            inputs=[InputLink(unifier_input(i), stream.name, op.id, stream.source_port, share)
                    for i, op in enumerate(upstream)],
            outputs=[OutputLink("output", stream.name)], logical_name=name)
        self.operators[unifier.id] = unifier
        return unifier

"""The physical plan's model: numbered operators placed in containers, with their states.

Pure data and rules, no I/O. Made once per submitted application (``master.planner``);
the heartbeat rules and the master loop then move its operators and containers through
their states.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import logging
from typing import Any

from weir.master.errors import InvalidTransition, PlanError
from weir.operators.attributes import ProcessingMode
from weir.proto import plan_pb2

__all__ = [
    "ContainerState",
    "InputLink",
    "OperatorState",
    "OutputLink",
    "PartitionSpec",
    "PTContainer",
    "PTOperator",
    "PhysicalPlan",
    "Topology",
    "PlanError",
    "StateSeed",
    "container_id_for",
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
    removed, whose checkpoints its container deletes once the committed window passes.
    ``savepoint_path``: the old partitions are operators of that savepoint
    (``master.savepoints``), not of this run."""

    window_id: int
    from_ids: tuple[int, ...] = ()
    share: PartitionSpec | None = None
    retired_ids: tuple[int, ...] = ()
    savepoint_path: str = ""


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
    error_ms: int = 0  # when ``error`` was set: the failure's time (epoch ms; 0: never)
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
    # its deployment's number: the plan's first_generation, then one more at every redeploy
    # (the fence of its writes)
    generation: int = 1
    recovering: bool = False  # its container says: redeployed, no window finished yet
    activating: bool = False  # its container says: activate() runs (Spark warming up)
    deployed_ms: int = 0  # when its container first reported its current instance (in setup)
    set_up_ms: int = 0  # when its current instance's setup() was reported done (0: not yet)
    activated_ms: int = 0  # ... and its activate() (0: not yet)

    @property
    def shown_state(self) -> str:
        """The state users see: RECOVERING while a redeployed instance is ACTIVE but has
        not finished a window yet (restoring, starting Spark, replaying)."""
        if self.state == OperatorState.ACTIVE and self.recovering:
            return "RECOVERING"
        return self.state.value

    @functools.cached_property
    def port_names(self) -> tuple[frozenset[str], frozenset[str]]:
        """Its (input, output) port names: the only ports its reports may name (an
        operator's ports never change; a repartition only rewires where they lead)."""
        return (frozenset(link.port_name for link in self.inputs),
                frozenset(link.port_name for link in self.outputs))

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


@dataclasses.dataclass(frozen=True)
class LossRequest:
    """A container's own heartbeat asked to be given up on: an operator FAILED there
    (``blamed_id``, and whether its error is ``fatal``), or its buffer server failed.

    The heartbeat only answers ABORT and records this; the master loop carries it out
    (``liveness.check_liveness``), as Apex's heartbeat queues a failure for its event loop:
    a heartbeat's rules never run a recovery.
    """

    cause: str
    blamed_id: int | None = None
    fatal: bool = False


@dataclasses.dataclass(eq=False)
class PTContainer:
    """The master's view of one container process and the operators placed in it.

    Created with the plan (NEW); ALLOCATED when launched, ACTIVE from its first
    heartbeat, KILLED when it is lost, killed or has exited. A lost container of a
    running application is replaced by a new one (``replaced_by``) that takes its
    operators; ``operator_ids`` keeps the operators it held, for the record. A ``spare``
    (SPARE_CONTAINERS) holds no operators until it replaces a lost container; it is
    ready for that once ACTIVE and, when the application needs Spark, ``spark_warm``.
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
    spare: bool = False  # a warm standby without operators (until it replaces a lost one)
    spark_warm: bool = False  # its heartbeats say its SparkSession is started and warm
    loss_request: LossRequest | None = None  # its heartbeat asked to be given up on

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


@dataclasses.dataclass(frozen=True)
class Topology:
    """Who feeds whom among a plan's operators (``PhysicalPlan.topology``)."""

    upstream: dict[int, tuple[int, ...]]  # feeding operators, without repeats
    downstream: dict[int, tuple[int, ...]]  # fed operators, ascending
    order: tuple[int, ...]  # each operator after every operator feeding it
    position: dict[int, int] = dataclasses.field(default_factory=dict)  # index in ``order``
    # each DAG operator's physical instances (no unifiers), in the plan's order
    instances: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, operators: dict[int, PTOperator]) -> Topology:
        upstream = {op_id: tuple(dict.fromkeys(link.source_operator_id for link in op.inputs))
                    for op_id, op in operators.items()}
        fed: dict[int, list[int]] = {op_id: [] for op_id in operators}
        for op_id, sources in upstream.items():
            for source in sources:
                fed[source].append(op_id)
        downstream = {op_id: tuple(sorted(ids)) for op_id, ids in fed.items()}
        waiting = {op_id: len(sources) for op_id, sources in upstream.items()}
        ready = collections.deque(op_id for op_id, n in waiting.items() if not n)
        order: list[int] = []
        while ready:
            op_id = ready.popleft()
            order.append(op_id)
            for down in downstream[op_id]:
                waiting[down] -= 1
                if not waiting[down]:
                    ready.append(down)
        instances: dict[str, list[int]] = {}
        for op_id, op in operators.items():
            if op.type != plan_pb2.OPERATOR_TYPE_UNIFIER:
                instances.setdefault(op.logical_name, []).append(op_id)
        return cls(upstream, downstream, tuple(order),
                   {op_id: index for index, op_id in enumerate(order)},
                   {name: tuple(ids) for name, ids in instances.items()})


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
    # every operator's generation at its first deployment in this run: above every fence an
    # earlier run left in STATE_DIR (``master.state_owner.first_generation``)
    first_generation: int = 1
    _topology: tuple[Any, Topology] | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False)
    _reshaped: int = dataclasses.field(default=0, init=False, repr=False, compare=False)

    def start_generations(self, first: int) -> None:
        """Makes ``first`` the generation of every operator's first deployment in this run
        (and of those a repartition adds later)."""
        self.first_generation = first
        for op in self.operators.values():
            op.generation = first

    def next_operator_id(self) -> int:
        return max([0, *self.operators, *self.retired]) + 1

    def instances(self, logical_name: str) -> list[PTOperator]:
        """The physical operators of a DAG operator, in partition order (no unifiers):
        from the topology's index, not a scan (asked per operator by savepoints, stats
        listeners and repartitions)."""
        operators = self.operators
        return [operators[i] for i in self.topology().instances.get(logical_name, ())]

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
        return list(self.topology().upstream[operator_id])

    def downstream_ids(self, operator_id: int) -> list[int]:
        """Physical ids of the operators ``operator_id`` feeds, without repeats, ascending."""
        return list(self.topology().downstream[operator_id])

    def downstream_map(self) -> dict[int, tuple[int, ...]]:
        """Every operator's ``downstream_ids`` at once (read-only: shared by every caller)."""
        return self.topology().downstream

    def topological_ids(self) -> list[int]:
        """Operator ids, each after every operator feeding it (ids alone are in that
        order only until a repartition adds operators)."""
        return list(self.topology().order)

    def topology(self) -> Topology:
        """Who feeds whom, derived once per shape of the plan: the heartbeat rules ask for
        it on every checkpoint and the master loop on every pass, for every application.

        The shape is the operator count and ``reshaped``'s count, which whatever rewires
        the plan in place (a repartition) bumps: comparing every operator's inputs instead
        cost a master of 10,000 operators a millisecond per heartbeat with a checkpoint.
        """
        shape = (len(self.operators), self._reshaped)
        cached = self._topology
        if cached is not None and cached[0] == shape:
            return cached[1]
        topology = Topology.of(self.operators)
        self._topology = (shape, topology)
        return topology

    def reshaped(self) -> None:
        """The operators or their inputs changed: the topology is derived again."""
        self._reshaped += 1

    def __getstate__(self) -> dict[str, Any]:
        """Without the derived topology: it is keyed by object ids of this process."""
        return {**self.__dict__, "_topology": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # journals from before the cache
        self.__dict__.update({"_topology": None, "_reshaped": 0, **state})

    def live_containers(self) -> list[PTContainer]:
        return [c for c in self.containers.values() if c.state != ContainerState.KILLED]

    def working_containers(self) -> list[PTContainer]:
        """The live containers that hold (or wait for) operators: not the spares."""
        return [c for c in self.live_containers() if not c.spare]

    def next_container_index(self) -> int:
        return max((c.index for c in self.containers.values()), default=-1) + 1

    def container_of(self, operator_id: int) -> PTContainer:
        return self.containers[self.operators[operator_id].container_id]

    def attribute_text(self) -> dict[str, str]:
        return {name: str(value) for name, value in self.attributes.items()}


def container_id_for(app_id: str, index: int) -> str:
    """The id of container number ``index`` of an application, e.g. ``app-0001-c0``."""
    return f"{app_id}-c{index}"

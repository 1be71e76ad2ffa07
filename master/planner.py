"""The planner: a validated logical DAG becomes a physical plan: each operator numbered
per partition, unifiers where partitions meet, streams linked, operators placed in
containers (``master.physical_plan`` holds what it makes). Pure: no I/O.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any

import cloudpickle

from weir.master.errors import PlanError
from weir.master.physical_plan import (
    InputLink,
    OutputLink,
    PartitionSpec,
    PhysicalPlan,
    PTContainer,
    PTOperator,
    container_id_for,
)
from weir.master.plan_attributes import resolve_attributes
from weir.master.processing_modes import check_processing_modes
from weir.master.spares import add_spares
from weir.master.state_owner import default_state_dir, new_run_id
from weir.operators.dag import topological_order
from weir.operators.partitioning import partition_keys
from weir.operators.unifiers import ConcatUnifier, unifier_input
from weir.proto import plan_pb2

__all__ = [
    "build_physical_plan",
    "check_size",
    "instance_names",
    "instantiate",
    "place_operators",
    "spread",
]


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
    least = [(load[i], i) for i in range(slots)]  # the least loaded, then the lowest index
    heapq.heapify(least)
    for _ in free:
        units, target = heapq.heappop(least)
        counts[target] += 1
        heapq.heappush(least, (units + 1, target))
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
    SPARE_CONTAINERS spare containers, without operators, follow the others.

    Raises:
        PlanError: bad overrides, placement or partitioning.
    """
    dag_attributes, operator_attributes = resolve_attributes(dag, overrides)
    order = topological_order(dag)
    descriptors = {op.name: op for op in dag.operators}
    counts = _partition_counts(dag, order, descriptors, operator_attributes)
    check_size(dag, counts, operator_attributes, dag_attributes["MAX_OPERATORS"])
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
    operators = instantiate(dag, operator_attributes, counts, app_id, placement, order)
    for op in operators.values():
        containers[op.container_id].operator_ids.append(op.id)
    plan = PhysicalPlan(app_id=app_id, name=dag.name, attributes=dag_attributes,
                        operators=operators, containers=containers)
    add_spares(plan, dag_attributes["SPARE_CONTAINERS"])
    return plan


def instantiate(dag: plan_pb2.DagDescriptor, operator_attributes: Mapping[str, dict[str, Any]],
                counts: Mapping[str, int], app_id: str, placement: Mapping[str, int],
                order: list[str] | None = None) -> dict[int, PTOperator]:
    """The physical operators of ``dag`` with ``counts`` partitions each, numbered 1..N in
    topological order (``order``, if the caller has it), unifiers inserted, in the
    containers ``placement`` gives each instance name (``name`` or ``name#i``; a unifier
    goes with its reader)."""
    descriptors = {op.name: op for op in dag.operators}
    builder = _Builder(dag, descriptors, operator_attributes, counts, app_id, placement)
    for name in order if order is not None else topological_order(dag):
        builder.add(name)
    return builder.operators


def instance_names(name: str, count: int) -> list[str]:
    """The physical names of a logical operator: itself, or ``name#0`` ... when partitioned."""
    return [name] if count == 1 else [f"{name}#{i}" for i in range(count)]


def _upstream(dag: plan_pb2.DagDescriptor) -> dict[str, list[str]]:
    """Each operator's upstream operators (in stream order, once each): one pass."""
    upstream: dict[str, dict[str, None]] = {}
    for stream in dag.streams:
        for sink in stream.sinks:
            upstream.setdefault(sink.operator, {})[stream.source_operator] = None
    return {name: list(sources) for name, sources in upstream.items()}


def _partition_counts(dag: plan_pb2.DagDescriptor, order: list[str],
                      descriptors: Mapping[str, plan_pb2.OperatorDescriptor],
                      operator_attributes: Mapping[str, dict[str, Any]]) -> dict[str, int]:
    """Each operator's number of partitions; sets PARTITIONS of parallel partitions.

    Raises:
        PlanError: a partitioned source, a partitioned operator without PARTITION_KEY, or
            PARALLEL_PARTITION without upstream partitions of one count.
    """
    counts: dict[str, int] = {}
    upstream_of = _upstream(dag)
    for name in order:
        attributes = operator_attributes[name]
        count = attributes["PARTITIONS"]
        if attributes["PARALLEL_PARTITION"]:
            upstream = upstream_of.get(name, [])
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


def _unifier_counts(dag: plan_pb2.DagDescriptor, counts: Mapping[str, int],
                    operator_attributes: Mapping[str, dict[str, Any]]) -> dict[str, int]:
    """Per partitioned operator, how many unifiers the plan gives it: one per reading
    instance that is not its parallel partner."""
    unifiers: dict[str, int] = {}
    for stream in dag.streams:
        if counts[stream.source_operator] > 1:
            for sink in stream.sinks:
                if not operator_attributes[sink.operator]["PARALLEL_PARTITION"]:
                    unifiers[stream.source_operator] = (
                        unifiers.get(stream.source_operator, 0) + counts[sink.operator])
    return unifiers


def check_size(dag: plan_pb2.DagDescriptor, counts: Mapping[str, int],
                operator_attributes: Mapping[str, dict[str, Any]], most: int) -> None:
    """Refuses a plan of more than ``most`` physical operators (``MAX_OPERATORS``) before
    any of them is made."""
    physical = sum(counts.values()) + sum(
        _unifier_counts(dag, counts, operator_attributes).values())
    if physical > most:
        raise PlanError(
            f"DAG {dag.name!r} would have {physical:,} physical operators ({len(counts):,} "
            f"in the DAG, partitions and unifiers counted), over MAX_OPERATORS={most:,}; "
            "merge operators, lower PARTITIONS, or raise it (-D MAX_OPERATORS=N, at most "
            "1,000,000)")


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
        self.unifiers_of = _unifier_counts(dag, counts, operator_attributes)
        # each operator's input (stream, port) and output streams, in the DAG's stream
        # order: one pass here, not one per operator (a 10,000-operator DAG is linear)
        self.inputs_of: dict[str, list[tuple[plan_pb2.StreamDescriptor, str]]] = {}
        self.outputs_of: dict[str, list[plan_pb2.StreamDescriptor]] = {}
        self._concat_payload = b""  # ConcatUnifier pickled once per plan
        for stream in dag.streams:
            self.outputs_of.setdefault(stream.source_operator, []).append(stream)
            for sink in stream.sinks:
                self.inputs_of.setdefault(sink.operator, []).append((stream, sink.port))

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
            inputs = [self._input(stream, port, unit, index, share, parallel, container_id)
                      for stream, port in self.inputs_of.get(name, ())]
            rank = self.port_order[name]
            inputs.sort(key=lambda link: rank.get(link.port_name, 0))
            outputs = [OutputLink(stream.source_port, stream.name)
                       for stream in self.outputs_of.get(name, ())]
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
            self._concat_payload = self._concat_payload or cloudpickle.dumps(ConcatUnifier())
            payload = self._concat_payload
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

"""The logical plan: operators, streams between their ports, and attributes.

>>> from weir.operators.testing import ListSource, CollectSink
>>> dag = Dag("example")
>>> src = dag.add_operator("src", ListSource([[{"x": 1}]]))
>>> sink = dag.add_operator("sink", CollectSink())
>>> _ = dag.add_stream("numbers", src.output, sink.input)
>>> dag.validate()
>>> [o.name for o in dag.to_descriptor().operators]
['src', 'sink']
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import cloudpickle
import pyarrow as pa

from weir.operators.attributes import Scope, parse_attributes
from weir.operators.column_checks import check_columns, emitted_schema
from weir.operators.dead_letters import DEAD_LETTER, ERRORS_PORT
from weir.operators.operator import InputOperator, Operator
from weir.operators.ports import BoundPort
from weir.proto import plan_pb2

if TYPE_CHECKING:
    from weir.operators.scaling import StatsListener

__all__ = ["Dag", "DagError", "topological_order", "validate_descriptor"]

_LOGGER = logging.getLogger(__name__)


class DagError(ValueError):
    """The DAG is malformed; the message names what is wrong and how to fix it."""


class Dag:
    """A DAG of operators under construction; submit it with ``weir submit`` or ``weir run``."""

    def __init__(self, name: str, **attributes: Any) -> None:
        if not name:
            raise DagError("a DAG needs a non-empty name")
        self.name = name
        self._operators: dict[str, Operator] = {}
        self._names: dict[int, str] = {}  # id(operator) -> its name: a lookup per port
        self._operator_attributes: dict[str, dict[str, str]] = {}
        self._streams: dict[str, tuple[BoundPort, list[BoundPort]]] = {}
        self._stats_listeners: dict[str, StatsListener] = {}
        self.attributes: dict[str, str] = {}
        self.set_attributes(**attributes)

    # -- building ---------------------------------------------------------------
    def add_operator(self, name: str, operator: Operator, *,
                     stats_listener: StatsListener | None = None, **attributes: Any) -> Any:
        """Adds ``operator`` under ``name`` and returns it (to reach its ports).

        ``stats_listener`` (``operators.scaling``) runs in the master on the operator's
        stats and may ask for more or fewer partitions while the application runs.
        """
        if stats_listener is not None and not callable(
                getattr(stats_listener, "process_stats", None)):
            raise DagError(f"operator {name!r}: the stats listener is a "
                           f"{type(stats_listener).__name__} without a process_stats(stats) "
                           "method; use operators.scaling.ThroughputScaler or write one")
        if not isinstance(operator, Operator):
            raise DagError(
                f"operator {name!r} is a {type(operator).__name__}, not a weir Operator; "
                "subclass operators.Operator"
            )
        if name in self._operators:
            raise DagError(f"two operators are named {name!r}; operator names must be unique")
        if self._operators.get(self._names.get(id(operator), "")) is operator:
            raise DagError(f"operator {name!r} was already added under another name")
        self._operators[name] = operator
        self._names[id(operator)] = name
        self._operator_attributes[name] = {}
        if stats_listener is not None:
            self._stats_listeners[name] = stats_listener
        self.set_operator_attributes(name, **attributes)
        return operator

    def add_stream(self, name: str, source: BoundPort, *sinks: BoundPort) -> str:
        """Connects output port ``source`` to the input ports ``sinks``; returns the name."""
        if name in self._streams:
            raise DagError(f"two streams are named {name!r}; stream names must be unique")
        for port, kind in [(source, "output"), *[(s, "input") for s in sinks]]:
            if not isinstance(port, BoundPort):
                raise DagError(f"stream {name!r}: {port!r} is not a port; pass op.<port>")
            if port.spec.kind != kind:
                raise DagError(
                    f"stream {name!r}: {self._port_name(port)} is an {port.spec.kind} port "
                    f"but is used as an {kind}; streams go from an output to inputs"
                )
            self._operator_name(port)  # raises if the port's operator is not in this DAG
        if not sinks:
            raise DagError(f"stream {name!r} has no input port to deliver to")
        self._streams[name] = (source, list(sinks))
        return name

    def connect(self, source: BoundPort, *sinks: BoundPort) -> str:
        """``add_stream`` with a generated name ``<operator>.<port>``."""
        return self.add_stream(self._port_name(source), source, *sinks)

    def set_attributes(self, **attributes: Any) -> None:
        """Sets DAG attributes, e.g. ``STREAMING_WINDOW_SIZE_MILLIS=250``."""
        parse_attributes(attributes, Scope.DAG)
        self.attributes.update({k: str(v) for k, v in attributes.items()})

    def set_operator_attributes(self, operator_name: str, **attributes: Any) -> None:
        """Sets attributes of one operator, e.g. ``APPLICATION_WINDOW_COUNT=4``."""
        if operator_name not in self._operators:
            raise DagError(f"unknown operator {operator_name!r}")
        parse_attributes(attributes, Scope.OPERATOR)
        self._operator_attributes[operator_name].update({k: str(v) for k, v in attributes.items()})

    # -- checking and serialising ------------------------------------------------
    def validate(self) -> None:
        """Raises ``DagError`` naming the first problem found."""
        validate_descriptor(self.to_descriptor(with_payload=False))

    def to_descriptor(self, *, with_payload: bool = True) -> plan_pb2.DagDescriptor:
        """The DAG as a protocol message; ``with_payload`` pickles the operator instances.

        An input fed by a source that knows what it emits (a ``ParquetSource``'s files)
        carries that schema (``stream_schema``): its operator can prepare for it before
        the first batch (a ``SparkSql`` warms its own query)."""
        streamed = self._check_columns()
        descriptor = plan_pb2.DagDescriptor(name=self.name, attributes=self.attributes)
        for name, operator in self._operators.items():
            cls = type(operator)
            op = descriptor.operators.add(
                name=name,
                class_name=f"{cls.__module__}.{cls.__qualname__}",
                kind=(
                    plan_pb2.OPERATOR_KIND_INPUT
                    if isinstance(operator, InputOperator)
                    else plan_pb2.OPERATOR_KIND_GENERIC
                ),
                attributes=self._operator_attributes[name],
            )
            for port_name, port in cls.input_ports().items():
                op.inputs.add(name=port_name, optional=port.optional,
                              schema=_schema_bytes(port.schema),
                              stream_schema=_schema_bytes(streamed.get((name, port_name))))
            for port_name, port in cls.output_ports().items():
                op.outputs.add(name=port_name, optional=port.optional,
                               schema=_schema_bytes(port.schema))
            if _dead_letters(op.attributes):
                _add_errors_port(name, operator, op)
            if with_payload:
                op.payload = _pickle(name, operator)
                unifier = operator.unifier()
                if unifier is not None:
                    if not isinstance(unifier, Operator):
                        raise DagError(f"operator {name!r}: unifier() returned a "
                                       f"{type(unifier).__name__}, not an Operator")
                    op.unifier_payload = _pickle(f"{name} (its unifier)", unifier)
                    op.unifier_class_name = _class_name(unifier)
                op.repartition_refusal = operator.repartition_refusal() or ""
                op.splits_input = bool(getattr(operator, "SPLITS_INPUT", False))
                op.uses_spark = bool(operator.USES_SPARK or getattr(unifier, "USES_SPARK", False))
                listener = self._stats_listeners.get(name)
                if listener is not None:
                    op.stats_listener_payload = _pickle(f"{name} (its stats listener)", listener)
                    op.stats_listener_class_name = _class_name(listener)
        for stream_name, (source, sinks) in self._streams.items():
            descriptor.streams.add(
                name=stream_name,
                source_operator=self._operator_name(source),
                source_port=source.name,
                sinks=[
                    plan_pb2.StreamSink(operator=self._operator_name(s), port=s.name)
                    for s in sinks
                ],
            )
        return descriptor

    # -- helpers -----------------------------------------------------------------
    def _check_columns(self) -> dict[tuple[str, str], pa.Schema]:
        """The columns sources' readers name, against what the sources emit (if known);
        returns the schema each reader's port gets, where known: (operator, port) ->."""
        name_of = {id(op): name for name, op in self._operators.items()}
        readers: dict[str, list[tuple[str, str]]] = {}
        for source, sinks in self._streams.values():
            if source.name == ERRORS_PORT:  # dead letters: their own columns
                continue
            readers.setdefault(name_of[id(source.operator)], []).extend(
                (name_of[id(s.operator)], s.name) for s in sinks)
        sources = {name: emitted_schema(op) for name, op in self._operators.items()
                   if isinstance(op, InputOperator) and name in readers}
        check_columns(sources, readers, self._operator_attributes, self._operators)
        return {reader: schema for name, schema in sources.items() if schema is not None
                for reader in readers[name]}


    def _operator_name(self, port: BoundPort) -> str:
        name = self._names.get(id(port.operator))
        if name is not None and self._operators.get(name) is port.operator:
            return name
        raise DagError(
            f"{port!r} belongs to an operator that is not in DAG {self.name!r}; "
            "add it with dag.add_operator first"
        )

    def _port_name(self, port: BoundPort) -> str:
        try:
            return f"{self._operator_name(port)}.{port.name}"
        except DagError:
            return repr(port)


def _class_name(value: object) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"


def _dead_letters(attributes: Mapping[str, str]) -> bool:
    return str(attributes.get("ON_ERROR", "")).strip().upper() == DEAD_LETTER


def _add_errors_port(name: str, operator: Operator, op: plan_pb2.OperatorDescriptor) -> None:
    """The dead-letter port, declared for an operator with ``ON_ERROR="DEAD_LETTER"``."""
    if isinstance(operator, InputOperator) and not operator.DEAD_LETTERS:
        raise DagError(f"operator {name!r}: ON_ERROR='DEAD_LETTER' applies to operators with "
                       "input ports (their process() or Spark job) and to sources that can "
                       f"set records aside (KafkaSource); {type(operator).__name__} cannot: "
                       "drop the attribute, or check the records in an operator after it")
    if any(p.name == ERRORS_PORT for p in (*op.inputs, *op.outputs)):
        raise DagError(f"operator {name!r} ({type(operator).__name__}) declares a port named "
                       f"{ERRORS_PORT!r}, the name of the dead-letter port "
                       "ON_ERROR='DEAD_LETTER' adds: rename its port")
    op.outputs.add(name=ERRORS_PORT, optional=True)


def _pickle(name: str, operator: object) -> bytes:
    try:
        return cloudpickle.dumps(operator)
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the user's to fix
        raise DagError(
            f"operator {name!r} ({type(operator).__name__}) cannot be serialized: {exc}; "
            "keep open files, sockets and sessions out of __init__ and create them "
            "in setup()"
        ) from None


def _schema_bytes(schema: pa.Schema | None) -> bytes:
    return b"" if schema is None else schema.serialize().to_pybytes()


def _schema(data: bytes) -> pa.Schema | None:
    return pa.ipc.read_schema(pa.py_buffer(data)) if data else None


def validate_descriptor(dag: plan_pb2.DagDescriptor) -> None:
    """Checks a DAG descriptor's structure; raises ``DagError`` naming the problem.

    Checked: names, attributes, streams naming existing operators and ports, each input
    port fed by at most one stream, every required input connected, matching declared
    schemas on both ends of a stream, and no cycle.
    """
    if not dag.name:
        raise DagError("the DAG has no name")
    _check_names(dag)
    if not dag.operators:
        raise DagError(f"DAG {dag.name!r} has no operators; add at least a source")
    _check_port_schemas(dag)
    _check_attributes(dag.attributes, Scope.DAG, f"DAG {dag.name!r}")
    operators: dict[str, plan_pb2.OperatorDescriptor] = {}
    for op in dag.operators:
        if op.name in operators:
            raise DagError(f"two operators are named {op.name!r}")
        operators[op.name] = op
        _check_attributes(op.attributes, Scope.OPERATOR, f"operator {op.name!r}")
    fed: dict[tuple[str, str], str] = {}
    for stream in dag.streams:
        source = operators.get(stream.source_operator)
        if source is None:
            raise DagError(f"stream {stream.name!r} starts at unknown operator "
                           f"{stream.source_operator!r}")
        out_port = _port(source.outputs, stream.source_port)
        if out_port is None and stream.source_port == ERRORS_PORT:
            raise DagError(f"stream {stream.name!r} starts at the dead-letter port of operator "
                           f"{source.name!r}, which has ON_ERROR='FAIL': set "
                           f"ON_ERROR='DEAD_LETTER' on {source.name!r} to route the rows it "
                           "fails on there")
        if out_port is None:
            raise DagError(f"stream {stream.name!r}: operator {source.name!r} has no output port "
                           f"{stream.source_port!r}; its outputs are "
                           f"{[p.name for p in source.outputs]}")
        if not stream.sinks:
            raise DagError(f"stream {stream.name!r} delivers to no input port")
        for sink in stream.sinks:
            target = operators.get(sink.operator)
            if target is None:
                raise DagError(f"stream {stream.name!r} delivers to unknown operator "
                               f"{sink.operator!r}")
            in_port = _port(target.inputs, sink.port)
            if in_port is None:
                raise DagError(f"stream {stream.name!r}: operator {target.name!r} has no input "
                               f"port {sink.port!r}; its inputs are "
                               f"{[p.name for p in target.inputs]}")
            key = (sink.operator, sink.port)
            if key in fed:
                raise DagError(f"input port {sink.operator}.{sink.port} is fed by two streams, "
                               f"{fed[key]!r} and {stream.name!r}; an input port takes one "
                               "stream (merge them in an operator with two inputs)")
            fed[key] = stream.name
            _check_schemas(stream.name, source.name, out_port, target.name, in_port)
    for op in dag.operators:
        for port in op.inputs:
            if not port.optional and (op.name, port.name) not in fed:
                raise DagError(f"input port {op.name}.{port.name} is not connected; connect a "
                               "stream to it or declare it InputPort(optional=True)")
    _check_dead_letters_go_somewhere(dag)
    _check_source_only_attributes(dag, operators)
    topological_order(dag)


MAX_NAME_CHARS = 200
"""The longest name of a DAG, operator, port or stream: names are echoed in every error,
table and log line."""


def _check_names(dag: plan_pb2.DagDescriptor) -> None:
    """Every name is 1..MAX_NAME_CHARS printable characters (a name is shown everywhere)."""
    named = [("the DAG", dag.name)]
    for op in dag.operators:
        named.append(("an operator", op.name))
        named += [(f"a port of operator {op.name[:MAX_NAME_CHARS]!r}", port.name)
                  for port in (*op.inputs, *op.outputs)]
    named += [("a stream", stream.name) for stream in dag.streams]
    for what, name in named:
        if not name or len(name) > MAX_NAME_CHARS or not name.isprintable():
            raise DagError(f"{what} is named {name[:40]!r}{'…' if len(name) > 40 else ''} "
                           f"({len(name):,} characters): a name has 1 to {MAX_NAME_CHARS} "
                           "printable characters")


def _check_port_schemas(dag: plan_pb2.DagDescriptor) -> None:
    """Every declared port schema is Arrow IPC that parses (containers rely on it)."""
    for op in dag.operators:
        for port in (*op.inputs, *op.outputs):
            try:
                _schema(port.schema)
            except (pa.ArrowException, ValueError, TypeError) as exc:
                raise DagError(f"port {op.name}.{port.name} declares a schema that is not an "
                               f"Arrow schema ({type(exc).__name__}: {str(exc)[:200]}); "
                               "declare it as a pyarrow.Schema") from None


SOURCE_ONLY_ATTRIBUTES = ("EVENT_TIME_COLUMN", "WATERMARK_DELAY_MILLIS", "IDLE_TIMEOUT_MILLIS")
"""Attributes that only a source (an ``InputOperator``) reads: event time is assigned where
rows enter the DAG, and every other operator follows the watermarks that come with them."""


def _check_source_only_attributes(dag: plan_pb2.DagDescriptor,
                                  operators: dict[str, plan_pb2.OperatorDescriptor]) -> None:
    """Refuses a source-only attribute set on an operator that is not a source: accepted,
    it would do nothing (event-time windows downstream would wait for a watermark that
    never comes, and fire only when the stream ends)."""
    upstream: dict[str, list[str]] = {}
    for stream in dag.streams:
        for sink in stream.sinks:
            upstream.setdefault(sink.operator, []).append(stream.source_operator)
    for op in dag.operators:
        named = [name for name in SOURCE_ONLY_ATTRIBUTES if op.attributes.get(name)]
        if not named or op.kind == plan_pb2.OPERATOR_KIND_INPUT:
            continue
        sources, seen, todo = [], set(), list(upstream.get(op.name, []))
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            if operators[name].kind == plan_pb2.OPERATOR_KIND_INPUT:
                sources.append(name)
            todo += upstream.get(name, [])
        where = (f"set it on the source{'s' if len(sources) > 1 else ''} upstream "
                 f"({', '.join(repr(s) for s in sorted(sources))})" if sources
                 else "set it on the source its rows come from")
        raise DagError(f"operator {op.name!r} sets {', '.join(named)}, which only a source "
                       f"(an InputOperator) reads; on {op.name!r} it would do nothing: "
                       f"event time is assigned where rows enter the DAG, so {where}, and "
                       f"{op.name!r} follows the watermarks that come with its input")


def _check_dead_letters_go_somewhere(dag: plan_pb2.DagDescriptor) -> None:
    """An operator with ON_ERROR='DEAD_LETTER' needs its errors port connected: rows it
    set aside with nowhere to go would be lost."""
    sources = {(s.source_operator, s.source_port) for s in dag.streams}
    for op in dag.operators:
        if _dead_letters(op.attributes) and (op.name, ERRORS_PORT) not in sources:
            raise DagError(f"operator {op.name!r} has ON_ERROR='DEAD_LETTER' but its "
                           f"{ERRORS_PORT!r} port is not connected, so the rows it fails on "
                           f"would be lost: connect it, e.g. dag.add_stream('dead-letters', "
                           f"{op.name}.errors, sink.input)")


def topological_order(dag: plan_pb2.DagDescriptor) -> list[str]:
    """Operator names, every operator after all its upstream ones; raises on a cycle."""
    downstream: dict[str, set[str]] = {op.name: set() for op in dag.operators}
    indegree = dict.fromkeys(downstream, 0)
    for stream in dag.streams:
        for sink in stream.sinks:
            if sink.operator not in downstream[stream.source_operator]:
                downstream[stream.source_operator].add(sink.operator)
                indegree[sink.operator] += 1
    order = [name for name in downstream if indegree[name] == 0]
    for name in order:  # the list grows while we walk it
        for nxt in sorted(downstream[name]):
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                order.append(nxt)
    if len(order) < len(downstream):
        cyclic = sorted(n for n, d in indegree.items() if d > 0)
        raise DagError(f"DAG {dag.name!r} has a cycle through operators {cyclic}; "
                       "streams must not lead back to an upstream operator")
    return order


def _port(ports: Iterable[plan_pb2.PortDescriptor], name: str) -> plan_pb2.PortDescriptor | None:
    return next((p for p in ports if p.name == name), None)


def _check_attributes(attributes: Mapping[str, str], scope: Scope, where: str) -> None:
    try:
        parse_attributes(attributes, scope)
    except ValueError as exc:
        raise DagError(f"{where}: {exc}") from None


def _check_schemas(stream: str, src: str, out_port: plan_pb2.PortDescriptor, dst: str,
                   in_port: plan_pb2.PortDescriptor) -> None:
    out_schema, in_schema = _schema(out_port.schema), _schema(in_port.schema)
    if out_schema is None or in_schema is None:
        return
    missing = [f for f in in_schema if out_schema.get_field_index(f.name) < 0
               or out_schema.field(f.name).type != f.type]
    if missing:
        raise DagError(
            f"stream {stream!r}: port type mismatch: {src}.{out_port.name} emits "
            f"{_fmt(out_schema)} but {dst}.{in_port.name} expects {_fmt(in_schema)}"
        )


def _fmt(schema: pa.Schema) -> str:
    return "(" + ", ".join(f"{f.name}: {f.type}" for f in schema) + ")"

"""Ports: typed endpoints of an operator, declared as class attributes.

A port carries Arrow record batches. Its schema is declared or taken from the first batch;
batches through a port with a declared schema are cast to it, and one that cannot be
(other columns, types that do not cast) raises ``SchemaMismatch``.

>>> import pyarrow as pa
>>> from weir.operators.operator import Operator
>>> class Upper(Operator):
...     input = InputPort(pa.schema([("word", pa.string())]))
...     output = OutputPort()
>>> sorted(Upper.input_ports()), sorted(Upper.output_ports())
(['input'], ['output'])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import pyarrow as pa

from weir.operators.table_batches import table_batches

__all__ = ["BoundPort", "InputPort", "OutputPort", "PortNotConnected", "SchemaMismatch",
           "conform"]


class PortNotConnected(RuntimeError):
    """An operator emitted on a port before the runtime connected it."""


class SchemaMismatch(pa.ArrowInvalid):
    """Data does not fit the schema of the port it goes through.

    The same data fails the same way on every retry, so the runtime fails the
    application at once instead of restarting the operator. An ``ArrowInvalid``, so code
    that catches Arrow's errors still catches it.
    """


def conform(data: pa.RecordBatch | pa.Table, schema: pa.Schema,
            where: str) -> pa.RecordBatch | pa.Table:
    """``data`` with ``schema``: as is when it has it, else cast to it.

    Args:
        data: a batch or a table.
        schema: the port's schema.
        where: names the port for the error message.

    Raises:
        SchemaMismatch: other column names, or a type that does not cast (or a value that
            does not fit the target type).

    >>> conform(pa.record_batch({"n": [1, 2]}), pa.schema([("n", pa.int32())]), "x").schema
    n: int32
    >>> conform(pa.record_batch({"m": [1]}), pa.schema([("n", pa.int64())]), "port 'in'")
    Traceback (most recent call last):
    ...
    weir.operators.ports.SchemaMismatch: port 'in': a batch with columns (m: int64) does not fit \
the schema (n: int64): Target schema's field names are not matching the record batch's \
field names: ['m'], ['n']
    """
    if data.schema.equals(schema):
        return data
    try:
        return data.cast(schema)
    except (ValueError, TypeError, NotImplementedError, pa.ArrowException) as exc:
        raise SchemaMismatch(f"{where}: a batch with columns ({_columns(data.schema)}) does not "
                             f"fit the schema ({_columns(schema)}): {exc}") from exc


def _columns(schema: pa.Schema) -> str:
    return ", ".join(f"{field.name}: {field.type}" for field in schema)


class _Port:
    kind = "port"

    def __init__(self, schema: pa.Schema | None = None, *, optional: bool = False) -> None:
        self.schema = schema
        self.optional = optional
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return BoundPort(instance, self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class InputPort(_Port):
    """An input: the runtime calls ``operator.process(name, batch)`` for each batch."""

    kind = "input"


class OutputPort(_Port):
    """An output: ``self.<name>.emit(batch)`` publishes a batch in the current window."""

    kind = "output"


class _Owner(Protocol):
    """An operator, as its ports see it (``operators.operator.Operator``)."""

    @property
    def emitter(self) -> Callable[[str, pa.RecordBatch], None] | None: ...


class BoundPort:
    """A port of one operator instance; what ``Dag.add_stream`` takes and what emits."""

    __slots__ = ("operator", "spec")

    def __init__(self, operator: _Owner, spec: _Port) -> None:
        self.operator = operator
        self.spec = spec

    @property
    def name(self) -> str:
        return self.spec.name

    def emit(self, data: pa.RecordBatch | pa.Table) -> None:
        """Publishes ``data`` on this output port in the current window.

        The stream keeps ``data`` as it is (Arrow data is immutable) until the window is
        committed: do not write into its buffers afterwards, for example through a numpy
        array it was built over without a copy, or a replay would read the change.
        """
        if self.spec.kind != "output":
            raise TypeError(f"{self.spec.name} is an input port; only output ports emit")
        emit = self.operator.emitter
        if emit is None:
            raise PortNotConnected(
                f"output port {self.spec.name!r} emitted before the runtime connected it; "
                "emit from the operator's window hooks, not from __init__"
            )
        if self.spec.schema is not None:
            data = conform(data, self.spec.schema, f"output port {type(self.operator).__name__}."
                                                   f"{self.spec.name}")
        if isinstance(data, pa.Table):
            for batch in table_batches(data):
                emit(self.spec.name, batch)
        else:
            emit(self.spec.name, data)

    def __repr__(self) -> str:
        return f"<{self.spec.kind} port {type(self.operator).__name__}.{self.spec.name}>"

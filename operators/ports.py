"""Ports: typed endpoints of an operator, declared as class attributes.

A port carries Arrow record batches. Its schema is declared or taken from the first batch.

>>> import pyarrow as pa
>>> from operators.operator import Operator
>>> class Upper(Operator):
...     input = InputPort(pa.schema([("word", pa.string())]))
...     output = OutputPort()
>>> sorted(Upper.input_ports()), sorted(Upper.output_ports())
(['input'], ['output'])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from operators.operator import Operator

__all__ = ["BoundPort", "InputPort", "OutputPort", "PortNotConnected"]


class PortNotConnected(RuntimeError):
    """An operator emitted on a port before the runtime connected it."""


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


class BoundPort:
    """A port of one operator instance; what ``Dag.add_stream`` takes and what emits."""

    __slots__ = ("operator", "spec")

    def __init__(self, operator: Operator, spec: _Port) -> None:
        self.operator = operator
        self.spec = spec

    @property
    def name(self) -> str:
        return self.spec.name

    def emit(self, data: pa.RecordBatch | pa.Table) -> None:
        """Publishes ``data`` on this output port in the current window."""
        if self.spec.kind != "output":
            raise TypeError(f"{self.spec.name} is an input port; only output ports emit")
        emit = getattr(self.operator, "_weir_emit", None)
        if emit is None:
            raise PortNotConnected(
                f"output port {self.spec.name!r} emitted before the runtime connected it; "
                "emit from the operator's window hooks, not from __init__"
            )
        if isinstance(data, pa.Table):
            for batch in data.to_batches():
                emit(self.spec.name, batch)
        else:
            emit(self.spec.name, data)

    def __repr__(self) -> str:
        return f"<{self.spec.kind} port {type(self.operator).__name__}.{self.spec.name}>"

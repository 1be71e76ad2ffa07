"""User metrics: numbers an operator exposes, read by the runtime at the end of each window.

Like Apex's ``@AutoMetric``: the container reads them after every streaming window, sends
them to the master with the window's stats, and the master shows them (``weir stats``,
``weir app``, the dashboard, ``/metrics``), summed over the partitions of an operator.

Two ways to declare them::

    class Dedupe(Operator):
        METRICS = ("duplicates",)          # instance attributes, read as they are

        @metric
        def keys_held(self) -> int:        # a method, called; its name is the metric's
            return len(self.seen)

        @metric("bytes_held")              # or named explicitly
        def _size(self) -> float:
            return self.size_bytes

Values must be numbers (``bool``, ``int``, ``float``); a method may also return a
mapping of numbers, reported as ``name[key]`` each (a figure per topic partition, say).
Anything else, or a method that raises, is left out of that window's figures and logged
once per operator and metric: a metric must never stop the operator it measures.

>>> class Probe:
...     METRICS = ("seen",)
...     seen = 3
...     @metric
...     def twice(self):
...         return self.seen * 2
...     @metric("lag")
...     def lags(self):
...         return {"orders/0": 5, "orders/1": 0}
>>> collect_metrics(Probe())
{'seen': 3.0, 'twice': 6.0, 'lag[orders/0]': 5.0, 'lag[orders/1]': 0.0}
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, overload

__all__ = ["collect_metrics", "metric", "metric_names"]

_LOGGER = logging.getLogger(__name__)

_F = TypeVar("_F", bound=Callable[..., Any])
_MARK = "_weir_metric_name"


@overload
def metric(name: _F) -> _F: ...


@overload
def metric(name: str | None = None) -> Callable[[_F], _F]: ...


def metric(name: Any = None) -> Any:
    """Marks a method as a user metric: ``@metric`` or ``@metric("name")``."""
    if callable(name):
        setattr(name, _MARK, name.__name__)
        return name

    def mark(method: _F) -> _F:
        setattr(method, _MARK, name or method.__name__)
        return method

    return mark


@functools.cache
def _declared(cls: type) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(attribute names, (metric name, method name) pairs) of a class, base classes first."""
    attributes: dict[str, None] = {}
    methods: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        attributes.update(dict.fromkeys(vars(klass).get("METRICS", ()) or ()))
        for attr, value in vars(klass).items():
            target = value.__func__ if isinstance(value, staticmethod | classmethod) else value
            name = getattr(target, _MARK, None)
            if isinstance(name, str):
                methods[name] = attr
    return tuple(attributes), tuple(methods.items())


def metric_names(operator: object) -> list[str]:
    """The metrics ``operator`` declares, in declaration order."""
    attributes, methods = _declared(type(operator))
    return list(dict.fromkeys([*attributes, *(name for name, _ in methods)]))


_warned: set[tuple[int, str]] = set()


def _warn_once(operator: object, name: str, why: str) -> None:
    key = (id(operator), name)
    if key not in _warned:
        _warned.add(key)
        _LOGGER.warning("metric %r of %s left out: %s", name, type(operator).__name__, why)


def _number(operator: object, name: str, value: Any) -> float | None:
    if isinstance(value, bool | int | float) and not (isinstance(value, float)
                                                       and math.isnan(value)):
        return float(value)
    _warn_once(operator, name, f"{type(value).__name__} is not a number")
    return None


def collect_metrics(operator: object) -> dict[str, float]:
    """The operator's metrics now; empty if it declares none (the common, cheap case)."""
    attributes, methods = _declared(type(operator))
    if not attributes and not methods:
        return {}
    values: dict[str, float] = {}
    for name in attributes:
        if not hasattr(operator, name):
            _warn_once(operator, name, "no such attribute (yet)")
            continue
        number = _number(operator, name, getattr(operator, name))
        if number is not None:
            values[name] = number
    for name, method in methods:
        try:
            value = getattr(operator, method)()
        except Exception as exc:  # noqa: BLE001 - a metric must not fail its operator
            _warn_once(operator, name, f"{type(exc).__name__}: {exc}")
            continue
        parts = value.items() if isinstance(value, Mapping) else [(None, value)]
        for key, part in parts:
            label = name if key is None else f"{name}[{key}]"
            number = _number(operator, label, part)
            if number is not None:
                values[label] = number
    return values

"""An operator's checkpointable state as bytes, so a restarted operator resumes where it was.

One rule for what is state, for both drivers of the window engine (the container and the
local runner), and the state of a new partition when a repartition splits or merges keys.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from typing import Any

import cloudpickle

from weir.operators.keyed_state import RepartitionError
from weir.operators.operator import RUNTIME_ATTRIBUTES, Operator
from weir.operators.partitioning import PartitionFilter
from weir.operators.watermarks import WATERMARKS_ATTRIBUTE
from weir.runtime.event_time import merged_watermarks
from weir.storage import moved

__all__ = ["OperatorStateError", "capture", "new_partition", "restore", "state_of"]

_LOGGER = logging.getLogger(__name__)

_FORMAT = "weir-operator-state/1"


class OperatorStateError(Exception):
    """The state of an operator cannot be checkpointed or restored."""


def state_of(operator: Operator) -> dict[str, Any]:
    """The operator's state: its instance attributes minus ``NON_STATE`` and runtime ones."""
    skip = {*getattr(operator, "NON_STATE", ()), *RUNTIME_ATTRIBUTES}
    return {k: v for k, v in vars(operator).items() if k not in skip}


def capture(operator: Operator, name: str | None = None) -> bytes:
    """Serialises the operator's state with cloudpickle (app-file classes go by value).

    Args:
        operator: the operator, between windows.
        name: its name for error messages (default: its class name).

    Returns:
        Bytes for ``restore``.

    Raises:
        OperatorStateError: an attribute cannot be pickled; the message names it.
    """
    label = name or type(operator).__name__
    state = state_of(operator)
    try:
        return cloudpickle.dumps({"format": _FORMAT, "class": type(operator).__qualname__,
                                  "state": state})
    except Exception as exc:  # noqa: BLE001 - pickling can raise anything
        for key, value in state.items():  # find the culprit for the message
            try:
                cloudpickle.dumps(value)
            except Exception as bad:  # noqa: BLE001
                raise OperatorStateError(
                    f"attribute {key!r} of operator {label!r} cannot be checkpointed: "
                    f"{type(bad).__name__}: {bad}; list it in NON_STATE if it is not state"
                ) from bad
        raise OperatorStateError(f"the state of operator {label!r} cannot be checkpointed: "
                                 f"{type(exc).__name__}: {exc}") from exc


def restore(operator_or_class: Operator | type[Operator], data: bytes,
            name: str | None = None) -> Operator:
    """Rebuilds an operator from its deploy payload and a captured state.

    The payload instance (freshly unpickled) gets the saved state over its attributes;
    its ``NON_STATE`` attributes keep the payload's values, and ``setup()`` then recreates
    connections and caches. Given a class, the instance is made without ``__init__``.

    Args:
        operator_or_class: a fresh operator instance (preferred) or its class.
        data: bytes from ``capture``.
        name: the operator's name for error messages (default: its class name).

    Returns:
        The operator (the same instance when one was given).

    Raises:
        OperatorStateError: the bytes cannot be unpickled or belong to another class.
    """
    if isinstance(operator_or_class, type):
        operator = operator_or_class.__new__(operator_or_class)
    else:
        operator = operator_or_class
    cls = type(operator)
    label = name or cls.__name__
    try:
        saved = moved.loads(data)
    except Exception as exc:  # noqa: BLE001 - unpickling can raise anything
        raise OperatorStateError(f"the checkpoint of operator {label!r} cannot be restored: "
                                 f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(saved, dict) or saved.get("format") != _FORMAT:
        raise OperatorStateError(f"the checkpoint of operator {label!r} is not a Weir "
                                 "operator state")
    if saved["class"] != cls.__qualname__:
        raise OperatorStateError(f"the checkpoint of operator {label!r} holds the state of a "
                                 f"{saved['class']}, not of a {cls.__qualname__}")
    skip = set(getattr(cls, "NON_STATE", ()))
    operator.__dict__.update((k, v) for k, v in saved["state"].items() if k not in skip)
    _LOGGER.debug("restored operator %s: %d attributes", label, len(saved["state"]))
    return operator


def new_partition(partitions: Sequence[Operator], share: PartitionFilter | None) -> Operator:
    """The state of a new partition taking ``share`` of the keys, from the old partitions
    restored at the window it starts from.

    Raises:
        RepartitionError: there is no old partition, or they are of different classes.
    """
    if not partitions:
        raise RepartitionError("a new partition needs the state of at least one old one")
    classes = {type(p) for p in partitions}
    if len(classes) != 1:
        raise RepartitionError(f"old partitions are of different classes "
                               f"{sorted(c.__qualname__ for c in classes)}")
    first = copy.copy(partitions[0])
    result = first.repartitioned(partitions, share)
    if not isinstance(result, Operator):
        raise RepartitionError(f"{type(first).__name__}.repartitioned returned a "
                               f"{type(result).__name__}, not the operator")
    # the watermark is not keyed: the new partition takes the lowest of the old ones (its
    # own object, not the first partition's, which ``copy.copy`` shared)
    marks = merged_watermarks(partitions)
    if marks is None:
        result.__dict__.pop(WATERMARKS_ATTRIBUTE, None)
    else:
        result.__dict__[WATERMARKS_ATTRIBUTE] = marks
    return result

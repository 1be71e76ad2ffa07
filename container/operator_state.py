"""An operator's checkpointable state as bytes, so a redeployed operator resumes where it was.

Capturing and restoring live in ``operators.operator_state`` (the local test runner uses
them too); here is what only the container needs: a new partition's state.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from operators.event_time import merged_watermarks
from operators.keyed_state import RepartitionError
from operators.operator import Operator
from operators.operator_state import OperatorStateError, capture, restore, state_of
from operators.partitioning import PartitionFilter
from operators.watermarks import WATERMARKS_ATTRIBUTE

__all__ = ["OperatorStateError", "capture", "new_partition", "restore", "state_of"]


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

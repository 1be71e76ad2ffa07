"""Unifiers: merge the outputs of an operator's partitions into one stream (Apex's Unifier).

The master inserts one in front of each unpartitioned operator that a partitioned one
feeds (``master.physical_plan``). Its input ports are ``input-0`` ... ``input-<N-1>``, one
per partition, and are not declared: the runtime hands any port name to ``process``.
"""

from __future__ import annotations

import pyarrow as pa

from weir.operators.operator import Operator
from weir.operators.ports import OutputPort

__all__ = ["ConcatUnifier", "UNIFIER_INPUT_PREFIX", "unifier_input"]

UNIFIER_INPUT_PREFIX = "input-"


def unifier_input(index: int) -> str:
    """The name of the unifier's input port fed by partition ``index``."""
    return f"{UNIFIER_INPUT_PREFIX}{index}"


class ConcatUnifier(Operator):
    """The default unifier: every partition's batches go out as they came, window by window.

    Right whenever the partitions' outputs need no combining (each key is in one
    partition, or rows are independent), and costs no copy.
    """

    output = OutputPort()

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        self.output.emit(batch)

"""How a container keeps its buffers inside ``CONTAINER_MEMORY_MB``, the limit its
launcher holds it to (the local launcher kills a container over it; Kubernetes does too):
the buffer server keeps at most a quarter of it in memory before it spills to disk, and
each input port queues at most a sixteenth. Without a limit, the fixed defaults hold (the
buffer server's 256 MB, ``QUEUE_CAPACITY`` messages per port whatever their size)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from weir.container.buffer_server import MEMORY_BUDGET_BYTES

__all__ = ["buffer_memory_bytes", "input_queue_bytes"]


def _limit_bytes(attributes: Mapping[str, Any]) -> int:
    return int(attributes.get("CONTAINER_MEMORY_MB", 0) or 0) << 20


def buffer_memory_bytes(attributes: Mapping[str, Any]) -> int:
    """What the buffer server keeps in memory before spilling."""
    limit = _limit_bytes(attributes)
    return min(MEMORY_BUDGET_BYTES, limit // 4) if limit else MEMORY_BUDGET_BYTES


def input_queue_bytes(attributes: Mapping[str, Any]) -> int:
    """The payload bytes one input port may queue; 0 = no bound but its message count."""
    return _limit_bytes(attributes) // 16

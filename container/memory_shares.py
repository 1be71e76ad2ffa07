"""How a container keeps its buffers inside ``CONTAINER_MEMORY_MB``, the limit its
launcher holds it to (the local launcher kills a container over it; Kubernetes does too):
the buffer server keeps at most a quarter of it in memory before it spills to disk, and
each input port queues at most a sixteenth.

Arrow allocates from jemalloc in every container (``use_container_pool``), not from
pyarrow's default, mimalloc:

- jemalloc hands freed memory back to the system within a second, where mimalloc keeps
  more of it: a join's container moving 4 KB rows (``tests/e2e/test_state_beyond_memory``)
  peaked at a median 440 MB with mimalloc (5 runs) and 357 MB with jemalloc (7 runs), both
  with occasional spikes to 510-530 MB whose cause is not found yet.
- mimalloc maps fresh memory in huge pages, and a huge page's first touch can be slow on
  a virtual machine: reading Nexmark's 1.84 M bids (183 MB) into fresh memory, in a
  process of its own, five alternating runs each on this 2-core VM, took a median 296 ms
  of system time with mimalloc (90-741: slow only in some runs) and 109 ms (97-153) with
  jemalloc; wall time 386 ms (177-858) against 187 ms (182-220). In q1's container (one
  traced run) the source's thread spent 15-25 ms in the kernel per 36,800-row row
  group. Alternating single runs, three each: with jemalloc the source read all 1.84 M
  bids in its first 500 ms window every time (its thread's CPU 162-198 ms), with
  mimalloc 1.21, 1.66 and 1.84 M (416-426 ms), so q1 mostly needed a second window and
  job; the last result came 1.50-1.85 s against 1.61-1.95 s after the first window's
  end less a window (as the bench then counted).

Without a limit, the buffer server keeps a sixteenth of the machine's memory (at least
256 MB, at most 4 GB), and each port ``QUEUE_CAPACITY`` messages whatever their size.
A fixed 256 MB spilled where memory was plentiful: on Nexmark's q1
(2 M events, one container, 24 GB machine), a window's 1.84 M bids and its results are
about 400 MB until committed, and spilling them cost the ``SparkSql``'s emit a median
355 ms a job (306-380, four runs) against 180 ms (25-214, five runs) with 1.5 GB
(alternating single runs; a fifth 256 MB run, disturbed by another job, left out).
``BUFFER_MEMORY_MB``, when
set, is the buffer server's share instead of either default (the master refused it at
submit if it does not fit)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psutil
import pyarrow as pa

from weir.container.buffer_server import MEMORY_BUDGET_BYTES

__all__ = ["buffer_memory_bytes", "input_queue_bytes", "use_container_pool"]

HOST_SHARE = 16
"""Without a limit, the buffer server keeps this fraction of the machine's memory..."""
HOST_SHARE_MAX_BYTES = 4 << 30
"""... at most this much (and at least ``MEMORY_BUDGET_BYTES``)."""


def _limit_bytes(attributes: Mapping[str, Any]) -> int:
    return int(attributes.get("CONTAINER_MEMORY_MB", 0) or 0) << 20


def buffer_memory_bytes(attributes: Mapping[str, Any], host_bytes: int | None = None) -> int:
    """What the buffer server keeps in memory before spilling: ``BUFFER_MEMORY_MB`` when
    set (the submit checked it fits ``CONTAINER_MEMORY_MB``); else, with a limit, a
    quarter of it up to ``MEMORY_BUDGET_BYTES``; else a ``HOST_SHARE`` of ``host_bytes``
    (default: this machine's memory) between ``MEMORY_BUDGET_BYTES`` and
    ``HOST_SHARE_MAX_BYTES``."""
    asked = int(attributes.get("BUFFER_MEMORY_MB", 0) or 0)
    if asked:
        return asked << 20
    limit = _limit_bytes(attributes)
    if limit:
        return min(MEMORY_BUDGET_BYTES, limit // 4)
    if host_bytes is None:
        host_bytes = psutil.virtual_memory().total
    return max(MEMORY_BUDGET_BYTES, min(HOST_SHARE_MAX_BYTES, host_bytes // HOST_SHARE))


def input_queue_bytes(attributes: Mapping[str, Any]) -> int:
    """The payload bytes one input port may queue; 0 = no bound but its message count."""
    return _limit_bytes(attributes) // 16


def use_container_pool() -> str:
    """Makes Arrow's default pool jemalloc (the system's where pyarrow was built without
    it; see the module docs for why); returns the pool's name."""
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:  # a pyarrow built without jemalloc
        pa.set_memory_pool(pa.system_memory_pool())
    return pa.default_memory_pool().backend_name

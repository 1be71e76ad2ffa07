"""Stats listeners: code the master runs on an operator's heartbeat stats, to ask for more or
fewer partitions while the application runs (Apex's ``StatsListener``).

Give one to an operator with ``dag.add_operator(name, op, stats_listener=...)``. The master
calls ``process_stats`` with the figures of all the operator's partitions whenever the
application is healthy (every container and operator running, no recovery or
repartition under way), about five times a second; a listener that returns a partition
count different from the current one gets a repartition (``weir repartition`` does the
same by hand). The listener runs in the master process: keep it quick, and keep what it
remembers (a cooldown, a moving average) in its own attributes.

>>> scaler = ThroughputScaler(high=1000, low=100, max_partitions=4, cooldown_s=0)
>>> busy = OperatorStats("count", 0, (PartitionStats("count", 2500.0),))
>>> scaler.process_stats(busy)
3
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol

__all__ = ["OperatorStats", "PartitionStats", "StatsListener", "ThroughputScaler"]


@dataclasses.dataclass(frozen=True)
class PartitionStats:
    """One partition's figures, as ``weir operators`` shows them.

    Attributes:
        name: the physical operator's name (``count#0``).
        tuples_processed_per_second: rows in, over the stats interval.
        tuples_emitted_per_second: rows out.
        cpu_percent: of one core, spent in the operator's hooks.
        latency_ms: its window's end minus its upstream's, averaged.
        queue_size: batches waiting at its input ports.
        window_id: the newest window it finished.
    """

    name: str
    tuples_processed_per_second: float = 0.0
    tuples_emitted_per_second: float = 0.0
    cpu_percent: float = 0.0
    latency_ms: float = 0.0
    queue_size: int = 0
    window_id: int = -1


@dataclasses.dataclass(frozen=True)
class OperatorStats:
    """All partitions of one logical operator at one moment (Apex's batched stats).

    Attributes:
        operator: the DAG's operator name.
        now_ms: the master's clock (epoch ms).
        partitions: one entry per partition, in partition order.
    """

    operator: str
    now_ms: int
    partitions: tuple[PartitionStats, ...]

    @property
    def partition_count(self) -> int:
        return len(self.partitions)

    @property
    def tuples_processed_per_second(self) -> float:
        return sum(p.tuples_processed_per_second for p in self.partitions)


class StatsListener(Protocol):
    """What the master calls with an operator's stats; picklable (it travels in the DAG)."""

    def process_stats(self, stats: OperatorStats) -> int | None:
        """The partition count wanted, or None (or the current count) to leave it."""
        ...


class ThroughputScaler:
    """Keeps each partition's input rate between ``low`` and ``high`` tuples per second.

    Above ``high`` per partition it asks for enough partitions to bring each under
    ``high``; below ``low`` for as few as keep each under ``high``; within
    ``min_partitions``..``max_partitions``. It asks nothing within ``cooldown_s`` of
    seeing the operator first or with another partition count: new partitions warm up
    and replay before their rates mean anything.

    Args:
        high: tuples/s per partition above which it scales out.
        low: tuples/s per partition below which it scales in (0: never).
        min_partitions: never fewer.
        max_partitions: never more.
        cooldown_s: seconds between two requests.
    """

    def __init__(self, high: float, low: float = 0.0, min_partitions: int = 1,
                 max_partitions: int = 8, cooldown_s: float = 30.0) -> None:
        if high <= 0 or low < 0 or low >= high:
            raise ValueError(f"ThroughputScaler needs 0 <= low < high, got low={low}, "
                             f"high={high}")
        if not 1 <= min_partitions <= max_partitions:
            raise ValueError(f"ThroughputScaler needs 1 <= min_partitions <= max_partitions, "
                             f"got {min_partitions} and {max_partitions}")
        self.high = high
        self.low = low
        self.min_partitions = min_partitions
        self.max_partitions = max_partitions
        self.cooldown_s = cooldown_s
        self._count_since: tuple[int, int] | None = None  # (partition count, first seen ms)

    def process_stats(self, stats: OperatorStats) -> int | None:
        count = stats.partition_count
        if not count:
            return None
        if self._count_since is None or self._count_since[0] != count:
            self._count_since = (count, stats.now_ms)
        if stats.now_ms - self._count_since[1] < self.cooldown_s * 1000:
            return None
        total = stats.tuples_processed_per_second
        per_partition = total / count
        if per_partition > self.high:
            wanted = math.ceil(total / self.high)
        elif per_partition < self.low:
            wanted = max(1, math.ceil(total / self.high))
        else:
            return None
        wanted = min(self.max_partitions, max(self.min_partitions, wanted))
        if wanted == count:
            return None
        self._count_since = (count, stats.now_ms)  # asked: wait again before the next
        return wanted

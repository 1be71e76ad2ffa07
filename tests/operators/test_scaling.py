"""ThroughputScaler: what it asks for, and when it holds back."""

from __future__ import annotations

import pytest

from weir.operators.scaling import OperatorStats, PartitionStats, ThroughputScaler


def stats(now_s: float, *rates: float) -> OperatorStats:
    return OperatorStats("count", int(now_s * 1000),
                         tuple(PartitionStats(f"count#{i}", r) for i, r in enumerate(rates)))


def test_it_waits_for_the_rates_to_settle_then_scales_out_and_in():
    scaler = ThroughputScaler(high=1000, low=200, max_partitions=4, cooldown_s=10)
    assert scaler.process_stats(stats(0, 3500)) is None  # first seen: warming up
    assert scaler.process_stats(stats(5, 3500)) is None
    assert scaler.process_stats(stats(10, 3500)) == 4  # ceil(3500 / 1000), at most 4
    assert scaler.process_stats(stats(12, 3500)) is None  # asked: waits again
    # the 4 partitions' rates right after the change (replay) do not count
    assert scaler.process_stats(stats(13, 0, 0, 0, 0)) is None
    assert scaler.process_stats(stats(20, 900, 900, 900, 900)) is None  # within bounds
    assert scaler.process_stats(stats(24, 50, 50, 50, 50)) == 1  # 200/s: one is enough


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="low < high"):
        ThroughputScaler(high=100, low=100)
    with pytest.raises(ValueError, match="min_partitions <= max_partitions"):
        ThroughputScaler(high=100, min_partitions=3, max_partitions=2)

"""Process stats for heartbeats: real CPU, memory and GC figures."""

import gc

from weir.container.stats import GcMonitor, ProcessStats


def test_gc_monitor_counts_collections_and_time():
    monitor = GcMonitor()
    try:
        before = monitor.collections
        for _ in range(3):
            gc.collect()
        assert monitor.collections >= before + 3
        assert monitor.time_ns > 0
    finally:
        monitor.close()
    assert monitor._callback not in gc.callbacks


def test_process_sample_reports_cpu_and_memory():
    stats = ProcessStats()
    try:
        sum(i * i for i in range(2_000_000))  # burn some CPU
        sample = stats.sample()
        assert sample.cpu_percent > 0
        assert sample.memory_rss_mb > 10
        assert sample.memory_mb_free > 0
        assert stats.process_name.split("@")[0].isdigit()
    finally:
        stats.close()

"""Process stats for heartbeats: real CPU, memory and GC figures."""

import gc
import subprocess
import sys
import time

import psutil

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


def test_children_are_listed_again_only_after_their_ttl(monkeypatch):
    stats = ProcessStats()
    listed = []
    real = psutil.Process.children
    monkeypatch.setattr(psutil.Process, "children",
                        lambda self, recursive=False: listed.append(1) or real(self, recursive))
    try:
        for _ in range(5):
            stats.sample()
        assert listed == []  # listed once in __init__, before the patch
        stats._listed_s -= ProcessStats.CHILDREN_TTL_S
        stats.sample()
        assert listed == [1]
    finally:
        stats.close()


def test_a_child_counts_in_memory_and_one_that_ended_is_dropped():
    stats = ProcessStats()
    child = subprocess.Popen([sys.executable, "-c",
                              "import sys, time; x = bytearray(150 << 20); x[::4096] = b'1' * "
                              "len(x[::4096]); print('ready', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        alone = stats.sample().memory_rss_mb  # the child is not listed yet (TTL)
        stats._listed_s -= ProcessStats.CHILDREN_TTL_S
        with_child = stats.sample().memory_rss_mb
        assert with_child - alone >= 140
        child.kill()
        child.wait(timeout=10)
        stats.sample()  # notices the ended child, lists again at the next
        assert stats.sample().memory_rss_mb < with_child - 100
    finally:
        child.kill()
        child.wait(timeout=10)
        stats.close()


def test_a_child_found_late_brings_no_cpu_from_before_it_was_found():
    """A JVM listed up to CHILDREN_TTL_S after it started: what it used until then is not
    the interval's (it would show as a burst of several cores)."""
    stats = ProcessStats()
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nend = time.process_time() + 1.0\n"
                              "while time.process_time() < end: pass\n"
                              "print('burnt', flush=True)\ntime.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "burnt"
        burnt = sum(psutil.Process(child.pid).cpu_times()[:2])
        assert burnt >= 1.0
        stats.sample()
        time.sleep(0.5)  # an interval long enough that the listing's own CPU is small in it
        stats._listed_s -= ProcessStats.CHILDREN_TTL_S  # listed now, a second late
        found = stats.sample()
        assert found.cpu_percent < 50, found  # not its second of CPU in this interval
    finally:
        child.kill()
        child.wait(timeout=10)
        stats.close()

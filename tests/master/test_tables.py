"""The CLI's tables: what a dead container shows."""

from __future__ import annotations

from master.tables import container_rows
from proto import client_pb2


def test_a_killed_container_shows_no_stale_cpu_or_memory():
    live = client_pb2.ContainerInfo(id="c0", state="ACTIVE", heartbeats=3, cpu_percent=87.5,
                                    memory_rss_mb=120, memory_mb_free=900)
    dead = client_pb2.ContainerInfo(id="c1", state="KILLED", heartbeats=3, cpu_percent=87.5,
                                    memory_rss_mb=120, memory_mb_free=900)
    live_row, dead_row = container_rows([live, dead], now_ms=0)
    assert "87.5" in live_row
    assert "87.5" not in dead_row and dead_row[6:9] == ["-", "-", "-"]

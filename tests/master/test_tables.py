"""The CLI's tables: what a dead container shows."""

from __future__ import annotations

from weir.master.tables import application_details, container_rows
from weir.proto import client_pb2


def test_a_killed_container_shows_no_stale_cpu_or_memory():
    live = client_pb2.ContainerInfo(id="c0", state="ACTIVE", heartbeats=3, cpu_percent=87.5,
                                    memory_rss_mb=120, memory_mb_free=900)
    dead = client_pb2.ContainerInfo(id="c1", state="KILLED", heartbeats=3, cpu_percent=87.5,
                                    memory_rss_mb=120, memory_mb_free=900)
    live_row, dead_row = container_rows([live, dead], now_ms=0)
    assert "87.5" in live_row
    assert "87.5" not in dead_row and dead_row[6:9] == ["-", "-", "-"]


def test_weir_app_tells_of_repartitions_only_when_there_were_some():
    app = client_pb2.ApplicationInfo(id="app-0001", state="RUNNING")
    assert "repartitions" not in application_details(app, now_ms=0)
    app.repartitions = 2
    app.last_repartition = "operator 'count': 2 -> 4 partitions from checkpoint 7"
    assert "repartitions:     2, last: operator 'count': 2 -> 4 partitions" in \
        application_details(app, now_ms=0)


def test_weir_apps_and_weir_app_tell_where_a_run_came_from_and_the_savepoint_it_took():
    from weir.master.tables import application_rows

    resumed = client_pb2.ApplicationInfo(id="app-0002", state="RUNNING",
                                         from_savepoint="/sp/v1")
    taking = client_pb2.ApplicationInfo(id="app-0001", state="RUNNING",
                                        savepoint_path="/sp/v1", savepoint_state="writing")
    assert application_rows([resumed], now_ms=0)[0][-1] == "from savepoint /sp/v1"
    assert application_rows([taking], now_ms=0)[0][-1] == "savepoint writing at /sp/v1"
    assert "from savepoint:   /sp/v1" in application_details(resumed, now_ms=0)
    assert "\nsavepoint:" not in application_details(resumed, now_ms=0)

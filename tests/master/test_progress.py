"""The progress watchdog, stepped by hand: a committed window that stands still while the
sources emit makes the application stalled (said once, with the operator furthest
behind), shown by the views, and progressing again once a window commits; a quiet
source stalls nothing."""

from __future__ import annotations

import pytest

from tests.master.cluster import RELAY, SINK, SOURCE, chain, checkpointed
from tests.master.fakes import window
from weir.master.progress import STALL_FLOOR_MS, check_progress, stall_after_ms
from weir.master.tables import application_rows
from weir.master.views import application_info

pytestmark = pytest.mark.timeout(30)


def test_a_committed_window_that_stands_still_while_sources_emit_is_a_stall():
    cluster = chain()
    app = cluster.app
    for op_id in (SOURCE, RELAY, SINK):
        checkpointed(cluster, op_id, 20)
    assert app.committed_window_id == 20
    assert check_progress(app, cluster.clock()) is None  # the watch starts here
    wait_ms = stall_after_ms(app)
    assert wait_ms >= STALL_FLOOR_MS
    for step in range(1, 6):  # the source emits; the relay and the sink never checkpoint
        cluster.clock.advance(wait_ms // 4)
        cluster.report(SOURCE, window(20 + step, tuples_out=100, in_port=None,
                                      checkpoint=20 + step))
        cause = check_progress(app, cluster.clock())
        if cause is not None:
            break
    assert cause is not None and step == 4, step  # once the time passed, not before
    assert "no window committed for" in cause and "emitted 400 tuples" in cause
    assert "furthest behind: operator 'relay1' (2) in container app-0001-c1" in cause
    assert check_progress(app, cluster.clock() + 1) is None  # said once
    info = application_info(app, "", cluster.clock())
    assert info.stalled_since_ms > 0 and info.state == "RUNNING"
    assert any(f.message == cause for f in info.recent_failures)
    [row] = application_rows([info], cluster.clock())
    assert row[2].startswith("RUNNING, STALLED")
    for op_id in (RELAY, SINK):  # a window commits again
        checkpointed(cluster, op_id, 24)
    assert app.committed_window_id == 24
    assert check_progress(app, cluster.clock()) is None
    info = application_info(app, "", cluster.clock())
    assert info.stalled_since_ms == 0
    assert info.recent_failures[0].message.startswith("progressing again: window")


def test_sources_that_emit_nothing_stall_nothing():
    cluster = chain()
    app = cluster.app
    check_progress(app, cluster.clock())
    cluster.clock.advance(10 * stall_after_ms(app))
    cluster.report(SOURCE, window(5, tuples_out=0, in_port=None))
    assert check_progress(app, cluster.clock()) is None
    assert application_info(app, "", cluster.clock()).stalled_since_ms == 0


def test_stall_timeout_millis_sets_how_long_before_a_stall():
    cluster = chain(STALL_TIMEOUT_MILLIS="5000")
    app = cluster.app
    assert stall_after_ms(app) == 5_000
    check_progress(app, cluster.clock())
    cluster.clock.advance(4_000)
    cluster.report(SOURCE, window(1, tuples_out=10, in_port=None))
    assert check_progress(app, cluster.clock()) is None
    cluster.clock.advance(1_000)
    assert check_progress(app, cluster.clock()) is not None

"""Window ids in heartbeats are checked: a forged one is rejected and the statistics keep moving.

Played by hand on a chain (source -> relay1 -> sink, one operator per container) whose
windows carry the application's real epoch, with a manual clock.
"""

from __future__ import annotations

import logging

import pytest

from tests.master.cluster import C1, C3, RELAY, SINK, SOURCE, chain
from tests.master.fakes import T0_MS, window
from weir.master.log_limits import LogLimiter
from weir.master.physical_plan import OperatorState
from weir.master.window_checks import MAX_WINDOW_LEAD_MS
from weir.operators.windows import make_window_id

pytestmark = pytest.mark.timeout(30)

BASE = T0_MS // 1000  # the application's epoch: the manual clock starts on a whole second
FORGED = 2**63 - 1


def w(counter: int, base: int = BASE) -> int:
    return make_window_id(base, counter)


def rejections(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "weir.master.heartbeat" and "are ignored" in r.getMessage()]


@pytest.fixture
def cluster():
    cluster = chain(plain_window_ids=False)
    assert cluster.app.start_window_millis == T0_MS
    return cluster


def test_a_forged_window_id_is_rejected_and_stats_keep_moving(cluster, caplog):
    caplog.set_level(logging.WARNING, "weir.master.heartbeat")
    stats = cluster.app.operator_stats[RELAY]
    cluster.report(RELAY, window(w(1), tuples_in=5), window(w(2), tuples_in=5))
    assert (stats.current_window_id, stats.total_tuples_processed) == (w(2), 10)

    response = cluster.report(RELAY, window(FORGED, tuples_in=1_000_000,
                                            checkpoint=FORGED))
    assert not response.shutdown and cluster.ops[RELAY].state == OperatorState.ACTIVE
    assert (stats.current_window_id, stats.total_tuples_processed) == (w(2), 10)
    assert stats.last_window_id == w(2)
    assert cluster.app.checkpoints[RELAY].windows == []
    [line] = rejections(caplog)
    assert f"container={C1}" in line and "operator=relay1 (2)" in line
    assert str(FORGED) in line and "base is not the application's" in line

    cluster.report(RELAY, window(w(3), tuples_in=5))  # the real container carries on
    assert (stats.current_window_id, stats.total_tuples_processed) == (w(3), 15)


def test_window_ids_of_another_epoch_are_rejected(cluster, caplog):
    caplog.set_level(logging.WARNING, "weir.master.heartbeat")
    cluster.report(SOURCE, window(w(1, BASE + 1)))
    cluster.report(SOURCE, window(w(1, BASE - 1)))
    assert cluster.app.operator_stats[SOURCE].current_window_id == -1
    assert len(rejections(caplog)) == 1  # the same kind of warning, rate-limited


def test_window_ids_far_ahead_of_the_clock_are_rejected(cluster, caplog):
    caplog.set_level(logging.WARNING, "weir.master.heartbeat")
    cluster.clock.advance(10_000)  # window counter 20 now, at 500 ms a window
    limit = (10_000 + MAX_WINDOW_LEAD_MS) // 500
    cluster.report(SOURCE, window(w(limit + 1)))
    assert cluster.app.operator_stats[SOURCE].current_window_id == -1
    [line] = rejections(caplog)
    assert "ahead of the master's clock" in line
    cluster.report(SOURCE, window(w(limit)))  # a clock ahead by the tolerance: believed
    assert cluster.app.operator_stats[SOURCE].current_window_id == w(limit)


def test_windows_going_backwards_are_rejected_but_the_last_may_repeat(cluster, caplog):
    caplog.set_level(logging.WARNING, "weir.master.heartbeat")
    stats = cluster.app.operator_stats[SINK]
    cluster.report(SINK, *(window(w(i), tuples_in=1) for i in range(1, 6)))
    cluster.report(SINK, window(w(3), tuples_in=1))
    assert "goes back from window" in rejections(caplog)[0]
    cluster.clock.advance(60_000)  # past the rate limit of that warning
    cluster.report(SINK, window(w(7)), window(w(6)))  # out of order within one report
    assert len(rejections(caplog)) == 2 and stats.current_window_id == w(5)
    # the final checkpoint comes with a repeat of the last window: not a problem
    cluster.report(SINK, window(w(5), checkpoint=w(5)))
    assert cluster.app.checkpoints[SINK].windows == [w(5)]
    assert len(rejections(caplog)) == 2 and stats.total_tuples_processed == 5


def test_checkpoints_outside_the_instances_windows_are_rejected(cluster, caplog):
    caplog.set_level(logging.WARNING, "weir.master.heartbeat")
    cluster.report(SOURCE, window(w(5), checkpoint=w(900)))
    cluster.report(RELAY, window(w(5), checkpoint=w(5, BASE + 7)))
    assert [cluster.app.checkpoints[i].windows for i in (SOURCE, RELAY)] == [[], []]
    lines = rejections(caplog)
    assert "checkpoint outside" in lines[0] and "checkpoint: its base" in lines[1]
    assert cluster.app.operator_stats[SOURCE].current_window_id == -1  # the whole report


def test_a_redeployed_operator_restarts_from_its_checkpoint(cluster, caplog):
    caplog.set_level(logging.WARNING, "weir.master.heartbeat")
    for op_id in (SOURCE, RELAY, SINK):
        cluster.report(op_id, *(window(w(i), tuples_in=1, checkpoint=w(i) if i == 10 else None)
                                for i in range(1, 16)))
    stats = cluster.app.operator_stats[RELAY]
    cluster.liveness({C1: -9})
    assert cluster.ops[RELAY].deploy_window_id == w(10) and stats.last_window_id == -1
    cluster.beat(cluster.ops[SINK].container_id)  # the sink's old instance is undeployed
    cluster.beat(C3)  # the new container joins, gets the relay's deploy
    cluster.report(RELAY, window(w(10), tuples_in=1))  # its deploy checkpoint: not its window
    assert "not after the checkpoint the operator was deployed from" in rejections(caplog)[0]
    cluster.report(RELAY, *(window(w(i), tuples_in=1) for i in range(11, 17)))
    assert len(rejections(caplog)) == 1  # replayed windows are no problem...
    assert stats.last_window_id == w(16) and stats.current_window_id == w(16)
    assert stats.total_tuples_processed == 16  # ... and not counted twice


def test_warnings_about_the_same_problem_are_rate_limited(cluster, caplog):
    caplog.set_level(logging.WARNING, "weir.master.heartbeat")
    for _ in range(100):
        cluster.report(RELAY, window(FORGED))
        cluster.clock.advance(100)
    cluster.report(SINK, window(FORGED))  # another operator: its own line
    assert len(rejections(caplog)) == 2
    cluster.clock.advance(60_000)
    cluster.report(RELAY, window(FORGED))
    lines = rejections(caplog)
    assert len(lines) == 3 and lines[2].endswith(
        "(99 similar warning(s) suppressed since the last one)")


def test_log_limiter_keys_interval_and_memory():
    limiter = LogLimiter(interval_ms=1_000, max_keys=2)
    assert [limiter.admit(key, 0) for key in ("a", "b", "a")] == [0, 0, None]
    assert limiter.admit("c", 10) == 0  # "a" (least recently logged) is forgotten
    assert limiter.admit("a", 20) == 0 and limiter.admit("b", 30) == 0
    assert limiter.admit("b", 500) is None and limiter.admit("b", 1_030) == 1


def test_ports_the_plan_did_not_give_and_metrics_past_the_bounds_are_left_out(cluster,
                                                                               caplog):
    """Issue 17, item 7: a report cannot grow the master with names of its choosing."""
    from weir.master.report_filter import MAX_METRIC_NAME_CHARS, MAX_METRICS

    caplog.set_level(logging.WARNING, "weir.master.heartbeat")
    stats = cluster.app.operator_stats[RELAY]
    flood = window(w(1), tuples_in=5, tuples_out=5)
    for i in range(500):
        flood.output_ports.add(id=f"made-up-{i}", tuple_count=1)
    flood.metrics.update({f"m{i}": float(i) for i in range(1000)})
    flood.metrics["x" * (MAX_METRIC_NAME_CHARS + 1)] = 1.0
    cluster.report(RELAY, flood)
    assert set(stats.ports) == {("input", "input"), ("output", "output")}
    assert stats.total_tuples_processed == 5  # the declared ports count
    assert len(stats.metrics) == MAX_METRICS and len(stats.recent[-1].metrics) == MAX_METRICS
    assert all(len(name) <= MAX_METRIC_NAME_CHARS for name in stats.metrics)
    [line] = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert "500 port(s) it does not have (output 'made-up-0'" in line
    assert "936 metric(s) past the first 64" in line
    assert "over 128 characters" in line

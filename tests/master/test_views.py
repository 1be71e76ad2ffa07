"""The views every monitoring surface shares: rates, latency, critical path, user metrics."""

from __future__ import annotations

import collections

import pytest

from tests.master.fakes import container_heartbeat, operator_report, reported, window
from tests.master.monitoring import WINDOWS, monitored_core
from weir.master import views
from weir.master.stats import OperatorStatsTracker
from weir.operators.windows import make_window_id
from weir.proto import umbilical_pb2

pytestmark = pytest.mark.timeout(30)


def test_application_totals_rates_and_critical_path():
    core, app_id = monitored_core()
    info = core.application_info(app_id)
    assert (info.total_tuples_processed, info.total_tuples_emitted) == (
        WINDOWS * 150, WINDOWS * 150)
    # 200/s out of the source, 200 in and 100 out of the relay, 100 into the sink
    assert round(info.tuples_emitted_per_second) == 300
    assert round(info.tuples_processed_per_second) == 300
    assert info.latency_ms == pytest.approx(50.0)
    assert list(info.critical_path) == ["source", "relay1", "sink"]
    relay = next(op for op in info.logical_operators if op.name == "relay1")
    assert relay.metrics["dropped"] == 50.0 * WINDOWS and list(relay.partition_ids) == [2]
    assert relay.latency_ms == pytest.approx(20.0)


def test_operator_ports_windows_and_metrics():
    core, app_id = monitored_core()
    relay = core.operator_info(app_id, "relay1")
    assert relay.metrics["dropped"] == 50.0 * WINDOWS and relay.logical_name == "relay1"
    assert relay.committed_window_id == -1
    out = next(p for p in relay.ports if p.type == "output")
    assert out.buffer_server_bytes == WINDOWS * 50 * 8
    assert round(out.buffer_server_bytes_per_second) == 800  # 400 bytes per 500 ms
    assert round(out.tuples_per_second) == 100
    assert [w.latency_ms for w in relay.recent_windows] == [20] * WINDOWS
    assert relay.recent_windows[-1].metrics["dropped"] == 50.0 * WINDOWS
    source = core.operator_info(app_id, "source")
    assert [w.latency_ms for w in source.recent_windows] == [-1] * WINDOWS


def test_plan_has_streams_and_operators():
    core, app_id = monitored_core()
    plan = core.application_plan(app_id)
    assert [op.name for op in plan.operators] == ["source", "relay1", "sink"]
    assert [(s.source_operator_id, s.sink_operator_id) for s in plan.streams] == [(1, 2), (2, 3)]
    assert round(plan.streams[0].tuples_per_second) == 200


def test_containers_show_host():
    core, app_id = monitored_core()
    [container] = core.list_containers(app_id)
    assert container.host == "testhost" and container.process_name == "7000@testhost"


def test_moving_average_follows_the_interval():
    tracker = OperatorStatsTracker()
    # 10 tuples per 100 ms window for 20 windows, then 40 per window for 5 windows
    counts = [10] * 20 + [40] * 5
    tracker.record(reported(operator_report(1, windows=[
        window(i, tuples_in=n, end_ms=1000 + 100 * i) for i, n in enumerate(counts)])), 0)
    assert round(tracker.rates(500)[0]) == 400
    assert round(tracker.rates(None)[0]) == round(sum(counts[1:]) / 2.4)


def test_failures_list_newest_first():
    core, app_id = monitored_core()
    core.kill_container(f"{app_id}-c0")
    failures = core.application_info(app_id).recent_failures
    assert failures[0].kind == "container" and "killed by the user" in failures[0].message


def test_reported_errors_are_shown_with_their_time_and_source_among_the_failures():
    core, app_id = monitored_core()
    cid = f"{app_id}-c0"
    core.report_error(cid, [], "its disk is full: ENOSPC")
    core.report_error(cid, [], "its disk is full: ENOSPC")  # said again: kept once
    reported_ms = core.clock()
    core.clock.advance(5_000)
    core.kill_container(f"{app_id}-c0")
    failures = core.application_info(app_id).recent_failures
    kinds = [f.kind for f in failures]
    assert kinds[0] == "container" and kinds[-1] == "error"  # newest first
    assert kinds.count("error") == 1
    error = failures[-1]
    assert (error.time_ms, error.subject) == (reported_ms, cid)
    assert error.message == "its disk is full: ENOSPC"


def test_an_operator_failure_keeps_the_time_it_happened_across_calls():
    core, app_id = monitored_core()
    cid = f"{app_id}-c0"
    failed_ms = core.clock.advance(1_000)
    core.heartbeat(container_heartbeat(cid, operators=[operator_report(
        2, state=umbilical_pb2.OPERATOR_STATE_FAILED, error="relay1 broke")]))

    def operator_failure():
        return next(f for f in core.application_info(app_id).recent_failures
                    if f.kind == "operator")

    assert operator_failure().time_ms == failed_ms
    core.clock.advance(7_000)
    core.check_liveness()  # the failed operator's container is restarted
    replacement = f"{app_id}-c1"
    core.heartbeat(container_heartbeat(replacement, port=7001))  # its operators sent again
    core.clock.advance(3_000)
    start = core.application_info(app_id).start_window_millis
    later = window(make_window_id(start // 1000, WINDOWS + 20), end_ms=core.clock())
    core.heartbeat(container_heartbeat(replacement, port=7001, operators=[
        operator_report(i, windows=[later]) for i in (1, 2, 3)]))  # running, reporting
    assert operator_failure().time_ms == failed_ms  # not its last report's time


def test_a_journal_of_errors_kept_as_text_loads_them_with_their_source():
    core, app_id = monitored_core()
    with core.lock:
        app = core.application(app_id)
        state = dict(app.__dict__, reported_errors=collections.deque(
            [f"{app_id}-c1 ['relay1']: boom", "master: a listener failed"]))
        old = object.__new__(type(app))
        old.__setstate__(state)
        assert [(e.source, e.message) for e in old.reported_errors] == [
            (f"{app_id}-c1", "['relay1']: boom"), ("master", "a listener failed")]


def test_critical_path_of_an_empty_plan_is_zero():
    core, app_id = monitored_core()
    with core.lock:
        app = core.application(app_id)
        assert views.application_plan(app).application_id == app_id


def test_an_operator_that_does_not_run_now_shows_no_rate():
    core, app_id = monitored_core()
    relay = next(o for o in core.list_operators(app_id) if o.name == "relay1")
    assert relay.tuples_processed_per_second > 0
    core.clock.advance(11_000)  # no window for longer than the heartbeat timeout
    relay = next(o for o in core.list_operators(app_id) if o.name == "relay1")
    assert relay.tuples_processed_per_second == 0 and relay.tuples_emitted_per_second == 0
    assert core.application_info(app_id).tuples_processed_per_second == 0
    assert relay.total_tuples_processed == 1_000  # the totals stay


def test_operators_that_do_not_run_windows_are_counted_in_every_view():
    """The hung recovery of issue 52 showed "0 failed" and nothing else: operators deployed
    but in setup, or waiting for a replacement container, count as not running."""
    from tests.master.cluster import C1, RELAY, SINK, SOURCE, Cluster, chain, chain_descriptor
    from weir.master import metrics
    from weir.master.tables import application_details, application_rows

    cluster = Cluster(chain_descriptor(3), 3)
    cluster.deploy_all(in_setup=(SINK,))
    assert views.application_info(cluster.app).operators_not_running == 1
    cluster = chain()
    info = views.application_info(cluster.app)
    assert (info.operators_not_running, info.operators_failed) == (0, 0)
    assert application_rows([info], now_ms=0)[0][4] == "3"
    cluster.liveness({C1: -9})  # the relay's container: the relay and the sink redeploy
    info = views.application_info(cluster.app)
    assert info.operators_not_running == 2
    assert cluster.ops[SOURCE].state.value == "ACTIVE"
    assert cluster.ops[RELAY].state.value == "PENDING_DEPLOY"
    assert application_rows([info], now_ms=0)[0][4] == "3 (2 not running)"
    assert "operators:        3 (0 failed, 2 not running" in application_details(info, 0)
    families = metrics._Families()
    metrics._application(families, info)
    shown = {f.name: f.samples[0].value for f in families}
    assert shown["weir_application_operators_not_running"] == 2
    assert shown["weir_application_operators_failed"] == 0


def test_a_brief_application_info_leaves_out_only_the_per_operator_figures():
    core, app_id = monitored_core()
    full = core.application_info(app_id)
    brief = core.application_info(app_id, brief=True)
    assert full.tuples_processed_per_second > 0 and full.logical_operators
    assert (brief.state, brief.operators, brief.committed_window_id,
            brief.total_tuples_processed, brief.containers_active) == (
        full.state, full.operators, full.committed_window_id, full.total_tuples_processed,
        full.containers_active)
    assert brief.tuples_processed_per_second == 0 and not brief.logical_operators
    assert not brief.critical_path and not brief.recent_failures

"""Watermarks as the master shows them: the tracker's newest, a logical operator's lowest
over its partitions, the event-time lag, ``weir stats`` and Prometheus."""

from __future__ import annotations

import math
import pickle

import pytest
from prometheus_client import generate_latest

from tests.master.fakes import (
    ManualClock,
    container_heartbeat,
    operator_report,
    partitioned_dag,
    reported,
    window,
)
from tests.master.test_metrics import samples, value
from weir.master.core import MasterCore
from weir.master.launcher import RecordingLauncher
from weir.master.metrics import master_registry
from weir.master.stats import OperatorStatsTracker
from weir.master.tables import operator_details
from weir.operators.watermarks import END_OF_TIME, NO_WATERMARK
from weir.operators.windows import make_window_id
from weir.proto import client_pb2

pytestmark = pytest.mark.timeout(30)

T = 1_700_000_000_000
WINDOWS = 4


def test_the_tracker_keeps_the_newest_window_watermark_not_a_replayed_one():
    tracker = OperatorStatsTracker()
    assert tracker.watermark_ms == NO_WATERMARK
    tracker.record(reported(operator_report(1, windows=[window(1, watermark=T - 5_000),
                                                window(2, watermark=T - 3_000)])), T)
    assert tracker.watermark_ms == T - 3_000
    tracker.record(reported(operator_report(1, windows=[window(2, watermark=T - 9_000)])), T)
    assert tracker.watermark_ms == T - 3_000, "a window reported twice counts once"
    tracker.record(reported(operator_report(1, windows=[window(3, watermark=END_OF_TIME)])), T)
    assert tracker.watermark_ms == END_OF_TIME


def test_a_journal_from_before_watermarks_restores_without_one():
    tracker = OperatorStatsTracker()
    state = tracker.__getstate__()
    del state["watermark_ms"]
    old = OperatorStatsTracker.__new__(OperatorStatsTracker)
    old.__setstate__(state)
    assert old.watermark_ms == NO_WATERMARK
    assert pickle.loads(pickle.dumps(tracker)).watermark_ms == NO_WATERMARK


def partitioned_core(marks: dict[str, int]) -> tuple[MasterCore, ManualClock, str]:
    """source -> relay (two partitions and their unifier) -> sink in one container; each
    operator reports ``WINDOWS`` windows, the last of them with its watermark in ``marks``
    (by physical name; NO_WATERMARK for those not named)."""
    clock = ManualClock(T)
    core = MasterCore(RecordingLauncher("127.0.0.1:1"), clock=clock)
    app_id = core.submit(partitioned_dag("marked").to_descriptor(), {})
    cid = f"{app_id}-c0"
    core.heartbeat(container_heartbeat(cid, port=7000))
    start = core.application_info(app_id).start_window_millis
    clock.advance(WINDOWS * 500 + 1000)
    reports = []
    for op in core.list_operators(app_id):
        windows = [window(make_window_id(start // 1000, i), end_ms=start + 500 * (i + 1),
                          in_port=None if op.name == "source" else "input",
                          out_port=None if op.name == "sink" else "output",
                          watermark=marks.get(op.name, NO_WATERMARK)
                          if i == WINDOWS - 1 else NO_WATERMARK)
                   for i in range(WINDOWS)]
        reports.append(operator_report(op.id, windows=windows))
    core.heartbeat(container_heartbeat(cid, port=7000, operators=reports))
    return core, clock, app_id


def test_views_give_each_partition_its_watermark_and_lag_and_the_logical_the_lowest():
    core, clock, app_id = partitioned_core({"source": END_OF_TIME, "relay#0": T - 60_000,
                                            "relay#1": T - 2_000})
    now = clock.now_ms
    ops = {op.name: op for op in core.list_operators(app_id)}
    assert ops["relay#0"].watermark_ms == T - 60_000
    assert ops["relay#0"].event_time_lag_ms == now - (T - 60_000)
    assert ops["relay#1"].event_time_lag_ms == now - (T - 2_000)
    assert (ops["source"].watermark_ms, ops["source"].event_time_lag_ms) == (END_OF_TIME, 0)
    assert (ops["sink"].watermark_ms, ops["sink"].event_time_lag_ms) == (NO_WATERMARK, 0)
    assert core.operator_info(app_id, "relay#1").watermark_ms == T - 2_000
    logical = {op.name: op for op in core.application_info(app_id).logical_operators}
    assert logical["relay"].watermark_ms == T - 60_000
    assert logical["relay"].event_time_lag_ms == now - (T - 60_000)
    assert logical["sink"].watermark_ms == NO_WATERMARK
    plan = {op.name: op for op in core.application_plan(app_id).operators}
    assert plan["relay#0"].event_time_lag_ms == now - (T - 60_000)


def test_a_logical_operator_with_a_partition_without_watermark_has_none():
    core, _, app_id = partitioned_core({"relay#0": T})
    logical = {op.name: op for op in core.application_info(app_id).logical_operators}
    assert (logical["relay"].watermark_ms, logical["relay"].event_time_lag_ms) == (
        NO_WATERMARK, 0)


def test_weir_stats_shows_the_watermark_and_the_event_time_lag():
    op = client_pb2.OperatorInfo(name="count", watermark_ms=1_700_000_000_000,
                                 event_time_lag_ms=75_000)
    text = operator_details(op, now_ms=0)
    assert "watermark:         2023-11-14T22:13:20.000Z\n" in text
    assert "event-time lag:    1 min 15 s\n" in text
    for mark, shown in ((NO_WATERMARK, "-"), (END_OF_TIME, "end")):
        text = operator_details(client_pb2.OperatorInfo(name="x", watermark_ms=mark), 0)
        assert f"watermark:         {shown}\n" in text
        assert "event-time lag:    -\n" in text


def test_prometheus_has_the_watermark_of_operators_that_have_one_and_their_lag():
    core, clock, app_id = partitioned_core({"source": END_OF_TIME, "relay#0": T - 60_000})
    found = samples(generate_latest(master_registry(core)).decode())
    assert value(found, "weir_operator_watermark_seconds", operator="relay#0") == \
        (T - 60_000) / 1000
    assert value(found, "weir_operator_event_time_lag_seconds", operator="relay#0") == \
        (clock.now_ms - (T - 60_000)) / 1000
    assert value(found, "weir_operator_watermark_seconds", operator="source") == math.inf
    assert value(found, "weir_operator_event_time_lag_seconds", operator="source") == 0
    for gauge in ("weir_operator_watermark_seconds", "weir_operator_event_time_lag_seconds"):
        having = {dict(labels)["operator"] for name, labels in found if name == gauge}
        assert having == {"source", "relay#0"}, f"{gauge}: only operators with a watermark"

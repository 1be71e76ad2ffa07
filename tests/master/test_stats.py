"""Stats accumulation: totals, per-port figures, the recent-window ring, rates and latency."""

from __future__ import annotations

import gc

import pytest

from tests.master.fakes import container_heartbeat, operator_report, reported, window
from weir.master.stats import (
    RECENT_WINDOWS,
    ContainerStatsTracker,
    OperatorStatsTracker,
    latency_ms,
)

pytestmark = pytest.mark.timeout(30)

T = 1_700_000_000_000


def test_totals_ports_and_ring():
    tracker = OperatorStatsTracker()
    windows = [window(i, tuples_in=2, tuples_out=1, end_ms=T + 100 * i) for i in range(150)]
    assert tracker.record(reported(operator_report(1, windows=windows)), now_ms=T + 20_000) == 150
    assert tracker.total_tuples_processed == 300 and tracker.total_tuples_emitted == 150
    assert tracker.windows_processed == 150 and tracker.current_window_id == 149
    assert len(tracker.recent) == RECENT_WINDOWS and tracker.recent[0].window_id == 50
    assert tracker.last_heartbeat_ms == T + 20_000
    port_in = tracker.ports[("input", "input")]
    port_out = tracker.ports[("output", "output")]
    assert (port_in.total_tuples, port_out.total_tuples) == (300, 150)
    assert port_out.buffer_server_bytes == 150 * 8
    assert round(port_in.tuples_per_second, 6) == 20.0  # 2 tuples per 100 ms
    assert round(tracker.tuples_emitted_per_second, 6) == 10.0


def test_an_inputs_transport_is_its_last_reported_one_and_an_unknown_one_is_left_blank():
    tracker = OperatorStatsTracker()
    sent = [window(1), window(2), window(3), window(4)]
    for stats, transport in zip(sent, ("local", "", "flight", "carrier-pigeon"), strict=True):
        stats.input_ports[0].transport = transport
    windows = reported(operator_report(1, windows=sent))
    assert [w.inputs[0][5] for w in windows] == ["local", "", "flight", ""]
    tracker.record(windows[:2], now_ms=T)
    assert tracker.ports[("input", "input")].transport == "local"  # "" keeps the last one
    tracker.record(windows[2:], now_ms=T)
    assert tracker.ports[("input", "input")].transport == "flight"


def test_the_window_history_is_left_out_of_the_garbage_collectors_walks():
    """A master with 10,000 operators keeps a million recent windows: were they objects
    the collector walks, each full collection would pause every heartbeat."""
    tracker = OperatorStatsTracker()
    windows = [window(i, tuples_in=2, tuples_out=1, end_ms=T + 100 * i) for i in range(20)]
    tracker.record(reported(operator_report(1, windows=windows)), now_ms=T + 2_000)
    gc.collect()
    assert not any(gc.is_tracked(record) for record in tracker.window_ring)
    assert not any(gc.is_tracked(point) for port in tracker.ports.values()
                   for point in port.recent)


def test_rates_need_two_windows():
    tracker = OperatorStatsTracker()
    tracker.record(reported(operator_report(1, windows=[window(1, 5, 5, T, 10**9)])), T)
    assert tracker.tuples_processed_per_second == 0.0 and tracker.cpu_percent == 0.0


def test_latency_is_end_window_here_minus_upstream():
    source, sink = OperatorStatsTracker(), OperatorStatsTracker()
    source.record(reported(operator_report(1, windows=[
        window(i, end_ms=T + 500 * i, in_port=None) for i in range(4)])), T)
    sink.record(reported(operator_report(2, windows=[
        window(i, end_ms=T + 500 * i + 20 + 10 * i, out_port=None) for i in range(3)])), T)
    assert latency_ms(sink, [source]) == 30.0  # (20 + 30 + 40) / 3
    assert latency_ms(source, []) == 0.0


def test_container_figures_are_the_last_heartbeat():
    tracker = ContainerStatsTracker()
    tracker.record(container_heartbeat("c", port=9), T)
    tracker.record(container_heartbeat("c", port=9, sent_tms=T + 5), T + 500)
    assert (tracker.heartbeats, tracker.last_heartbeat_ms, tracker.process_name) == (
        2, T + 500, "9@testhost")
    assert (tracker.memory_rss_mb, tracker.memory_mb_free, tracker.gc_collection_count) == (
        123, 2048, 3)
    assert tracker.cpu_percent == 12.5 and tracker.last_sent_tms == T + 5


def test_a_journaled_tracker_keeps_its_totals_and_ports_not_its_rings():
    """The journal's copy of a tracker: totals and each port's totals, as plain tuples;
    no recent-window ring (its own or a port's): rates start over after a restart."""
    import pickle

    from weir.master.stats import OperatorStatsTracker

    tracker = OperatorStatsTracker()
    for kind, name in (("input", "in"), ("output", "out")):
        totals = tracker._port(kind, name)  # noqa: SLF001
        totals.total_tuples, totals.buffer_server_bytes, totals.transport = 7, 70, "flight"
        totals.recent.extend([(1, 2, 3)] * 50)
    tracker.total_tuples_processed = 7
    tracker.window_ring.extend([(1,)] * 50)
    back = pickle.loads(pickle.dumps(tracker))
    assert back.total_tuples_processed == 7 and not back.window_ring
    assert {key: (t.total_tuples, t.buffer_server_bytes, t.transport, len(t.recent))
            for key, t in back.ports.items()} == {
        ("input", "in"): (7, 70, "flight", 0), ("output", "out"): (7, 70, "flight", 0)}
    assert len(pickle.dumps(tracker)) < 600  # no ring of 50 windows in it
    empty = pickle.loads(pickle.dumps(OperatorStatsTracker()))
    assert empty.ports == {}

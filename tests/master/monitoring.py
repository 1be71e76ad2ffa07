"""A master core with one application whose figures are known, for the monitoring tests.

source -> relay1 -> sink in one container; ten 500 ms windows: the source emits 100
tuples a window, the relay passes 50 on 20 ms after the source ended the window and
reports a user metric, the sink ends each window 30 ms after the relay. So: totals 1,000
/ 500, 200 tuples/s out of the source, latencies 20 and 30 ms, 50 ms along the path.
"""

from __future__ import annotations

from tests.master.fakes import (
    ManualClock,
    chain_descriptor,
    container_heartbeat,
    operator_report,
    window,
)
from weir.master.core import MasterCore
from weir.master.launcher import RecordingLauncher
from weir.operators.windows import make_window_id

__all__ = ["WINDOWS", "monitored_core", "submit_known_app"]

WINDOWS = 10


def monitored_core() -> tuple[MasterCore, str]:
    """A core (not started: no loop thread) and the id of its application."""
    clock = ManualClock()
    core = MasterCore(RecordingLauncher("127.0.0.1:1"), clock=clock)
    return core, submit_known_app(core, clock)


def submit_known_app(core: MasterCore, clock: ManualClock) -> str:
    """Submits the application and reports its ten windows; returns its id."""
    app_id = core.submit(chain_descriptor(3, CONTAINERS=1,
                                          THROUGHPUT_CALCULATION_INTERVAL_MILLIS=1000), {})
    cid = f"{app_id}-c0"
    core.heartbeat(container_heartbeat(cid, port=7000))
    start = core.application_info(app_id).start_window_millis
    clock.advance(WINDOWS * 500 + 1000)
    source, relay, sink = [], [], []
    for i in range(WINDOWS):
        wid, end = make_window_id(start // 1000, i), start + 500 * (i + 1)
        source.append(window(wid, tuples_out=100, end_ms=end, in_port=None))
        relayed = window(wid, tuples_in=100, tuples_out=50, end_ms=end + 20)
        relayed.metrics["dropped"] = 50.0 * (i + 1)
        relay.append(relayed)
        sink.append(window(wid, tuples_in=50, end_ms=end + 50, out_port=None))
    core.heartbeat(container_heartbeat(cid, port=7000, operators=[
        operator_report(1, windows=source), operator_report(2, windows=relay),
        operator_report(3, windows=sink)]))
    return app_id

"""Whether a report's window ids can be right, before any of it counts: statistics ignore
windows at or before the newest one recorded, so one bogus id far ahead would freeze them
for good, and a bogus checkpoint would move the committed window."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from weir.master.application import Application
from weir.master.physical_plan import PTOperator
from weir.master.report_filter import ReportedWindow
from weir.master.stats import OperatorStatsTracker
from weir.operators.windows import format_window_id, window_base_seconds, window_counter

__all__ = ["MAX_WINDOW_LEAD_MS", "WindowProblem", "check_window_ids"]

MAX_WINDOW_LEAD_MS = 600_000
"""How far (in time) a reported window may be ahead of the master's clock.

A window's counter is the number of streaming windows since the application's start,
taken from the container's clock; sources never number windows faster than time passes.
So a counter beyond ``(now - start) / window size`` can only come from a clock that is
ahead of the master's, or from a bogus report. Ten minutes tolerates any realistic skew
(NTP keeps hosts within a second; a resumed VM may lag until NTP steps it), while a
report beyond it is rejected rather than allowed to run the operator's statistics ahead
of every real window for longer than that.
"""


@dataclasses.dataclass(frozen=True)
class WindowProblem:
    """Why a report's window ids were rejected: ``kind`` (the rate-limit key), the id, why."""

    kind: str
    window_id: int
    reason: str


def check_window_ids(app: Application, op: PTOperator, tracker: OperatorStatsTracker,
                     windows: Sequence[ReportedWindow], now_ms: int) -> WindowProblem | None:
    """The first impossible window id of a report's ``windows`` (and their checkpoints), or
    None.

    Statistics ignore windows at or before the newest one recorded, so one bogus id far
    ahead (say 2^63-1) would freeze them for good, and a bogus checkpoint would move the
    committed window. A report is believed only if every id:

    - has the application's base seconds (high half): window ids never change epoch
      (a restored operator goes on with its checkpoint's ids, no source resets them);
    - does not go backwards for the operator's current instance: not before the newest
      window it reported (repeating that one is fine: the final checkpoint is sent with
      a repeat of the last window), not at or before the checkpoint it was deployed from
      (a redeployed instance starts after it; ``restarted`` forgets the old instance's
      windows), and in order within the report;
    - is not ahead of the master's clock by more than ``MAX_WINDOW_LEAD_MS``;
    - for a checkpoint: is after the deploy checkpoint and not after its own window.
    """
    base = app.start_window_millis // 1000
    elapsed_ms = now_ms - app.start_window_millis
    window_ms = int(app.attribute("STREAMING_WINDOW_SIZE_MILLIS"))
    previous = tracker.last_window_id
    for window in windows:
        window_id = window.window_id
        problem = _impossible(window_id, base, elapsed_ms, window_ms)
        if problem is not None:
            return problem
        if window_id < previous:
            return WindowProblem("backwards", window_id,
                                 f"it goes back from window {format_window_id(previous)}")
        if window_id <= op.deploy_window_id:
            return WindowProblem("backwards", window_id,
                                 "it is not after the checkpoint the operator was deployed "
                                 f"from ({format_window_id(op.deploy_window_id)})")
        previous = window_id
        if window.checkpoint is not None:
            checkpoint = window.checkpoint.window_id
            problem = _impossible(checkpoint, base, elapsed_ms, window_ms)
            if problem is not None:
                return dataclasses.replace(problem, reason=f"checkpoint: {problem.reason}")
            if not op.deploy_window_id < checkpoint <= window_id:
                return WindowProblem(
                    "checkpoint", checkpoint,
                    f"checkpoint outside its instance's windows "
                    f"({format_window_id(op.deploy_window_id)}, {format_window_id(window_id)}]")
    return None


def _impossible(window_id: int, base: int, elapsed_ms: int,
                window_ms: int) -> WindowProblem | None:
    """The id has another epoch than the application, or lies too far in the future."""
    if window_id < 0 or window_base_seconds(window_id) != base:
        return WindowProblem("epoch", window_id, f"its base is not the application's ({base})")
    lead_ms = window_counter(window_id) * window_ms - elapsed_ms
    if lead_ms > MAX_WINDOW_LEAD_MS:
        return WindowProblem("ahead", window_id,
                             f"it is {lead_ms // 1000} s ahead of the master's clock (at most "
                             f"{MAX_WINDOW_LEAD_MS // 1000} s allowed)")
    return None

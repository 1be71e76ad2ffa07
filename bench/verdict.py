"""Which rows of a ``make bench`` report failed, and why: a run that erred, timed out or
got a wrong result is printed as FAILED and makes ``make bench`` exit non-zero (a figure
from a failed run is no figure)."""

from __future__ import annotations

from typing import Any

from bench.recovery_rows import ROWS as RECOVERY_ROWS

__all__ = ["failed_rows"]


def _why(result: dict[str, Any]) -> str | None:
    """Why one result failed, or None: an error, a wrong result, a missing figure."""
    if result.get("error"):
        return str(result["error"])
    if result.get("correct") is False:
        return str(result.get("detail") or "wrong result")
    return None


def _recovery_why(result: dict[str, Any]) -> str | None:
    why = _why(result)
    if why is not None:
        return why
    if result.get("final_state") != "FINISHED":
        return f"the application ended {result.get('final_state', 'without a state')}"
    if result.get("every_event_counted_at_least_once") is not True:
        return "not every event was counted"
    if not isinstance(result.get("seconds_until_windows_move_again"), int | float):
        return "no time until windows moved again"
    return None


def failed_rows(report: dict[str, Any]) -> list[str]:
    """``"<row>: <why>"`` for every failed row of ``report`` (empty: all passed).

    >>> failed_rows({"results": [{"system": "weir", "correct": True}],
    ...              "recovery": {"error": "no spare became ready"}})
    ['recovery: no spare became ready']
    """
    failed: list[tuple[str, str | None]] = []
    failed += [(str(r.get("system")), _why(r)) for r in report.get("results", [])]
    failed += [(f"event time {r.get('system')}", _why(r)) for r in report.get("event_time", [])]
    failed += [(f"latency {r.get('job')} {r.get('system')}", _why(r))
               for r in report.get("latency", [])]
    failed += [(f"scaling {r.get('partitions')} partitions", _why(r))
               for r in report.get("scaling", {}).get("runs", [])]
    for key in ("running_count", "startup", "master_restart", "control_plane",
                "control_plane_application_masters"):
        if key in report:
            failed.append((key.replace("_", " "), _why(report[key])))
    for key, _ in RECOVERY_ROWS:
        if key in report:
            runs = report[key].get("runs") or [report[key]]
            failed += [(key.replace("_", " "), _recovery_why(r)) for r in runs]
    return [f"{row}: {why}" for row, why in failed if why is not None]

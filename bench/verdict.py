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
    if result.get("failure_count") == 0 or (
            isinstance(result.get("seconds_until_windows_move_again"), int | float)
            and result["seconds_until_windows_move_again"] <= 0):
        return ("the kill missed: no operator failed and nothing was recovered (failure "
                f"count {result.get('failure_count')}, windows moving again after "
                f"{result.get('seconds_until_windows_move_again')} s): it measured nothing")
    if result.get("final_state") != "FINISHED":
        return f"the application ended {result.get('final_state', 'without a state')}"
    if result.get("every_event_counted_at_least_once") is not True:
        return "not every event was counted"
    if not isinstance(result.get("seconds_until_windows_move_again"), int | float):
        return "no time until windows moved again"
    return None


def _control_plane_why(result: dict[str, Any]) -> str | None:
    """The control plane's targets (p99 < 100 ms, the target rate, no false loss), each
    missed one named with its figure."""
    if result.get("meets_targets", True):
        return None
    missed = []
    if float(result.get("rtt_p99_ms", 0)) >= 100.0:
        missed.append(f"round trip p99 {result.get('rtt_p99_ms')} ms (target < 100 ms)")
    if float(result.get("heartbeats_per_s", 0)) < 0.98 * float(
            result.get("target_heartbeats_per_s", 0)):
        missed.append(f"{result.get('heartbeats_per_s')} heartbeats/s of "
                      f"{result.get('target_heartbeats_per_s')} targeted")
    losses = int(result.get("false_losses", 0)) + int(result.get("operators_not_active", 0))
    if losses or result.get("rpc_errors_measured"):
        missed.append(f"{losses} false losses, {result.get('rpc_errors_measured', 0)} "
                      "call errors")
    return "targets NOT met: " + "; ".join(missed or ["see its figures"])


def _measured_nothing(result: dict[str, Any]) -> str | None:
    """A run that moved no event measured nothing, whatever its clock says."""
    if result.get("error") or result.get("correct") is False or "events" not in result:
        return None  # already failed, or not a run of events
    if not result.get("events") or not result.get("events_per_second"):
        return (f"it measured nothing: {result.get('events')} events at "
                f"{result.get('events_per_second')} events/s")
    return None


def _inverted_ceilings(results: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    """A ceiling (one plain consumer reading the same topic) below the system it bounds
    was no ceiling in that run: the row that relies on it is not a figure."""
    rates = {str(r.get("system")): float(r.get("events_per_second") or 0) for r in results
             if not r.get("error")}
    ceiling, weir = rates.get("kafka-consumer-ceiling"), rates.get("weir-kafka")
    if ceiling is None or weir is None or ceiling >= weir:
        return []
    return [("kafka-consumer-ceiling", f"the ceiling ({ceiling:,.0f} events/s) is below the "
             f"system it bounds (weir-kafka, {weir:,.0f} events/s): no ceiling in this run")]


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
    for key in ("running_count", "startup", "master_restart"):
        if key in report:
            failed.append((key.replace("_", " "), _why(report[key])))
    for key in ("control_plane", "control_plane_application_masters"):
        if key in report:
            failed.append((key.replace("_", " "), _why(report[key])
                           or _control_plane_why(report[key])))
    failed += [(str(r.get("system")), why) for r in report.get("results", [])
               if (why := _measured_nothing(r)) is not None]
    failed += _inverted_ceilings(report.get("results", []))
    for key, _ in RECOVERY_ROWS:
        if key in report:
            runs = report[key].get("runs") or [report[key]]
            failed += [(key.replace("_", " "), _recovery_why(r)) for r in runs]
    return [f"{row}: {why}" for row, why in failed if why is not None]

"""The recovery rows of ``make bench``: a container killed (with a warm spare, without,
and on Ray its whole node), repeated runs summed up as one row each, and printed."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["print_recovery_rows", "summarize_recovery"]

ROWS = (("recovery", "with a warm spare"), ("recovery_without_spare", "without a spare"),
        ("recovery_on_ray", "on Ray, a node lost, with a warm spare"))


def summarize_recovery(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Repeated recoveries as one row: the median run's figures, the median seconds until
    windows moved again with their min and max, and every run (a failed one fails the row,
    ``bench.verdict``)."""
    seconds = [float(r["seconds_until_windows_move_again"]) for r in runs
               if isinstance(r.get("seconds_until_windows_move_again"), int | float)]
    if not seconds:
        return {**runs[0], "repeats": len(runs), "runs": runs}
    median = statistics.median(seconds)
    median_run = min((r for r in runs if "seconds_until_windows_move_again" in r),
                     key=lambda r: abs(float(r["seconds_until_windows_move_again"]) - median))
    spread = {"seconds_until_windows_move_again": [min(seconds), max(seconds)]}
    row = {**median_run, "repeats": len(runs), "seconds_until_windows_move_again": median,
           "spread": spread, "runs": runs}
    seen = [float(r["seconds_until_the_master_saw_it"]) for r in runs
            if isinstance(r.get("seconds_until_the_master_saw_it"), int | float)]
    if seen:  # the same moment as the master heard of it, a heartbeat later
        row["seconds_until_the_master_saw_it"] = statistics.median(seen)
        spread["seconds_until_the_master_saw_it"] = [min(seen), max(seen)]
    return row


def print_recovery_rows(report: dict[str, Any]) -> None:
    """One line per recovery row of ``report``: the median run, the spread, the checks."""
    for key, label in ROWS:
        if key not in report:
            continue
        r = report[key]
        low, high = r.get("spread", {}).get("seconds_until_windows_move_again", ["?", "?"])
        seen_low, seen_high = r.get("spread", {}).get("seconds_until_the_master_saw_it",
                                                      ["?", "?"])
        print(f"recovery {label} ({r.get('repeats', 1)} runs, median): {r.get('killed', '?')} "
              f"killed, its operators moved to {r.get('moved_to', '?')}; windows moving again "
              f"after {r.get('seconds_until_windows_move_again', '?')} s (min-max "
              f"{low}-{high} s; the master saw it after "
              f"{r.get('seconds_until_the_master_saw_it', '?')} s, {seen_low}-{seen_high} s), "
              f"{r.get('windows_replayed', '?')} windows replayed, final state "
              f"{r.get('final_state', '?')}, every event counted at least once: "
              f"{r.get('every_event_counted_at_least_once', '?')}")

"""The recovery row times windows moving again by the sink's own END_WINDOW stamp.

When the master hears of that window depends on the container's next heartbeat (every
500 ms in the bench job) and on the bench's polling, which are no part of the recovery;
that later moment is kept beside it.
"""

from __future__ import annotations

from types import SimpleNamespace

from bench.__main__ import summarize_recovery
from bench.weir_job import window_moved_ms


def _window(window_id: int, end_ms: int) -> SimpleNamespace:
    return SimpleNamespace(window_id=window_id, end_window_ms=end_ms)


def test_the_first_window_after_the_one_before_the_kill_gives_the_time() -> None:
    # the replayed windows (up to 41) do not count; 42 moved first, reported with 43
    recent = [_window(40, 1_000), _window(41, 1_500), _window(43, 2_600), _window(42, 2_100)]
    assert window_moved_ms(recent, 41) == 2_100


def test_no_window_after_it_yet_or_no_stamp_gives_none() -> None:
    assert window_moved_ms([_window(41, 1_500)], 41) is None
    assert window_moved_ms([_window(42, 0)], 41) is None
    assert window_moved_ms([], 41) is None


def test_the_row_keeps_when_the_master_saw_it_with_its_spread() -> None:
    def run(moved: float, seen: float) -> dict[str, object]:
        return {"seconds_until_windows_move_again": moved,
                "seconds_until_the_master_saw_it": seen, "final_state": "FINISHED",
                "every_event_counted_at_least_once": True}

    row = summarize_recovery([run(1.2, 1.6), run(0.8, 1.1), run(3.0, 3.2)])
    assert row["seconds_until_windows_move_again"] == 1.2
    assert row["seconds_until_the_master_saw_it"] == 1.6
    assert row["spread"] == {"seconds_until_windows_move_again": [0.8, 3.0],
                             "seconds_until_the_master_saw_it": [1.1, 3.2]}

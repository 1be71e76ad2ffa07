"""The Weir rows' clock starts when the sources' first window began, as the container
reported it: a source that reads all its input in less than a window ends that window
early, and counting a whole window would add time nobody spent."""

from __future__ import annotations

from bench.weir_job import _Windows, first_in_ms


def _windows(**sources: list[tuple[int, int, int]]) -> _Windows:
    windows = _Windows(tuple(sources))
    for name, rows in sources.items():
        for window_id, begin, end in rows:
            windows.begin_ms[name][window_id] = begin
            windows.end_ms[name][window_id] = end
    return windows


def test_the_first_window_counts_from_when_it_began() -> None:
    windows = _windows(events=[(7, 1_000, 1_180), (8, 1_180, 1_680)])
    assert first_in_ms(windows, ("events",), 500) == 1_000  # not 1_180 - 500


def test_the_earliest_source_starts_the_clock() -> None:
    windows = _windows(bids=[(7, 1_020, 1_500)], people=[(7, 1_000, 1_500)])
    assert first_in_ms(windows, ("bids", "people"), 500) == 1_000


def test_without_a_reported_beginning_a_whole_window_is_counted() -> None:
    windows = _windows(events=[(7, 0, 1_500), (8, 0, 2_000)])  # an older container: 0
    assert first_in_ms(windows, ("events",), 500) == 1_000
    assert first_in_ms(_windows(events=[]), ("events",), 500) == 0

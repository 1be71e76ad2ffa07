"""Watermarks as the runtime keeps them: idle inputs set aside, idleness counted in windows
(so a replay decides alike), never backwards."""

from __future__ import annotations

import pickle

import pyarrow as pa

from weir.operators.watermarks import END_OF_TIME, IDLE, NO_WATERMARK, Watermarks, format_watermark


def window(marks: Watermarks, *times: int) -> int:
    """One streaming window of a source emitting rows with these event times."""
    if times:
        marks.saw_event_times(pa.array(times, pa.int64()))
    marks.advance()
    return marks.outgoing()


def test_a_quiet_source_goes_idle_after_its_windows_and_comes_back_with_rows():
    source = Watermarks([], event_time_column="t", delay_ms=100, idle_windows=2)
    assert window(source, 1_000) == 900
    assert window(source) == 900  # one quiet window: not idle yet
    assert window(source) == IDLE
    assert window(source) == IDLE
    assert source.current == 900  # its own watermark stays where it was
    assert window(source, 1_500) == 1_400  # rows again: it counts again


def test_idleness_is_part_of_the_checkpointed_state():
    source = Watermarks([], event_time_column="t", idle_windows=3)
    window(source, 1_000)
    window(source)
    restored = pickle.loads(pickle.dumps(source))
    assert (window(restored), window(restored)) == (1_000, IDLE)  # the third quiet window


def test_a_source_without_idle_timeout_or_event_time_never_goes_idle():
    never = Watermarks([], event_time_column="t")
    plain = Watermarks([], idle_windows=1)
    for _ in range(5):
        assert window(never) == NO_WATERMARK
        assert window(plain) == NO_WATERMARK


def test_idle_inputs_hold_nothing_back_and_all_idle_is_passed_on():
    marks = Watermarks(["a", "b"])
    marks.saw_input("a", 1_000)
    marks.saw_input("b", 400)
    assert marks.advance() == 400 and marks.outgoing() == 400
    marks.saw_input("b", IDLE)  # b's partition went quiet: a alone decides
    marks.saw_input("a", 2_000)
    assert marks.advance() == 2_000
    marks.saw_input("a", IDLE)
    assert marks.advance() == 2_000 and marks.outgoing() == IDLE  # downstream sets it aside
    marks.saw_input("b", 700)  # b is back, behind: the watermark does not go back
    assert marks.advance() == 2_000 and marks.outgoing() == 2_000
    marks.saw_input("b", 2_500)
    marks.saw_input("a", 3_000)
    assert marks.advance() == 2_500


def test_the_end_is_never_idle():
    source = Watermarks([], event_time_column="t", idle_windows=1)
    source.ended()
    assert window(source) == END_OF_TIME


def test_format_says_idle():
    assert format_watermark(IDLE) == "idle"
    assert format_watermark(END_OF_TIME) == "end" and format_watermark(NO_WATERMARK) == "-"


def split_window(marks: Watermarks, rows: list[tuple[str, int]]) -> int:
    """One window of a split source: (split, event time) rows."""
    if rows:
        marks.saw_event_times(pa.array([t for _, t in rows], pa.int64()),
                              pa.array([s for s, _ in rows]))
    return marks.advance()


def test_a_split_source_holds_to_its_slowest_split_not_its_fastest():
    marks = Watermarks([], event_time_column="t", delay_ms=100, split=True)
    assert split_window(marks, [("p0", 5_000), ("p1", 1_000), ("p0", 6_000)]) == 900
    assert split_window(marks, [("p0", 9_000)]) == 900  # p1 lags: nothing of it is late
    assert split_window(marks, [("p1", 2_000), ("p2", 1_500)]) == 1_400  # p2 appears
    assert marks.highest_event_ms == 9_000
    plain = Watermarks([], event_time_column="t", delay_ms=100)
    assert split_window(plain, [("p0", 5_000), ("p1", 1_000), ("p0", 6_000)]) == 5_900


def test_an_idle_split_stops_holding_it_back_and_the_state_survives_a_checkpoint():
    marks = Watermarks([], event_time_column="t", split=True, idle_windows=2)
    assert split_window(marks, [("p0", 1_000), ("p1", 500)]) == 500
    assert split_window(marks, [("p0", 2_000)]) == 500  # p1 quiet one window
    marks = pickle.loads(pickle.dumps(marks))
    assert split_window(marks, [("p0", 3_000)]) == 3_000  # p1 quiet two: idle
    assert split_window(marks, [("p1", 3_500), ("p0", 4_000)]) == 3_500  # p1 is back
    assert split_window(marks, []) == 3_500 and marks.outgoing() == 3_500


def test_a_split_known_but_silent_holds_it_back_until_it_delivers_or_is_idle():
    marks = Watermarks([], event_time_column="t", split=True, idle_windows=3)
    marks.expect_splits(["orders/0", "orders/1"])
    assert split_window(marks, [("orders/0", 5_000)]) == NO_WATERMARK  # orders/1: nothing yet
    assert split_window(marks, [("orders/0", 6_000)]) == NO_WATERMARK
    assert split_window(marks, [("orders/1", 1_000)]) == 1_000
    marks.expect_splits(["orders/0", "orders/1"])  # asked again: what it has is kept
    assert split_window(marks, [("orders/0", 7_000)]) == 1_000

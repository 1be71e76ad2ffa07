"""Watermarks as the runtime keeps them: idle inputs set aside, idleness counted in windows
(so a replay decides alike), never backwards."""

from __future__ import annotations

import pickle

import pyarrow as pa

from operators.watermarks import END_OF_TIME, IDLE, NO_WATERMARK, Watermarks, format_watermark


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

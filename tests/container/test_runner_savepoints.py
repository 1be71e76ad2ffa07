"""What a runner owes a savepoint: its part once, between windows, when it is due."""

from __future__ import annotations

from weir.container.runner_savepoints import SavepointDuty


def duty(window: int) -> tuple[SavepointDuty, list[tuple[int, int, str]]]:
    written: list[tuple[int, int, str]] = []
    owed = SavepointDuty()
    owed.ask("/sp", window, lambda op, w, path: written.append((op, w, path)))
    return owed, written


def test_a_running_savepoint_is_written_once_past_its_window_with_the_checkpoint_there():
    owed, written = duty(40)
    owed.while_running(7, 39, lambda w: True)  # not there yet
    owed.while_running(7, 41, lambda w: False)  # a redeployed instance: not saved again yet
    assert written == []
    owed.while_running(7, 42, lambda w: w == 40)
    owed.while_running(7, 43, lambda w: True)
    owed.at_stream_end(7, 44)  # not a stop: nothing at the end
    assert written == [(7, 40, "/sp")] and owed.written == "/sp"


def test_a_stop_is_written_at_the_streams_end_from_its_last_checkpoint():
    owed, written = duty(-1)
    owed.while_running(7, 50, lambda w: True)
    owed.at_stream_end(7, -1)  # no checkpoint: nothing to write
    owed.at_stream_end(7, 52)
    owed.at_stream_end(7, 52)
    assert written == [(7, 52, "/sp")]


def test_a_new_savepoint_is_owed_after_an_old_one():
    owed, written = duty(40)
    owed.while_running(7, 41, lambda w: True)
    owed.ask("/sp2", 60, lambda op, w, path: written.append((op, w, path)))
    owed.while_running(7, 61, lambda w: True)
    assert written == [(7, 40, "/sp"), (7, 60, "/sp2")]

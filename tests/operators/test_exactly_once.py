"""The replayable directory source and the exactly-once file sink, driven through their hooks,
restored from their checkpoints as a recovered container would restore them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from tests.operators.test_library import Emitted, run_window, wid
from weir.operators.library import DirectorySource, FileSink, TextFileSource
from weir.operators.operator import Operator, OperatorContext
from weir.runtime.operator_state import capture, restore
from weir.storage import CorruptLog


def context(state: Path, recovered: int = -1, **attributes) -> OperatorContext:
    return OperatorContext(name="op", operator_id=3, container_id="c0",
                           attributes={"STREAMING_WINDOW_SIZE_MILLIS": 100, **attributes},
                           state_dir=str(state), recovered_window=recovered)


def started(op: Operator, state: Path, recovered: int = -1, **attributes) -> Emitted:
    emitted = Emitted()
    op.connect_outputs(emitted)
    op.setup(context(state, recovered, **attributes))
    return emitted


def source_window(src: DirectorySource, emitted: Emitted, counter: int, calls: int = 1) -> bool:
    emitted.window = wid(counter)
    src.begin_window(emitted.window)
    more = True
    for _ in range(calls):
        more = src.emit_tuples()
        if not more:
            break
    src.end_window()
    return more


def lines_by_window(emitted: Emitted) -> dict[int, list[str]]:
    return {w: [r["line"] for b in bs for r in b.to_pylist()] for w, bs in emitted.batches.items()
            if any(b.num_rows for b in bs)}


@pytest.fixture
def inbox(tmp_path: Path) -> Path:
    folder = tmp_path / "inbox"
    folder.mkdir()
    for i in range(3):
        (folder / f"part-{i}.txt").write_text("".join(f"f{i} line {j}\n" for j in range(5)))
    return folder


def test_directory_source_replays_identical_windows_after_a_restore(tmp_path, inbox):
    # several reads a file
    src = DirectorySource(inbox, pattern="*.txt", delete_consumed=True, read_bytes=40)
    emitted = started(src, tmp_path / "state")
    source_window(src, emitted, 1, calls=2)
    checkpoint = capture(src)  # the state as of window 1
    for counter in range(2, 6):
        source_window(src, emitted, counter, calls=3)
    first_run = lines_by_window(emitted)
    assert sorted(line for ls in first_run.values() for line in ls) == sorted(
        f"f{i} line {j}" for i in range(3) for j in range(5))

    # the container dies; a new one restores window 1's checkpoint and replays the windows
    again = restore(DirectorySource(inbox), checkpoint)
    replayed = started(again, tmp_path / "state", recovered=wid(1))
    for counter in range(2, 6):
        source_window(again, replayed, counter, calls=7)  # other timing, same windows
    assert lines_by_window(replayed) == {w: ls for w, ls in first_run.items() if w > wid(1)}
    assert not source_window(again, replayed, 6)  # then the bounded source ends


def test_an_at_most_once_source_never_emits_again_what_it_emitted_before_a_restart(
        tmp_path, inbox):
    src = DirectorySource(inbox, pattern="*.txt", read_bytes=40)
    emitted = started(src, tmp_path / "state", PROCESSING_MODE="AT_MOST_ONCE")
    source_window(src, emitted, 1, calls=2)
    checkpoint = capture(src)  # the state as of window 1
    for counter in range(2, 4):
        source_window(src, emitted, counter, calls=3)
    before = [line for ls in lines_by_window(emitted).values() for line in ls]

    # restored from window 1, it goes on at a later window (AT_MOST_ONCE skips ahead)
    again = restore(DirectorySource(inbox), checkpoint)
    after = started(again, tmp_path / "state", recovered=wid(1), PROCESSING_MODE="AT_MOST_ONCE")
    assert again.first_window() is None  # nothing to replay
    while source_window(again, after, 9, calls=50):
        pass
    rest = [line for ls in lines_by_window(after).values() for line in ls]
    assert not set(before) & set(rest), "a line was emitted twice"
    assert sorted(before + rest) == sorted(f"f{i} line {j}" for i in range(3) for j in range(5))


def test_directory_source_frees_files_only_when_committed(tmp_path, inbox):
    src = DirectorySource(inbox, delete_consumed=True)
    emitted = started(src, tmp_path / "state")
    counter = 0
    while source_window(src, emitted, counter := counter + 1, calls=4):
        pass
    assert sorted(os.listdir(inbox)) == ["part-0.txt", "part-1.txt", "part-2.txt"]
    src.committed(wid(1))
    assert "part-0.txt" not in os.listdir(inbox)  # read to the end in window 1
    src.committed(wid(counter))
    assert os.listdir(inbox) == []


def test_directory_source_reads_files_that_appear_later_and_moves_consumed_ones(tmp_path, inbox):
    done = tmp_path / "done"
    src = DirectorySource(inbox, watch=True, move_consumed_to=done)
    emitted = started(src, tmp_path / "state")
    for counter in range(1, 5):
        assert source_window(src, emitted, counter, calls=10)
    (inbox / ".late.txt.tmp").write_text("late line\n")
    os.replace(inbox / ".late.txt.tmp", inbox / "a-late.txt")  # sorts first, still new input
    src._next_scan = 0.0
    for counter in range(5, 8):
        source_window(src, emitted, counter, calls=10)
    assert lines_by_window(emitted)[wid(5)] == ["late line"]
    src.committed(wid(7))
    assert sorted(os.listdir(done)) == ["a-late.txt", "part-0.txt", "part-1.txt", "part-2.txt"]


def test_directory_source_reports_a_corrupt_window_log(tmp_path, inbox):
    src = DirectorySource(inbox)
    emitted = started(src, tmp_path / "state")
    for counter in range(1, 4):
        source_window(src, emitted, counter)
    log_dir = tmp_path / "state" / "window-log"
    segment = log_dir / sorted(os.listdir(log_dir))[0]
    data = bytearray(segment.read_bytes())
    data[20] ^= 0xFF
    segment.write_bytes(bytes(data))
    with pytest.raises(CorruptLog, match=str(segment)):
        started(DirectorySource(inbox), tmp_path / "state", recovered=wid(1))


# -- the exactly-once file sink ----------------------------------------------------------
ROWS = [pa.record_batch({"word": ["a", "b"], "count": [1, 2]}),
        pa.record_batch({"word": ["c"], "count": [3]})]


def published(out: Path) -> dict[str, list[dict]]:
    return {n: [json.loads(x) for x in (out / n).read_text().splitlines()]
            for n in sorted(os.listdir(out)) if not n.startswith(".")}


def test_exactly_once_file_sink_publishes_at_commit_and_skips_what_it_published(tmp_path):
    out, state = tmp_path / "out", tmp_path / "state"
    sink = FileSink(out, exactly_once=True)
    started(sink, state)
    for counter in (1, 2, 3):
        run_window(sink, Emitted(), wid(counter), [ROWS[counter % 2]])
    checkpoint = capture(sink)  # as of window 3
    run_window(sink, Emitted(), wid(4), [ROWS[0]])
    assert published(out) == {}  # nothing is visible before its window is committed
    sink.committed(wid(2))
    assert list(published(out)) == [sink.file_name(wid(1)), sink.file_name(wid(2))]

    # the container dies before window 3 is committed; the sink restarts from window 3
    again = restore(FileSink(out, exactly_once=True), checkpoint)
    started(again, state, recovered=wid(3))
    assert sorted(again._staged) == [wid(3)]  # window 4's staging went: it is replayed
    run_window(again, Emitted(), wid(2), [ROWS[0]])  # published already: skipped
    run_window(again, Emitted(), wid(4), [ROWS[0]])
    again.committed(wid(4))
    again.teardown()
    assert published(out) == {
        sink.file_name(wid(1)): ROWS[1].to_pylist(), sink.file_name(wid(2)): ROWS[0].to_pylist(),
        sink.file_name(wid(3)): ROWS[1].to_pylist(), sink.file_name(wid(4)): ROWS[0].to_pylist()}
    assert os.listdir(out / ".staging") == []


def test_exactly_once_file_sink_publishes_everything_when_the_stream_ends(tmp_path):
    out = tmp_path / "out"
    sink = FileSink(out, format="parquet", exactly_once=True)
    started(sink, tmp_path / "state")
    run_window(sink, Emitted(), wid(1), ROWS)
    run_window(sink, Emitted(), wid(2), [])
    sink.teardown()
    assert sorted(os.listdir(out)) == [".staging", sink.file_name(wid(1))]


def test_exactly_once_file_sink_needs_a_state_folder(tmp_path):
    sink = FileSink(tmp_path / "out", exactly_once=True)
    with pytest.raises(RuntimeError, match="needs a local state folder"):
        sink.setup(OperatorContext(name="files", operator_id=1, container_id="c0",
                                   attributes={}))


def test_directory_source_spreads_input_over_windows_with_bytes_per_window(tmp_path, inbox):
    src = DirectorySource(inbox, bytes_per_window=30)
    emitted = started(src, tmp_path / "state")
    counter = 0
    while source_window(src, emitted, counter := counter + 1, calls=20):
        pass
    windows = lines_by_window(emitted)
    assert all(1 <= len(lines) <= 3 for lines in windows.values())  # 12-byte lines, 30 bytes
    assert sum(len(lines) for lines in windows.values()) == 15


def test_text_file_source_replays_identical_windows_after_a_restore(tmp_path):
    book = tmp_path / "book.txt"
    book.write_text("".join(f"line {i}\n" for i in range(500)))
    src = TextFileSource(book, batch_lines=7)
    emitted = started(src, tmp_path / "state")
    source_window(src, emitted, 1, calls=3)
    checkpoint = capture(src)
    for counter in range(2, 6):
        source_window(src, emitted, counter, calls=1 + counter % 3)  # uneven windows
    first_run = lines_by_window(emitted)

    again = restore(TextFileSource(book), checkpoint)
    replayed = started(again, tmp_path / "state", recovered=wid(1))
    for counter in range(2, 6):
        source_window(again, replayed, counter, calls=9)
    assert lines_by_window(replayed) == {w: ls for w, ls in first_run.items() if w > wid(1)}
    source_window(again, replayed, 6, calls=200)  # then it reads on from where it was
    assert sum(len(ls) for w, ls in lines_by_window(replayed).items()) + len(
        first_run[wid(1)]) == 500


def test_a_source_lost_before_its_first_checkpoint_replays_from_its_first_logged_window(
        tmp_path, inbox):
    src = DirectorySource(inbox, bytes_per_window=50)
    emitted = started(src, tmp_path / "state")
    assert src.first_window() is None  # nothing logged: start at the current window
    for counter in range(7, 10):
        source_window(src, emitted, counter)
    again = DirectorySource(inbox, bytes_per_window=50)  # no checkpoint: the initial state
    replayed = started(again, tmp_path / "state")
    assert again.first_window() == wid(7)
    for counter in range(7, 10):
        source_window(again, replayed, counter)
    assert lines_by_window(replayed) == lines_by_window(emitted)

"""Record logs, window logs and commit-step stores: durable, checked, and finished after a crash."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest

from weir.storage import (
    AdvanceWatermark,
    CommitError,
    CommitStepStore,
    CorruptLog,
    PublishFile,
    RecordLog,
    WindowLog,
)


def write_log(folder, payloads, segment_bytes=1 << 20) -> RecordLog:
    log = RecordLog(str(folder), segment_bytes)
    for p in payloads:
        log.append(p)
    log.sync()
    return log


def segments(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith(".log"))


# -- record log -----------------------------------------------------------------------
def test_records_survive_reopening_and_continue_numbering(tmp_path):
    write_log(tmp_path, [b"one", b"", b"three"]).close()
    log = RecordLog(str(tmp_path))
    assert list(log.records()) == [(0, b"one"), (1, b""), (2, b"three")]
    assert log.append(b"four") == 3
    assert [p for _, p in log.records(from_seq=2)] == [b"three", b"four"]


def test_segments_roll_and_old_ones_are_deleted(tmp_path):
    log = write_log(tmp_path, [bytes(100)] * 10, segment_bytes=200)  # 2 records a segment
    assert len(segments(tmp_path)) == 5
    assert log.delete_before(4) == 2  # segments holding records 0-1 and 2-3
    assert log.first_seq == 4
    assert [s for s, _ in RecordLog(str(tmp_path), 200).records()] == list(range(4, 10))


def crashed(log: RecordLog) -> None:
    """What a crash leaves: the appended records are in the file, unsynced, not closed."""
    assert log._file is not None
    log._file.flush()


def test_a_torn_last_record_is_cut_off_with_a_warning(tmp_path, caplog):
    log = write_log(tmp_path, [b"kept"])
    log.append(b"torn away")
    crashed(log)
    path = tmp_path / segments(tmp_path)[-1]
    path.write_bytes(path.read_bytes()[:-5])  # the crash hit the middle of the last write
    with caplog.at_level(logging.WARNING):
        log = RecordLog(str(tmp_path))
    assert list(log.records()) == [(0, b"kept")]
    assert "torn tail" in caplog.text
    assert log.append(b"next") == 1
    log.sync()
    assert [p for _, p in RecordLog(str(tmp_path)).records()] == [b"kept", b"next"]


def test_zeros_after_the_last_record_are_a_torn_tail(tmp_path):
    write_log(tmp_path, [b"a"]).close()
    path = tmp_path / segments(tmp_path)[-1]
    path.write_bytes(path.read_bytes() + bytes(64))
    assert list(RecordLog(str(tmp_path)).records()) == [(0, b"a")]


def test_a_corrupt_record_in_the_middle_names_the_file_and_offset(tmp_path):
    write_log(tmp_path, [b"first", b"second", b"third"]).close()
    path = tmp_path / segments(tmp_path)[-1]
    data = bytearray(path.read_bytes())
    second = 8 + (8 + 5 + 4)  # magic, then the first record
    data[second + 8] ^= 0xFF  # a payload byte of the second record
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptLog) as info:
        RecordLog(str(tmp_path))
    assert info.value.path == str(path) and info.value.offset == second
    assert "payload fails its checksum" in str(info.value)


def test_a_damaged_length_is_corruption_not_a_tear(tmp_path):
    write_log(tmp_path, [b"first", b"second"]).close()
    path = tmp_path / segments(tmp_path)[-1]
    data = bytearray(path.read_bytes())
    data[8] = 0xFF  # the first record's length now points past the end of the file
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptLog, match="length fails its checksum"):
        RecordLog(str(tmp_path))


def test_a_file_that_is_not_a_log_segment_is_refused(tmp_path):
    (tmp_path / f"{0:020d}.log").write_bytes(b"something else entirely")
    with pytest.raises(CorruptLog, match="bad magic"):
        RecordLog(str(tmp_path))


# -- window log -----------------------------------------------------------------------
def test_window_log_replays_the_windows_after_a_checkpoint_and_forgets_committed(tmp_path):
    log = WindowLog(str(tmp_path), segment_bytes=64)
    for w in range(10, 20):
        log.save(w, {"end": w * 100})
    log.committed(14)
    reopened = WindowLog(str(tmp_path), segment_bytes=64)
    assert reopened.after(16) == {17: {"end": 1700}, 18: {"end": 1800}, 19: {"end": 1900}}
    assert 12 not in reopened.after(-1)
    with pytest.raises(ValueError, match="windows must increase"):
        reopened.save(19, {})


# -- commit steps ---------------------------------------------------------------------
def staged_files(tmp_path, n):
    stage, final = tmp_path / "stage", tmp_path / "final"
    stage.mkdir(exist_ok=True)
    final.mkdir(exist_ok=True)
    steps = []
    for i in range(n):
        (stage / f"{i}.txt").write_text(f"window {i}\n")
        steps.append(PublishFile(str(stage / f"{i}.txt"), str(final / f"{i}.txt")))
    return steps, final


def test_commit_publishes_and_advances_the_watermark(tmp_path):
    steps, final = staged_files(tmp_path, 3)
    store = CommitStepStore(str(tmp_path / "store"))
    store.commit([*steps, AdvanceWatermark(42)])
    assert sorted(os.listdir(final)) == ["0.txt", "1.txt", "2.txt"]
    reopened = CommitStepStore(str(tmp_path / "store"))
    assert reopened.watermark == 42 and reopened.pending is None
    assert reopened.recover() == 0


CRASH = """
    import sys
    from weir.storage import AdvanceWatermark, CommitStepStore, PublishFile
    from weir.operators.faults import CrashPoints
    root, point = sys.argv[1], sys.argv[2]
    crash = CrashPoints({"CRASH_AT": point}, root + "/markers")
    steps = [PublishFile(f"{root}/stage/{i}.txt", f"{root}/final/{i}.txt") for i in range(3)]
    CommitStepStore(root + "/store", crash.reach).commit([*steps, AdvanceWatermark(7)])
"""


@pytest.mark.parametrize("point,published,watermark", [("commit.recorded", 0, -1),
                                                       ("commit.between_steps", 1, -1),
                                                       ("commit.executed", 3, 7)])
def test_a_commit_killed_at_any_point_is_finished_once_on_restart(tmp_path, point, published,
                                                                 watermark):
    staged_files(tmp_path, 3)
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent(CRASH))
    run = subprocess.run([sys.executable, str(script), str(tmp_path), point], timeout=60,
                         cwd=os.getcwd(), capture_output=True, text=True)
    assert run.returncode == -9, run.stderr  # killed like kill -9, at the point
    assert len(os.listdir(tmp_path / "final")) == published
    store = CommitStepStore(str(tmp_path / "store"))
    assert store.pending is not None and store.watermark == watermark
    assert store.recover() == 4 - published - (watermark >= 0)
    assert sorted(os.listdir(tmp_path / "final")) == ["0.txt", "1.txt", "2.txt"]
    assert os.listdir(tmp_path / "stage") == []
    assert [(tmp_path / "final" / f"{i}.txt").read_text() for i in range(3)] == [
        f"window {i}\n" for i in range(3)]
    again = CommitStepStore(str(tmp_path / "store"))
    assert again.pending is None and again.watermark == 7
    # the marker keeps the recovered process from crashing at the same point again
    assert (tmp_path / "markers" / f"crashed-at-{point}").exists()


def test_a_staged_file_lost_by_someone_else_is_a_clear_error(tmp_path):
    steps, _ = staged_files(tmp_path, 1)
    os.remove(steps[0].staged)
    with pytest.raises(CommitError, match="neither the staged file"):
        CommitStepStore(str(tmp_path / "store")).commit(steps)


def test_the_store_compacts_and_keeps_its_watermark(tmp_path):
    store = CommitStepStore(str(tmp_path / "store"), segment_bytes=300)
    for w in range(50):
        store.commit([AdvanceWatermark(w)])
    assert len(segments(tmp_path / "store")) <= 2
    assert CommitStepStore(str(tmp_path / "store"), segment_bytes=300).watermark == 49


def test_unsynced_records_reaching_the_disk_out_of_order_are_a_tear_not_damage(tmp_path):
    """Issue 17, item 5: pages of one unsynced batch land in any order; a zeroed page
    between good ones is a torn tail (cut), never reported as corruption."""
    log = write_log(tmp_path, [b"synced-1", b"synced-2"])
    for i in range(6):
        log.append(b"batch-%d-" % i + b"x" * 3000)  # one batch over several pages
    crashed(log)
    path = tmp_path / segments(tmp_path)[-1]
    data = bytearray(path.read_bytes())
    data[4096:8192] = bytes(4096)  # the second page never reached the disk
    path.write_bytes(bytes(data))
    reopened = RecordLog(str(tmp_path))
    kept = [p for _, p in reopened.records()]
    assert kept[:2] == [b"synced-1", b"synced-2"]
    assert all(p.startswith(b"batch-") for p in kept[2:]) and len(kept) < 8
    assert reopened.append(b"after") == len(kept)  # and the log goes on from there


def test_damage_to_synced_records_is_still_corruption(tmp_path):
    """The same zeroed page after the batch was synced: a sync mark covers it."""
    log = write_log(tmp_path, [b"synced-1", b"synced-2"])
    for i in range(6):
        log.append(b"batch-%d-" % i + b"x" * 3000)
    log.sync()
    crashed(log)
    path = tmp_path / segments(tmp_path)[-1]
    data = bytearray(path.read_bytes())
    data[4096:8192] = bytes(4096)
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptLog, match="in data a sync made durable"):
        RecordLog(str(tmp_path))

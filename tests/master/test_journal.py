"""The master's journal: newest value per key, compaction, torn and corrupt records."""

from __future__ import annotations

import logging
import os

import pytest

from weir.master.journal import Journal
from weir.storage import CorruptLog


def segments(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith(".log"))


def test_the_newest_value_of_each_key_survives_reopening(tmp_path):
    journal = Journal(str(tmp_path))
    for i in range(5):
        journal.put("app-0001", f"state {i}".encode())
    journal.put("app-0002", b"other")
    journal.put("gone", b"x")
    journal.delete("gone")
    journal.close()
    assert Journal(str(tmp_path)).load() == {"app-0001": b"state 4", "app-0002": b"other"}


def test_compaction_keeps_the_state_and_drops_old_segments(tmp_path):
    journal = Journal(str(tmp_path), segment_bytes=512, compact_ratio=2, min_compact_bytes=512)
    for i in range(400):
        journal.put(f"app-{i % 3}", f"state {i}".encode() * 5)
    assert journal.compactions > 0
    assert len(segments(tmp_path)) <= 4
    assert Journal(str(tmp_path), segment_bytes=512).load() == {
        f"app-{k}": f"state {i}".encode() * 5 for k, i in ((0, 399), (1, 397), (2, 398))}


def test_a_crash_during_compaction_leaves_a_usable_state(tmp_path):
    journal = Journal(str(tmp_path))
    journal.put("a", b"1")
    journal.put("b", b"2")
    journal.put("a", b"3")
    # compaction wrote its snapshot segment, then the process died before deleting the old
    journal._log.roll()
    journal._log.append(b"\x01\x00\x00\x00\x00a3")
    journal._log.sync()
    assert Journal(str(tmp_path)).load() == {"a": b"3", "b": b"2"}


def test_a_torn_last_record_is_cut_off_and_the_rest_loads(tmp_path, caplog):
    journal = Journal(str(tmp_path))
    journal.put("app-0001", b"acknowledged")
    journal.put("app-0001", b"being written when the master died", sync=False)
    journal._log._file.flush()  # the master died before its sync: never acknowledged
    path = tmp_path / segments(tmp_path)[-1]
    path.write_bytes(path.read_bytes()[:-7])
    with caplog.at_level(logging.WARNING):
        assert Journal(str(tmp_path)).load() == {"app-0001": b"acknowledged"}
    assert "torn tail" in caplog.text


def test_a_batch_lands_whole_or_not_at_all(tmp_path):
    journal = Journal(str(tmp_path))
    journal.put("app/plan", b"plan 1")
    journal.put_many([("app/plan", b"plan 2"), ("app/op/7", b"new op"), ("app", b"app 2")])
    journal.close()
    assert Journal(str(tmp_path)).load() == {"app/plan": b"plan 2", "app/op/7": b"new op",
                                             "app": b"app 2"}
    journal = Journal(str(tmp_path))
    journal.put_many([("app/plan", b"plan 3"), ("app/op/8", b"newer op")], sync=False)
    journal._log._file.flush()
    path = tmp_path / segments(tmp_path)[-1]
    path.write_bytes(path.read_bytes()[:-5])  # the master died while writing the batch
    assert Journal(str(tmp_path)).load() == {"app/plan": b"plan 2", "app/op/7": b"new op",
                                             "app": b"app 2"}
    journal = Journal(str(tmp_path), compact_ratio=1)
    journal.put_many([("a", b"1"), ("b", b"2")])
    journal.compact()  # a snapshot writes plain records
    assert Journal(str(tmp_path)).load()["b"] == b"2"


def test_a_corrupt_record_in_the_middle_stops_with_the_file_and_offset(tmp_path):
    journal = Journal(str(tmp_path))
    for i in range(3):
        journal.put("app-0001", f"state {i}".encode())
    journal.close()
    path = tmp_path / segments(tmp_path)[-1]
    data = bytearray(path.read_bytes())
    data[8 + 8 + 3] ^= 0x40  # inside the first record's payload
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptLog) as info:
        Journal(str(tmp_path))
    assert info.value.path == str(path) and info.value.offset == 8


def test_a_compaction_torn_before_its_sync_falls_back_to_the_older_segments(tmp_path):
    """Issue 17, item 5: the snapshot's pages land in any order until its sync; one lost
    page in it is a tear, and the older segments (deleted only after the sync) hold it all."""
    journal = Journal(str(tmp_path), compact_ratio=1000)
    for i in range(40):
        journal.put(f"app-{i % 8}", b"state %d " % i + b"y" * 900)
    expected = journal.load()

    real_sync, calls = journal._log.sync, []

    def crash() -> None:
        calls.append(1)
        if len(calls) == 1:  # the roll to the snapshot's segment syncs the old one
            return real_sync()
        journal._log._file.flush()
        raise KeyboardInterrupt("the master died before the snapshot was synced")

    journal._log.sync = crash
    with pytest.raises(KeyboardInterrupt):
        journal.compact()
    snapshot = tmp_path / segments(tmp_path)[-1]
    assert len(segments(tmp_path)) == 2  # the older segment is still there
    data = bytearray(snapshot.read_bytes())
    data[4096:8192] = bytes(4096)  # a page of the snapshot never reached the disk
    snapshot.write_bytes(bytes(data))
    assert Journal(str(tmp_path)).load() == expected


def test_the_write_that_triggers_a_compaction_survives_it(tmp_path):
    """The snapshot used to be taken before the new value was applied, and the segment
    holding it deleted: the acknowledged write was gone on reopen."""
    journal = Journal(str(tmp_path), compact_ratio=2, min_compact_bytes=64)
    for i in range(60):
        journal.put(f"k{i % 3}", b"value %d" % i)
        assert Journal(str(tmp_path)).load() == journal.load(), f"after write {i}"
    assert journal.compactions > 3


def test_compaction_follows_size_not_count(tmp_path):
    """One key rewritten with large values: the log stays within the ratio of what lives."""
    journal = Journal(str(tmp_path), compact_ratio=4, min_compact_bytes=1 << 20)
    for i in range(200):
        journal.put("app-0001/plan", bytes([i % 256]) * 100_000)  # 20 MB written in all
    on_disk = sum(p.stat().st_size for p in tmp_path.glob("*.log"))
    assert journal.compactions >= 3
    assert on_disk <= 4 * 100_000 + (1 << 20) + 100_000
    assert Journal(str(tmp_path)).load() == journal.load()

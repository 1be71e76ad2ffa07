"""Fencing by generation: once a newer deployment claims an operator's fence, the older one
can write nothing more into the operator's state (logs, commit steps, staged files)."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from tests.operators.test_library import Emitted, wid
from weir.operators.library import FileSink
from weir.operators.operator import OperatorContext
from weir.storage import (
    FENCE_FILE,
    AdvanceWatermark,
    CommitStepStore,
    Fence,
    Fenced,
    PublishFile,
    RecordLog,
    WindowLog,
)
from weir.storage.fence import CHECKPOINTS_FOLDER, highest_fence


def fences(folder, *generations: int) -> list[Fence]:
    return [Fence(pafs.LocalFileSystem(), str(folder), g, f"operator x (g{g})")
            for g in generations]


def test_a_claim_fences_off_every_older_generation_and_never_goes_back(tmp_path):
    first, second, third = fences(tmp_path / "op", 1, 2, 3)
    first.claim()
    first.check()
    second.claim()
    second.check()
    with pytest.raises(Fenced, match=r"generation 1 of operator x \(g1\) is fenced off: "
                                     r"generation 2 replaced it"):
        first.check()
    with pytest.raises(Fenced):
        first.claim()  # a stale deploy cannot take the fence back
    third.claim()
    assert (tmp_path / "op" / FENCE_FILE).read_text().strip() == "3"
    assert [n for n in os.listdir(tmp_path / "op") if n != FENCE_FILE] == []  # no temp files


def test_generation_zero_is_never_fenced(tmp_path):
    unfenced, newer = fences(tmp_path, 0, 5)
    newer.claim()
    unfenced.check()
    unfenced.claim()
    assert newer.current() == 5


def test_a_fenced_log_refuses_appends_and_drops_what_it_buffered(tmp_path):
    old, new = fences(tmp_path / "fence", 1, 2)
    old.claim()
    log = RecordLog(str(tmp_path / "log"), guard=old.check)
    log.append(b"before")
    log.sync()
    log.append(b"buffered, not synced")
    new.claim()
    with pytest.raises(Fenced):
        log.append(b"after")
    with pytest.raises(Fenced):
        log.close()
    assert list(RecordLog(str(tmp_path / "log")).records()) == [(0, b"before")]


def test_a_fenced_window_log_saves_nothing(tmp_path):
    old, new = fences(tmp_path / "fence", 1, 2)
    log = WindowLog(str(tmp_path / "wl"), guard=old.check)
    log.save(1, {"n": 1})
    new.claim()
    with pytest.raises(Fenced):
        log.save(2, {"n": 2})
    assert WindowLog(str(tmp_path / "wl")).after(-1) == {1: {"n": 1}}


def test_a_fenced_commit_step_store_neither_records_nor_publishes(tmp_path):
    old, new = fences(tmp_path / "fence", 1, 2)
    staged, final = tmp_path / "staged.txt", tmp_path / "final.txt"
    staged.write_text("rows")
    store = CommitStepStore(str(tmp_path / "steps"), guard=old.check)
    new.claim()
    with pytest.raises(Fenced):
        store.commit([PublishFile(str(staged), str(final)), AdvanceWatermark(7)])
    assert staged.exists() and not final.exists()
    assert CommitStepStore(str(tmp_path / "steps")).pending is None


def test_a_fenced_file_sink_stages_nothing_and_a_successor_sweeps_leftovers(tmp_path):
    old, new = fences(tmp_path / "fence", 1, 2)
    old.claim()

    def started(fence: Fence) -> FileSink:
        sink = FileSink(tmp_path / "out", exactly_once=True)
        sink.connect_outputs(Emitted())
        sink.setup(OperatorContext("sink", 4, "c0", {}, state_dir=str(tmp_path / "state"),
                                   generation=fence.generation, fence_check=fence.check))
        return sink

    sink = started(old)
    sink.begin_window(wid(1))
    sink.process("input", pa.record_batch({"x": [1]}))
    sink.end_window()
    staging = tmp_path / "out" / ".staging"
    assert len(os.listdir(staging)) == 1
    (staging / ".window-1-0000000002.jsonl.999.tmp").write_text("a write cut short")
    new.claim()
    sink.begin_window(wid(2))
    sink.process("input", pa.record_batch({"x": [2]}))
    with pytest.raises(Fenced):
        sink.end_window()
    assert len(os.listdir(staging)) == 2  # the refused write left no file of its own
    started(new)  # restored from scratch: nothing staged is its own, the temp file goes
    assert os.listdir(staging) == []


def test_the_highest_fence_of_a_state_folder_is_what_a_new_run_starts_above(tmp_path):
    """Issue 36: a new run deploys above every fence an earlier run left."""
    fs = pafs.LocalFileSystem()
    assert highest_fence(fs, str(tmp_path / "none")) == 0
    for operator_id, generation in ((1, 3), (2, 7), (3, 1)):
        Fence(fs, str(tmp_path / CHECKPOINTS_FOLDER / str(operator_id)), generation).claim()
    (tmp_path / CHECKPOINTS_FOLDER / "4").mkdir()  # a folder without a fence
    assert highest_fence(fs, str(tmp_path)) == 7

"""RunningCount against a real local Spark: totals from its keyed store, a recovery from a
checkpoint replays onto exactly the checkpoint's totals, an old checkpoint's in-memory
totals load into the store, and a STATE_DIR that is not local is refused at setup."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from tests.operators.test_spark import Emitted, NoSpark, run_window
from weir.operators.library import RunningCount
from weir.operators.operator import OperatorContext
from weir.operators.state_store import StoreError, StoreHandle
from weir.operators.windows import make_window_id
from weir.runtime.operator_state import capture, restore

W = [make_window_id(1_700_000_000, i) for i in range(6)]


def started(op: RunningCount, spark: Any, state_dir: str, recovered: int = -1,
            attributes: dict[str, Any] | None = None) -> Emitted:
    emitted = Emitted()
    op.connect_outputs(emitted)
    op.setup(OperatorContext(name="count", operator_id=7, container_id="c0",
                             attributes=attributes or {}, spark=spark, state_dir=state_dir,
                             recovered_window=recovered))
    return emitted


def words(*values: str) -> dict[str, list[pa.RecordBatch]]:
    return {"input": [pa.record_batch({"word": list(values)})]}


def totals(emitted: Emitted) -> list[tuple[str, int, int]]:
    return sorted((r["word"], r["count"], r["window_id"]) for r in emitted.rows())


def test_totals_survive_a_recovery_that_replays_the_windows_after_the_checkpoint(
        bridge, tmp_path):
    op = RunningCount(key="word")
    emitted = started(op, bridge, str(tmp_path))
    run_window(op, W[1], words("a", "b", "a"))
    saved = capture(op)  # the checkpoint at W[1]
    op.checkpointed(W[1])
    run_window(op, W[2], words("a", "c"))
    assert totals(emitted) == [("a", 2, W[1]), ("a", 3, W[2]), ("b", 1, W[1]), ("c", 1, W[2])]
    assert op.output_schema("output").field("word").type == pa.string()
    assert len(saved) < 2_000 and op.state_keys == 3  # the handle, not the totals

    again = restore(RunningCount(key="word"), saved)  # the container died after W[2]
    replayed = started(again, bridge, str(tmp_path), recovered=W[1])
    run_window(again, W[2], words("a", "c"))
    run_window(again, W[3], words("b"))
    assert totals(replayed) == [("a", 3, W[2]), ("b", 2, W[3]), ("c", 1, W[2])]
    again.committed(W[3])
    again.teardown()


def test_an_old_checkpoint_with_totals_in_memory_loads_into_the_store(bridge, tmp_path):
    op = RunningCount(key="word")
    op.__dict__["totals"] = pa.table({"word": ["a", "b"], "count": [5, 1]})
    emitted = started(op, bridge, str(tmp_path), recovered=W[1])
    run_window(op, W[2], words("a"))
    assert totals(emitted) == [("a", 6, W[2])] and "totals" not in op.__dict__
    op.teardown()


def test_a_state_dir_that_is_not_local_is_refused_at_setup(tmp_path):
    with pytest.raises(StoreError, match="STATE_DIR is 's3://b/x', not a local path"):
        started(RunningCount(), NoSpark(), "", attributes={"STATE_DIR": "s3://b/x"})


def test_a_store_behind_its_checkpoint_is_refused_not_guessed(tmp_path):
    op = RunningCount(key="word")
    started(op, NoSpark(), str(tmp_path))
    op._store.apply(W[1], ["a"], [1])
    op.teardown()
    again = RunningCount(key="word")  # its checkpoint counts on W[2], which the disk lost
    again.state = StoreHandle(str(tmp_path / "running-count.sqlite"), W[2])
    with pytest.raises(StoreError, match="lost writes that were not yet synced"):
        started(again, NoSpark(), str(tmp_path), recovered=W[2])

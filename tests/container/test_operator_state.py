"""Operator state capture and restore: NON_STATE, classes by value, a source resuming."""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import ClassVar

import cloudpickle
import pyarrow as pa
import pytest

from weir.container.checkpoint_store import CheckpointStore
from weir.operators.library import TextFileSource
from weir.operators.operator import Operator, OperatorContext
from weir.operators.ports import InputPort, OutputPort
from weir.runtime.operator_state import OperatorStateError, capture, restore, state_of


class Counter(Operator):
    """Counts rows; holds a lock and a cache that are not state."""

    input = InputPort()
    output = OutputPort()

    NON_STATE: ClassVar[tuple[str, ...]] = ("_lock", "_cache")

    def __init__(self, label: str) -> None:
        self.label = label
        self.rows = 0
        self.per_window: dict[int, int] = {}
        self._lock = threading.Lock()  # unpicklable, but listed in NON_STATE
        self._cache: dict[str, int] | None = None

    def setup(self, context: OperatorContext) -> None:
        self._cache = {"ready": 1}


def test_state_skips_non_state_and_runtime_attributes():
    op = Counter("a")
    op.connect_outputs(print)
    assert set(state_of(op)) == {"label", "rows", "per_window"}


def test_capture_and_restore_keep_non_state_from_the_payload():
    op = Counter("a")
    op.rows = 42
    op.per_window = {1: 40, 2: 2}
    op._cache = {"stale": 0}
    data = capture(op)

    fresh = Counter("a")
    fresh_lock = fresh._lock
    restored = restore(fresh, data)
    assert restored is fresh
    assert restored.rows == 42 and restored.per_window == {1: 40, 2: 2}
    assert restored._lock is fresh_lock  # NON_STATE keeps the payload's value
    assert restored._cache is None  # not the captured cache; setup() rebuilds it


def test_restore_from_a_class_builds_without_init():
    op = Counter("b")
    op.rows = 3
    restored = restore(Counter, capture(op))
    assert isinstance(restored, Counter)
    assert (restored.label, restored.rows) == ("b", 3)
    assert not hasattr(restored, "_lock")


def test_unpicklable_attribute_not_in_non_state_is_named():
    op = Counter("c")
    op.conn = threading.Lock()  # e.g. a connection someone forgot to declare
    with pytest.raises(OperatorStateError) as caught:
        capture(op, name="x")
    message = str(caught.value)
    assert "attribute 'conn' of operator 'x' cannot be checkpointed" in message
    assert "lock" in message and "NON_STATE" in message


def test_unpicklable_attribute_message_defaults_to_the_class_name():
    op = Counter("c")
    op.rows = threading.Lock()  # type: ignore[assignment]
    with pytest.raises(OperatorStateError, match="attribute 'rows' of operator 'Counter'"):
        capture(op)


def test_class_defined_in_a_test_goes_by_value():
    """A class cloudpickle cannot import (like one in an app file) is pickled by value."""

    class Tally:  # local: not importable by name, so cloudpickle sends its code
        def __init__(self) -> None:
            self.items: dict[str, int] = defaultdict(int)

        def add(self, key: str) -> None:
            self.items[key] += 1

    class LocalOp(Operator):
        NON_STATE: ClassVar[tuple[str, ...]] = ("_session",)

        def __init__(self) -> None:
            self.tally = Tally()
            self.double = lambda x: 2 * x
            self._session = object()

    op = LocalOp()
    op.tally.add("a")
    op.tally.add("a")
    payload = cloudpickle.dumps(LocalOp())  # what the master ships at deploy
    data = capture(op)

    restored = restore(cloudpickle.loads(payload), data)
    assert type(restored).__name__ == "LocalOp"
    assert dict(restored.tally.items) == {"a": 2}
    restored.tally.add("b")  # methods of the by-value class work
    assert restored.tally.items["b"] == 1
    assert restored.double(21) == 42
    assert restored._session is not None


def test_restore_errors_name_the_operator():
    data = capture(Counter("d"))
    with pytest.raises(OperatorStateError, match="operator 'y'.*holds the state of a Counter"):
        restore(TextFileSource(__file__), data, name="y")
    with pytest.raises(OperatorStateError, match="operator 'z' cannot be restored"):
        restore(Counter("d"), data[:-5], name="z")
    with pytest.raises(OperatorStateError, match="operator 'Counter' is not a Weir operator"):
        restore(Counter("d"), cloudpickle.dumps([1, 2]))


class Lines:
    """Collects what a source emits, per window (``op.connect_outputs``)."""

    def __init__(self) -> None:
        self.window = -1
        self.by_window: dict[int, list[str]] = defaultdict(list)

    def __call__(self, port: str, batch: pa.RecordBatch) -> None:
        self.by_window[self.window].extend(batch.column("line").to_pylist())

    def all(self) -> list[str]:
        return [line for w in sorted(self.by_window) for line in self.by_window[w]]


def _context() -> OperatorContext:
    return OperatorContext(name="source", operator_id=1, container_id="c0",
                           attributes={"STREAMING_WINDOW_SIZE_MILLIS": 500})


def _run_windows(op: TextFileSource, lines: Lines, windows: range) -> bool:
    more = True
    for w in windows:
        lines.window = w
        op.begin_window(w)
        for _ in range(10):
            more = op.emit_tuples()
            if not more:
                break
        op.end_window()
        if not more:
            break
    return more


def test_text_file_source_resumes_at_the_checkpointed_position(tmp_path):
    text = [f"line {i} " + "é" * (i % 5) for i in range(25)]
    book = tmp_path / "book.txt"
    book.write_text("\r\n".join(text[:10]) + "\r\n" + "\n".join(text[10:]), encoding="utf-8")
    original = TextFileSource(book, lines_per_window=4, batch_lines=3)
    payload = cloudpickle.dumps(original)  # the deploy payload, before any window

    op = cloudpickle.loads(payload)
    before = Lines()
    op.connect_outputs(before)
    op.setup(_context())
    assert _run_windows(op, before, range(1, 4))  # windows 1..3: 12 lines
    assert before.all() == text[:12]
    store = CheckpointStore(str(tmp_path / "state"))
    store.save(1, 3, capture(op, name="source"))
    assert _run_windows(op, before, range(4, 5))  # the lost container got further...
    op.teardown()

    # ... but a replacement starts from the payload and the last checkpoint
    fresh = restore(cloudpickle.loads(payload), store.load(1, store.latest(1)), name="source")
    assert fresh.position > 0 and fresh.line_number == 12
    after = Lines()
    fresh.connect_outputs(after)
    fresh.setup(_context())
    assert not _run_windows(fresh, after, range(4, 100))
    fresh.teardown()
    assert after.by_window[4] == text[12:16]
    assert after.all() == text[12:]
    assert before.all()[:12] + after.all() == text


def test_field_newly_marked_non_state_keeps_the_payload_value(monkeypatch):
    """A checkpoint from before a field joined NON_STATE does not overwrite it."""
    op = Counter("e")
    op._cache = {"old": 1}
    monkeypatch.setattr(Counter, "NON_STATE", ("_lock",))
    data = capture(op)  # holds _cache
    monkeypatch.undo()
    restored = restore(Counter("e"), data)
    assert restored._cache is None

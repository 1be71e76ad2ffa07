"""The library operators driven through their hooks: real files, real Spark, real output."""

from __future__ import annotations

import json
import os
import pickle
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from weir.operators.library import (
    ConsoleSink,
    EventGenerator,
    FileSink,
    TextFileSource,
    Tokenize,
    WindowedCount,
    sources,
)
from weir.operators.operator import InputOperator, Operator, OperatorContext
from weir.operators.testing import CollectSink, ListSource
from weir.operators.windows import format_window_id, make_window_id
from weir.runtime.spark.bridge import SparkSessionBridge

BASE = 1_700_000_000


def wid(counter: int) -> int:
    return make_window_id(BASE, counter)


class Emitted:
    """Stands in for the runtime's emit function: batches per window, for one output port."""

    def __init__(self) -> None:
        self.window = -1
        self.batches: dict[int, list[pa.RecordBatch]] = defaultdict(list)

    def __call__(self, port: str, batch: pa.RecordBatch) -> None:
        self.batches[self.window].append(batch)

    def rows(self) -> list[dict[str, Any]]:
        return [r for w in sorted(self.batches) for b in self.batches[w] for r in b.to_pylist()]

    def all_batches(self) -> list[pa.RecordBatch]:
        return [b for w in sorted(self.batches) for b in self.batches[w]]


def start(op: Operator, spark: Any = None, window_ms: int = 500) -> Emitted:
    emitted = Emitted()
    op.connect_outputs(emitted)
    op.setup(OperatorContext(name=type(op).__name__.lower(), operator_id=1, container_id="c0",
                             attributes={"STREAMING_WINDOW_SIZE_MILLIS": window_ms},
                             spark=spark))
    return emitted


def run_source(op: InputOperator, emitted: Emitted, first: int = 1, max_windows: int = 1000,
               calls_per_window: int = 50) -> int:
    """Drives windows until the source ends; returns how many windows it took."""
    for counter in range(first, first + max_windows):
        emitted.window = wid(counter)
        op.begin_window(emitted.window)
        more = True
        for _ in range(calls_per_window):
            more = op.emit_tuples()
            if not more:
                break
        op.end_window()
        if not more:
            return counter - first + 1
    raise AssertionError("the source did not end")


def run_window(op: Operator, emitted: Emitted, window_id: int,
               batches: list[pa.RecordBatch]) -> None:
    emitted.window = window_id
    op.begin_window(window_id)
    for batch in batches:
        op.process("input", batch)
    op.end_window()


# -- sources -------------------------------------------------------------------------------
TEXT = ("The quick brown fox\r\n\nJumps over THE lazy dog; \u00e9t\u00e9 caf\u00e9!\n"
        "it's 42 o'clock\n" + "".join(f"line {i} of many\n" for i in range(40))
        + "last line without a break")


def expected_lines(text: str) -> list[str]:
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "book.txt"
    path.write_bytes(TEXT.encode("utf-8"))
    return path


def test_text_file_source_emits_every_line(text_file: Path) -> None:
    op = TextFileSource(text_file, batch_lines=4, read_bytes=7)  # lines span reads
    emitted = start(op)
    run_source(op, emitted)
    assert [r["line"] for r in emitted.rows()] == expected_lines(TEXT)
    assert all(b.num_rows <= 4 for b in emitted.all_batches())
    assert op.position == len(TEXT.encode()) and op.line_number == len(expected_lines(TEXT))
    op.teardown()


def test_text_file_source_paces_and_resumes(text_file: Path) -> None:
    op = TextFileSource(text_file, lines_per_window=5, batch_lines=3)
    emitted = start(op)
    for counter in (1, 2):  # two windows, then a checkpoint
        emitted.window = wid(counter)
        op.begin_window(emitted.window)
        for _ in range(10):
            assert op.emit_tuples()
        op.end_window()
    assert [sum(b.num_rows for b in emitted.batches[wid(c)]) for c in (1, 2)] == [5, 5]
    restored = pickle.loads(pickle.dumps(op))
    op.teardown()
    rest = start(restored)
    windows = run_source(restored, rest, first=3)
    lines = expected_lines(TEXT)
    assert windows == -(-(len(lines) - 10) // 5)
    assert [r["line"] for r in emitted.rows() + rest.rows()] == lines
    assert max(sum(b.num_rows for b in bs) for bs in rest.batches.values()) == 5
    restored.teardown()


def test_text_file_source_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.txt.*does not exist"):
        start(TextFileSource(tmp_path / "nope.txt"))


def test_event_generator_is_exact_and_deterministic() -> None:
    def events(op: EventGenerator) -> pa.Table:
        emitted = start(op)
        run_source(op, emitted)
        return pa.Table.from_batches(emitted.all_batches())

    first = events(EventGenerator(keys=37, total=10_000, batch_rows=3_000, seed=5))
    again = events(EventGenerator(keys=37, total=10_000, batch_rows=3_000, seed=5))
    other = events(EventGenerator(keys=37, total=10_000, batch_rows=3_000, seed=6))
    assert first.num_rows == 10_000
    assert first.schema == sources.EVENT_SCHEMA
    assert first.drop_columns("event_time_ms") == again.drop_columns("event_time_ms")
    assert first.drop_columns("event_time_ms") != other.drop_columns("event_time_ms")
    assert set(first.column("key").to_pylist()) <= {f"k{i:04d}" for i in range(37)}
    assert 0 <= min(first.column("value").to_pylist()) <= max(first.column("value").to_pylist())
    assert max(first.column("value").to_pylist()) <= 99
    got = first.group_by("key").aggregate([("value", "count"), ("value", "sum")])
    counts = {r["key"]: (r["value_count"], r["value_sum"]) for r in got.to_pylist()}
    assert counts == EventGenerator(keys=37, total=10_000, batch_rows=3_000,
                                    seed=5).expected_counts()


def test_event_generator_rate_per_window() -> None:
    op = EventGenerator(rate_per_second=3, keys=5, batch_rows=2)
    emitted = start(op, window_ms=500)  # 1.5 events per window
    for counter in range(1, 5):
        emitted.window = wid(counter)
        op.begin_window(emitted.window)
        for _ in range(10):
            assert op.emit_tuples()  # unbounded
        op.end_window()
    per_window = [sum(b.num_rows for b in emitted.batches[wid(c)]) for c in range(1, 5)]
    assert per_window == [1, 2, 1, 2]


# -- Spark window logic ---------------------------------------------------------------------
LINES = ["The cat and THE hat.", "", "it's a cat-cat world; caf\u00e9 42x", "   ", "Hat? hat!"]


def test_tokenize_then_count_equals_python(bridge: SparkSessionBridge) -> None:
    tokenize, count = Tokenize(), WindowedCount()
    words, counts = start(tokenize, bridge), start(count, bridge)
    batches = [pa.record_batch({"line": LINES[:2]}), pa.record_batch({"line": LINES[2:]})]
    run_window(tokenize, words, wid(3), batches)
    assert sorted(r["word"] for r in words.rows()) == sorted(
        w for line in LINES for w in re.findall(r"[a-z]+", line.lower()))
    run_window(count, counts, wid(3), words.all_batches())
    expected = Counter(w for line in LINES for w in re.findall(r"[a-z]+", line.lower()))
    rows = counts.rows()
    assert {r["word"]: r["count"] for r in rows} == dict(expected)
    assert {r["window_id"] for r in rows} == {wid(3)}
    assert counts.all_batches()[0].schema == pa.schema(
        [("word", pa.string()), ("count", pa.int64()), ("window_id", pa.int64())])
    assert os.listdir(bridge.scratch_dir) == []


def test_generated_events_counted_in_spark(bridge: SparkSessionBridge) -> None:
    gen = EventGenerator(keys=50, total=20_000, batch_rows=8_192, seed=1)
    events = start(gen)
    run_source(gen, events)
    count = WindowedCount(key="key", value="value")
    counts = start(count, bridge)
    run_window(count, counts, wid(1), events.all_batches())
    got = {r["key"]: (r["count"], r["sum"]) for r in counts.rows()}
    assert got == gen.expected_counts()


def test_windowed_count_groups_on_key_codes_and_maps_them_back(
        bridge: SparkSessionBridge, monkeypatch: pytest.MonkeyPatch) -> None:
    count = WindowedCount(key="key", value="value")
    counts = start(count, bridge)

    def window(counter: int, *columns: list) -> dict:
        batches = [pa.record_batch({"key": keys, "value": list(range(len(keys)))})
                   for keys in columns]
        counts.batches.clear()
        run_window(count, counts, wid(counter), batches)
        spark_key_type = count._input_schemas["input"].field("key").type  # noqa: SLF001
        return spark_key_type, {r["key"]: (r["count"], r["sum"]) for r in counts.rows()}

    key_type, got = window(1, ["b", "a", None, "b"], ["c", "a"])
    assert key_type == pa.int32()  # Spark grouped the codes ...
    assert got == {"a": (2, 1 + 1), "b": (2, 0 + 3), None: (1, 2), "c": (1, 0)}  # ... exactly
    key_type, got = window(2, ["z", "b"])  # a new window has its own dictionary
    assert got == {"z": (1, 0), "b": (1, 1)}
    assert counts.all_batches()[0].schema.field("key").type == pa.string()

    monkeypatch.setattr("weir.operators.library.key_codes.MAX_KEYS", 2)
    _, got = window(3, ["p", "q", "r"])  # more keys than worth coding ...
    key_type, later = window(4, ["p", "p"])  # ... so the next window groups the strings
    assert got == {"p": (1, 0), "q": (1, 1), "r": (1, 2)} and later == {"p": (2, 1)}
    assert key_type == pa.string()
    assert os.listdir(bridge.scratch_dir) == []


# -- sinks ---------------------------------------------------------------------------------
def test_file_sink_reports_files_written_and_write_time(tmp_path: Path) -> None:
    from weir.operators.metrics import collect_metrics

    sink = FileSink(tmp_path / "out", format="parquet")
    emitted = start(sink)
    run_window(sink, emitted, wid(1), [COUNTS_1])
    run_window(sink, emitted, wid(2), [])  # no rows: no file
    figures = collect_metrics(sink)
    assert figures["files_written"] == 1 and figures["write_ms"] > 0


COUNTS_1 = pa.record_batch({"word": ["a", "b", "c"], "count": [5, 9, 1]})
COUNTS_2 = pa.record_batch({"word": ["a", "d"], "count": [10, 2]})


def test_console_sink_prints_windows_and_totals(capsys) -> None:
    sink = ConsoleSink(limit=2, sort_by="count", title="top", summarize=("word", "count"))
    emitted = start(sink)
    run_window(sink, emitted, wid(1), [COUNTS_1])
    run_window(sink, emitted, wid(2), [])
    run_window(sink, emitted, wid(3), [COUNTS_2])
    sink.teardown()
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"-- top | window {format_window_id(wid(1))} -- 3 rows, first 2"
    assert out[1].split() == ["word", "count"]
    assert [line.split() for line in out[3:5]] == [["b", "9"], ["a", "5"]]
    assert out[5] == f"-- top | window {format_window_id(wid(3))} -- 2 rows"
    assert [line.split() for line in out[8:10]] == [["a", "10"], ["d", "2"]]
    assert out[10] == "== top | total count per word over 5 rows, top 2 of 4 =="
    assert [line.split() for line in out[13:]] == [["a", "15"], ["b", "9"]]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_file_sink_writes_one_file_per_window(tmp_path: Path, fmt: str) -> None:
    folder = tmp_path / "out" / "counts"
    sink = FileSink(folder, format=fmt)
    emitted = start(sink)
    run_window(sink, emitted, wid(1), [COUNTS_1])
    run_window(sink, emitted, wid(2), [])
    run_window(sink, emitted, wid(12), [COUNTS_2, COUNTS_2.slice(1)])
    names = sorted(os.listdir(folder))
    assert names == [sink.file_name(wid(1)), sink.file_name(wid(12))]
    assert names[0] == f"window-{BASE}-0000000001.{fmt}"
    if fmt == "jsonl":
        rows = [[json.loads(line) for line in (folder / n).read_text().splitlines()]
                for n in names]
    else:
        rows = [pq.read_table(folder / n).to_pylist() for n in names]
    assert rows == [COUNTS_1.to_pylist(), COUNTS_2.to_pylist() + COUNTS_2.slice(1).to_pylist()]


def test_list_source_and_collect_sink() -> None:
    src = ListSource([[{"x": 1}, {"x": 2}], [], pa.record_batch({"x": [3]})])
    emitted = start(src)
    assert run_source(src, emitted) == 3
    sink = CollectSink()
    for window in (wid(1), wid(2), wid(3)):
        run_window(sink, Emitted(), window, emitted.batches.get(window, []))
    assert sink.rows() == [{"x": 1}, {"x": 2}, {"x": 3}]
    assert sink.rows(wid(3)) == [{"x": 3}]
    assert sorted(sink.tables()) == [wid(1), wid(3)] and sink.windows == [wid(1), wid(2), wid(3)]


def test_event_generator_batches_are_the_emitted_events() -> None:
    gen = EventGenerator(keys=50, total=1_000, batch_rows=300, seed=3)
    table = pa.Table.from_batches(list(gen.batches()))
    assert table.num_rows == 1_000
    summed = table.group_by("key").aggregate([("value", "sum"), ("key", "count")])
    got = {k: (c, s) for k, s, c in zip(summed["key"].to_pylist(),
                                        summed["value_sum"].to_pylist(),
                                        summed["key_count"].to_pylist(), strict=True)}
    assert got == gen.expected_counts()


def test_console_sink_header_names_the_window_its_rows_belong_to(capsys) -> None:
    sink = ConsoleSink(title="counts")
    start(sink)
    rows = pa.record_batch({"word": ["a"], "count": [3], "window_id": [wid(4)]})
    run_window(sink, Emitted(), wid(5), [rows])  # an application window of wid(4) ends in 5
    assert capsys.readouterr().out.splitlines()[0] == \
        f"-- counts | window {format_window_id(wid(4))} -- 1 rows"

"""ParquetSource driven through its hooks over real Parquet and Arrow IPC files: every row in
order, bounded windows, identical windows after a restore, partitions, and its errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from tests.operators.test_exactly_once import source_window, started
from tests.operators.test_library import Emitted, run_source, wid
from weir.operators.library import ParquetSource
from weir.operators.metrics import collect_metrics
from weir.operators.operator import OperatorContext
from weir.runtime.operator_state import capture, restore

FORMATS = ["parquet", "arrow", "jsonl", "csv"]


def table(first: int, rows: int, value_type: pa.DataType | None = None) -> pa.Table:
    ids = list(range(first, first + rows))
    return pa.table({"id": pa.array(ids, pa.int64()),
                     "key": pa.array([f"k{i % 7}" for i in ids], pa.string()),
                     "value": pa.array([i % 5 for i in ids], value_type or pa.int64())})


def write(path: Path, data: pa.Table, fmt: str, chunk_rows: int = 300) -> None:
    """Writes ``data`` in chunks (row groups, record batches) of ``chunk_rows``, under a
    temporary name renamed into place, as a producer must."""
    tmp = path.with_name(path.name + ".tmp")
    if fmt == "jsonl":
        tmp.write_text("".join(json.dumps(row) + "\n" for row in data.to_pylist()))
    elif fmt == "csv":
        pacsv.write_csv(data, tmp)
    elif fmt == "parquet":
        pq.write_table(data, tmp, row_group_size=chunk_rows)
    else:
        with pa.ipc.new_file(tmp, data.schema) as writer:
            for batch in data.to_batches(max_chunksize=chunk_rows):
                writer.write_batch(batch)
    os.replace(tmp, path)


def make_inbox(folder: Path, fmt: str, files: int = 3, rows: int = 1000) -> list[int]:
    """``files`` files of ``rows`` rows (ids counting up across files); returns the ids."""
    folder.mkdir(exist_ok=True)
    for f in range(files):
        write(folder / f"part-{f:03d}.{fmt}", table(f * rows, rows), fmt)
    return list(range(files * rows))


def ids(emitted: Emitted) -> list[int]:
    return [row["id"] for row in emitted.rows()]


def ids_by_window(emitted: Emitted) -> dict[int, list[int]]:
    return {w: [i for b in bs for i in b.column("id").to_pylist()]
            for w, bs in emitted.batches.items() if any(b.num_rows for b in bs)}


@pytest.mark.parametrize("fmt", FORMATS)
def test_reads_every_row_in_name_order_across_files(tmp_path, fmt):
    expected = make_inbox(tmp_path, fmt)
    write(tmp_path / f"part-003.{fmt}", table(0, 0), fmt)  # an empty file is read too
    write(tmp_path / f".hidden.{fmt}", table(10**6, 5), fmt)
    (tmp_path / f"part-004.{fmt}.tmp").write_bytes(b"being written")
    (tmp_path / "notes.txt").write_text("not input")
    src = ParquetSource(tmp_path, format=fmt, pattern=f"*.{fmt}", batch_rows=128)
    emitted = start(src)
    run_source(src, emitted)
    assert ids(emitted) == expected
    assert max(b.num_rows for b in emitted.all_batches()) == 128
    assert emitted.all_batches()[0].schema == table(0, 1).schema
    assert collect_metrics(src) == {"rows_read": 3000.0, "files_read": 4.0}
    assert src.done == [f"part-{i:03d}.{fmt}" for i in range(4)]


def test_rows_per_window_bounds_every_window(tmp_path):
    expected = make_inbox(tmp_path, "parquet")
    src = ParquetSource(tmp_path, rows_per_window=250, batch_rows=100)
    emitted = start(src)
    run_source(src, emitted)
    windows = ids_by_window(emitted)
    assert [len(rows) for rows in windows.values()] == [250] * 12  # 3 x 1000 rows
    assert [i for rows in windows.values() for i in rows] == expected


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_restored_source_replays_identical_windows(tmp_path, fmt):
    inbox, state = tmp_path / "inbox", tmp_path / "state"
    expected = make_inbox(inbox, fmt)
    src = ParquetSource(inbox, format=fmt, batch_rows=170)
    emitted = started(src, state)
    source_window(src, emitted, 1, calls=2)
    checkpoint = capture(src)  # the state as of window 1
    for counter in range(2, 8):
        source_window(src, emitted, counter, calls=3)
    first_run = ids_by_window(emitted)
    src.teardown()

    # the container dies; a new one restores window 1's checkpoint and replays the windows
    again = restore(ParquetSource(inbox, format=fmt), checkpoint)
    replayed = started(again, state, recovered=wid(1))
    for counter in range(2, 8):
        source_window(again, replayed, counter, calls=11)  # other timing, same windows
    assert ids_by_window(replayed) == {w: rows for w, rows in first_run.items() if w > wid(1)}
    counter = 8
    while source_window(again, replayed, counter, calls=5):  # then it carries on to the end
        counter += 1
    rest = [i for w, rows in ids_by_window(replayed).items() for i in rows]
    assert first_run[wid(1)] + rest == expected


def test_a_replayed_window_over_a_shortened_file_is_an_error(tmp_path):
    inbox, state = tmp_path / "inbox", tmp_path / "state"
    make_inbox(inbox, "parquet", files=1)
    src = ParquetSource(inbox, batch_rows=400)
    emitted = started(src, state)
    checkpoint = capture(src)
    source_window(src, emitted, 1, calls=3)
    src.teardown()
    write(inbox / "part-000.parquet", table(0, 500), "parquet")  # rewritten: not allowed
    again = restore(ParquetSource(inbox), checkpoint)
    replayed = started(again, state, recovered=wid(0))
    with pytest.raises(RuntimeError, match=r"part-000.parquet has 500 rows, fewer than"):
        source_window(again, replayed, 1)


def test_partitions_read_disjoint_files_covering_all(tmp_path):
    for f in range(12):
        write(tmp_path / f"part-{f:02d}.parquet", table(f * 10, 10), "parquet")
    seen: list[int] = []
    for index in range(3):
        src = ParquetSource(tmp_path)
        emitted = start(src, partition=(index, 3))
        run_source(src, emitted)
        assert ids(emitted), f"partition {index} got no file"
        seen += ids(emitted)
    assert sorted(seen) == list(range(120))  # each row once: the files are disjoint


def test_a_file_with_another_schema_is_an_error_naming_it_and_the_difference(tmp_path):
    write(tmp_path / "a.parquet", table(0, 10), "parquet")
    write(tmp_path / "b.parquet", table(10, 10, value_type=pa.int32()), "parquet")
    src = ParquetSource(tmp_path)
    emitted = start(src)
    with pytest.raises(ValueError, match=r"b\.parquet has another schema .* value: int64 "
                                         r"there, int32 here.*columns="):
        run_source(src, emitted)


def test_columns_selects_and_orders_columns_so_files_with_extra_columns_fit(tmp_path):
    write(tmp_path / "a.parquet", table(0, 10), "parquet")
    write(tmp_path / "b.parquet", table(10, 10).append_column("extra", pa.array([1] * 10)),
          "parquet")
    src = ParquetSource(tmp_path, columns=["value", "id"])
    emitted = start(src)
    run_source(src, emitted)
    assert emitted.all_batches()[0].schema.names == ["value", "id"]
    assert ids(emitted) == list(range(20))
    with pytest.raises(ValueError, match=r"no column\(s\) \['nope'\]"):
        run_source(source := ParquetSource(tmp_path, columns=["nope"]), start(source))


def test_a_missing_path_is_an_error_at_setup_naming_operator_and_path(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=rf"'parquetsource'.*{missing}.*fix the path"):
        start(ParquetSource(missing))


@pytest.mark.parametrize("kwargs, name", [({"format": "xml"}, "format"),
                                          ({"file_schema": pa.schema([("a", pa.int64())])},
                                           "file_schema"),
                                          ({"rows_per_window": 0}, "rows_per_window"),
                                          ({"batch_rows": -1}, "batch_rows"),
                                          ({"columns": "id"}, "columns")])
def test_bad_arguments_are_value_errors_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ParquetSource("in", **kwargs)


def test_watch_picks_up_a_file_that_appears_later(tmp_path):
    make_inbox(tmp_path, "arrow", files=1, rows=50)
    src = ParquetSource(tmp_path, format="arrow", watch=True)
    emitted = start(src)
    for counter in range(1, 4):
        assert source_window(src, emitted, counter, calls=5)  # never ends by itself
    assert ids(emitted) == list(range(50))
    write(tmp_path / "part-001.arrow", table(50, 20), "arrow")
    src._next_scan = 0.0  # the next listing is due (it waits _SCAN_S after an empty one)
    source_window(src, emitted, 4, calls=5)
    assert ids_by_window(emitted)[wid(4)] == list(range(50, 70))


def test_a_file_uri_and_a_single_file_are_read(tmp_path):
    expected = make_inbox(tmp_path, "parquet", files=2)
    src = ParquetSource(tmp_path.as_uri() + "/")
    assert src.path.startswith("file://")
    emitted = start(src)
    run_source(src, emitted)
    assert ids(emitted) == expected
    one = ParquetSource((tmp_path / "part-001.parquet").as_uri())
    emitted = start(one)
    run_source(one, emitted)
    assert ids(emitted) == expected[1000:]


def start(src: ParquetSource, partition: tuple[int, int] = (0, 1)) -> Emitted:
    """Sets ``src`` up without a state folder (no window log), as partition ``partition``."""
    emitted = Emitted()
    src.connect_outputs(emitted)
    src.setup(OperatorContext(name="parquetsource", operator_id=1, container_id="c0",
                              attributes={}, partition_index=partition[0],
                              partition_count=partition[1]))
    return emitted


def test_text_files_keep_one_schema_when_it_is_given(tmp_path):
    """JSON-lines types are inferred per file: a column of integers in one file and all
    null in the next differ, and the second file is refused naming the column; with
    ``file_schema`` both read, ISO-8601 times parsed, fields outside it not read."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.jsonl").write_text('{"ts": "2026-11-26T10:00:00.250", "n": 1, "x": "a"}\n')
    (inbox / "b.jsonl").write_text('{"ts": "2026-11-26T10:00:01.500", "n": null, "x": "b"}\n')
    (inbox / "c.jsonl").write_text("")  # an empty file: no rows, no schema to compare
    inferred = ParquetSource(str(inbox), format="jsonl")
    with pytest.raises(ValueError, match="n: int64 there, null here"):
        run_source(inferred, start(inferred))
    schema = pa.schema([("ts", pa.timestamp("ms")), ("n", pa.int64())])
    given = ParquetSource(str(inbox), format="jsonl", file_schema=schema)
    emitted = start(given)
    run_source(given, emitted)
    rows = emitted.rows()
    assert [(r["ts"].isoformat(), r["n"]) for r in rows] == [
        ("2026-11-26T10:00:00.250000", 1), ("2026-11-26T10:00:01.500000", None)]
    assert all(set(r) == {"ts", "n"} for r in rows)


def test_a_csv_file_without_a_schema_column_is_refused_naming_it(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.csv").write_text("ts,user\n2026-11-26T10:00:00,u1\n")
    schema = pa.schema([("ts", pa.timestamp("ms")), ("amount", pa.int64())])
    src = ParquetSource(str(inbox), format="csv", file_schema=schema)
    with pytest.raises(ValueError, match=r"no column\(s\) \['amount'\] in its header"):
        run_source(src, start(src))


def test_json_lines_and_csv_sources_read_as_parquet_source_with_the_format_does(tmp_path):
    from weir.operators.library import CsvSource, JsonLinesSource

    schema = pa.schema([("ts", pa.timestamp("ms")), ("amount", pa.int64())])
    for source, name, text in (
            (JsonLinesSource, "a.jsonl", '{"ts": "2026-11-26T10:00:00", "amount": 3}\n'),
            (CsvSource, "a.csv", "ts,amount\n2026-11-26T10:00:00,3\n")):
        inbox = tmp_path / source.__name__
        inbox.mkdir()
        (inbox / name).write_text(text)
        src = source(str(inbox), file_schema=schema, rows_per_window=10)
        assert src.rows_per_window == 10  # the other options reach ParquetSource
        emitted = start(src)
        run_source(src, emitted)
        assert [(r["ts"].isoformat(), r["amount"]) for r in emitted.rows()] == [
            ("2026-11-26T10:00:00", 3)], source.__name__

"""FileSink dictionary-encodes a Parquet column only where the dictionary would fit."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from tests.operators.test_library import run_window, start, wid
from weir.operators.library import FileSink
from weir.operators.library.parquet_dictionary import dictionary_columns

ROWS = 200_000


def _table() -> pa.Table:
    return pa.table({
        "extra": pa.array([f"free text number {i:08d} " * 2 for i in range(ROWS)]),
        "category": pa.array([i % 10 for i in range(ROWS)], pa.int64()),
        "price": pa.array([i * 7919 % 1_000_003 for i in range(ROWS)], pa.int64()),
    })


def _encodings(path: str) -> dict[str, set[str]]:
    meta = pq.ParquetFile(path).metadata
    group = meta.row_group(0)
    return {group.column(i).path_in_schema: set(group.column(i).encodings)
            for i in range(group.num_columns)}


def test_only_columns_whose_dictionary_fits_are_dictionary_encoded(tmp_path):
    table = _table()
    assert dictionary_columns(table) == ["category"]
    sink = FileSink(tmp_path / "out", format="parquet")
    run_window(sink, start(sink), wid(1), table.to_batches())
    path = str(tmp_path / "out" / sink.file_name(wid(1)))
    encodings = _encodings(path)
    assert "RLE_DICTIONARY" in encodings["category"]
    assert not encodings["extra"] & {"RLE_DICTIONARY", "PLAIN_DICTIONARY"}
    assert not encodings["price"] & {"RLE_DICTIONARY", "PLAIN_DICTIONARY"}
    assert pq.read_table(path).equals(table)


def test_small_and_nested_tables_keep_the_writers_default():
    assert dictionary_columns(_table().slice(0, 100)) is True
    nested = pa.table({"tags": pa.array([["a", "b"]] * 10_000)})
    assert dictionary_columns(nested) is True

"""Which columns of a Parquet file to dictionary-encode: those whose dictionary would fit.

Parquet writers dictionary-encode every column by default and give up on a column chunk
once its dictionary outgrows a page (1 MB in pyarrow), having hashed every value up to
there. On a column of mostly distinct values (ids, prices, free text) that is work for
nothing: Nexmark q1's output (1.01 M rows, 108 MB), median CPU of three writes in one
sitting, 347 ms with pyarrow's default, 252 ms without dictionaries, for 78 and 79 MB.
So the first rows of each column are sampled, the dictionary the whole column would need
is estimated from them, and a column is dictionary-encoded only when that estimate fits
in the page, which is when the writer would have kept the dictionary.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["DICTIONARY_PAGE_BYTES", "dictionary_columns"]

DICTIONARY_PAGE_BYTES = 1 << 20
"""pyarrow's ``dictionary_pagesize_limit``: past it, a column chunk falls back to plain."""

SAMPLE_ROWS = 8192
"""Rows sampled per column, from the start of the table (where the writer begins)."""


def dictionary_columns(table: pa.Table, sample_rows: int = SAMPLE_ROWS) -> list[str] | bool:
    """The names of ``table``'s columns to dictionary-encode (``use_dictionary`` of
    ``pyarrow.parquet.write_table``); True, the writer's default, when a column is nested
    (its leaves are not named by the column) or the table is no larger than the sample."""
    if table.num_rows <= sample_rows or any(
            pa.types.is_nested(field.type) for field in table.schema):
        return True
    sample = table.slice(0, sample_rows)
    chosen = []
    for name, column in zip(table.column_names, sample.columns, strict=True):
        if not pa.types.is_dictionary(column.type):  # already a dictionary: kept as one
            share = pc.count_distinct(column, mode="all").as_py() / len(column)
            width = column.nbytes / len(column)  # bytes a value takes, on average
            estimate = share * table.num_rows * width
            if estimate > DICTIONARY_PAGE_BYTES:
                continue
        chosen.append(name)
    return chosen

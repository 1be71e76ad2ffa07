"""A table's rows as record batches, without cutting its largest column into pieces.

A table assembled from several sources (``SparkSql``'s result: the columns Spark computed,
in Spark's 10,000-row Arrow batches, beside the columns passed through, in the input's
batches) has columns chunked differently. ``Table.to_batches`` then cuts every column at
every boundary of any column: many small batches, each a slice that keeps its columns'
whole chunks alive. ``table_batches`` follows the chunks of the column holding the most
bytes instead, and copies only the other columns' pieces that straddle its boundaries.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["table_batches"]


def table_batches(table: pa.Table) -> list[pa.RecordBatch]:
    """``table``'s rows, in order, as batches along its heaviest column's chunks."""
    columns = table.columns
    layouts = {tuple(len(chunk) for chunk in column.chunks) for column in columns}
    if len(layouts) <= 1:
        return table.to_batches()
    heavy = max(range(len(columns)), key=lambda i: columns[i].nbytes)
    batches = []
    offset = 0
    for chunk in columns[heavy].chunks:
        length = len(chunk)
        if not length:
            continue
        arrays = [chunk if i == heavy else _one_array(column.slice(offset, length))
                  for i, column in enumerate(columns)]
        batches.append(pa.RecordBatch.from_arrays(arrays, schema=table.schema))
        offset += length
    return batches


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array: a zero-copy slice when it lies within one chunk."""
    pieces = [chunk for chunk in column.chunks if len(chunk)]
    if len(pieces) == 1:
        return pieces[0]
    return column.combine_chunks()

"""A table of differently chunked columns goes out along its heaviest column's chunks."""

from __future__ import annotations

import pyarrow as pa

from weir.operators.table_batches import table_batches


def _chunked(values: list, sizes: list[int], type_: pa.DataType) -> pa.ChunkedArray:
    chunks, start = [], 0
    for size in sizes:
        chunks.append(pa.array(values[start:start + size], type_))
        start += size
    return pa.chunked_array(chunks, type_)


def test_batches_follow_the_heaviest_column_and_keep_its_chunks():
    rows = 100
    words = [f"word number {i}" for i in range(rows)]  # the heaviest column
    table = pa.table({"n": _chunked(list(range(rows)), [10] * 10, pa.int64()),
                      "word": _chunked(words, [37, 37, 26], pa.string())})
    batches = table_batches(table)
    assert [b.num_rows for b in batches] == [37, 37, 26]  # not cut at every 10 rows
    for batch, chunk in zip(batches, table.column("word").chunks, strict=True):
        assert batch.column(1).buffers()[2].address == chunk.buffers()[2].address  # no copy
    assert pa.Table.from_batches(batches).equals(table)


def test_a_table_chunked_alike_is_cut_as_arrow_cuts_it():
    table = pa.table({"n": [1, 2, 3], "w": ["a", "b", "c"]})
    table = pa.concat_tables([table, table])
    assert [b.num_rows for b in table_batches(table)] == [3, 3]


def test_empty_chunks_and_an_empty_table():
    table = pa.table({"n": _chunked([1, 2, 3], [0, 3], pa.int64()),
                      "w": _chunked(["a" * 40, "b" * 40, "c" * 40], [1, 0, 2], pa.string())})
    batches = table_batches(table)
    assert [b.num_rows for b in batches] == [1, 2]
    assert pa.Table.from_batches(batches).equals(table.combine_chunks())
    empty = pa.table({"n": pa.array([], pa.int64())})
    assert sum(b.num_rows for b in table_batches(empty)) == 0


def test_an_output_port_emits_a_table_along_its_heaviest_column():
    from weir.operators.operator import Operator
    from weir.operators.ports import OutputPort

    class Maker(Operator):
        output = OutputPort()

    rows = 100
    table = pa.table({"n": _chunked(list(range(rows)), [10] * 10, pa.int64()),
                      "word": _chunked([f"word number {i}" for i in range(rows)], [50, 50],
                                       pa.string())})
    emitted: list[pa.RecordBatch] = []
    maker = Maker()
    maker.connect_outputs(lambda port, batch: emitted.append(batch))
    maker.output.emit(table)
    assert [b.num_rows for b in emitted] == [50, 50]


def test_dead_letters_go_out_as_an_output_port_emits_a_table():
    """The error columns (one chunk each) beside rows chunked otherwise: batches follow the
    heaviest column, the error text, not every boundary of the rows."""
    from weir.operators.dead_letters import ERRORS_PORT, DeadLetters
    from weir.operators.operator import Operator

    rows = pa.table({"n": _chunked(list(range(100)), [10] * 10, pa.int64())})
    emitted: list[tuple[str, pa.RecordBatch]] = []
    operator = Operator()
    operator.connect_outputs(lambda port, batch: emitted.append((port, batch)))
    DeadLetters(operator, "parse", max_rows=1000).set_aside(
        rows, ValueError("a long explanation of what is wrong with these rows"), "input", 7)
    assert [(port, b.num_rows) for port, b in emitted] == [(ERRORS_PORT, 100)]
    assert emitted[0][1].column(0).to_pylist() == list(range(100))

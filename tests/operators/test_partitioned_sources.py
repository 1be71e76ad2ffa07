"""Sources that split their input between partitions: every line read by exactly one
partition, whatever the count, and the plan refuses to partition a source that does not."""

from __future__ import annotations

import pytest

from tests.operators.test_library import TEXT, Emitted, expected_lines, run_source
from weir.master.physical_plan import PlanError
from weir.master.planner import build_physical_plan
from weir.operators import Dag
from weir.operators.library import DirectorySource, TextFileSource
from weir.operators.operator import Operator, OperatorContext
from weir.operators.testing import CollectSink, ListSource


def start_partition(op: Operator, index: int, count: int) -> Emitted:
    emitted = Emitted()
    op.connect_outputs(emitted)
    op.setup(OperatorContext(name="source", operator_id=1 + index, container_id="c0",
                             attributes={}, partition_index=index, partition_count=count))
    return emitted


@pytest.mark.parametrize("count", [1, 2, 3, 7, 200])
def test_text_file_partitions_read_every_line_exactly_once(tmp_path, count):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    lines: list[str] = []
    for index in range(count):
        source = TextFileSource(path, lines_per_window=5)
        emitted = start_partition(source, index, count)
        run_source(source, emitted)
        source.teardown()
        lines += [row["line"] for row in emitted.rows()]
    assert lines == expected_lines(TEXT)  # in file order: partition i reads range i


def test_a_restored_text_file_partition_resumes_inside_its_range(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    whole = TextFileSource(path, lines_per_window=3)
    emitted = start_partition(whole, 1, 2)
    run_source(whole, emitted)
    reference = [row["line"] for row in emitted.rows()]

    first = TextFileSource(path, lines_per_window=3)
    emitted = start_partition(first, 1, 2)
    first.begin_window(1)
    first.emit_tuples()
    first.end_window()
    taken = [row["line"] for row in emitted.rows()]
    again = TextFileSource(path, lines_per_window=3)  # as restored from a checkpoint
    again.position, again.line_number, again.end = first.position, first.line_number, first.end
    first.teardown()
    emitted = start_partition(again, 1, 2)
    run_source(again, emitted)
    assert len(taken) == 3 and taken + [row["line"] for row in emitted.rows()] == reference
    assert again.position == again.end == len(TEXT.encode())


def test_directory_partitions_share_the_files_by_name(tmp_path):
    for i in range(12):
        (tmp_path / f"part-{i:02d}.txt").write_text(f"file {i}\n")
    seen: list[str] = []
    for index in range(3):
        source = DirectorySource(tmp_path)
        emitted = start_partition(source, index, 3)
        run_source(source, emitted)
        source.teardown()
        mine = [row["line"] for row in emitted.rows()]
        assert mine, f"partition {index} got no file"
        seen += mine
    assert sorted(seen) == sorted(f"file {i}" for i in range(12))


def test_only_sources_that_split_their_input_may_be_partitioned():
    dag = Dag("split", CONTAINERS=2)
    source = dag.add_operator("source", TextFileSource("/nonexistent"), PARTITIONS=2)
    sink = dag.add_operator("sink", CollectSink())
    dag.add_stream("lines", source.output, sink.input)
    plan = build_physical_plan(dag.to_descriptor(), {}, "app")
    names = [op.name for op in plan.operators.values()]
    assert names == ["source#0", "source#1", "source#unifier", "sink"]
    assert [op.partition_index for op in plan.operators.values()][:2] == [0, 1]

    dag = Dag("nosplit", CONTAINERS=2)
    source = dag.add_operator("source", ListSource([[{"x": 1}]]), PARTITIONS=2)
    sink = dag.add_operator("sink", CollectSink())
    dag.add_stream("rows", source.output, sink.input)
    with pytest.raises(PlanError, match="does not split its input: each partition would "
                                        "emit all of it"):
        build_physical_plan(dag.to_descriptor(), {}, "app")

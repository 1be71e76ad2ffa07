"""Savepoint manifests and how a DAG is matched to one (no processes)."""

from __future__ import annotations

import pytest

from weir.operators import Dag
from weir.operators.testing import CollectSink, ListSource
from weir.storage.savepoints import (
    Manifest,
    SavedOperator,
    SavedPartition,
    SavepointError,
    check_unused,
    match,
    read_manifest,
    write_manifest,
)

SOURCE = "weir.operators.testing.ListSource"
SINK = "weir.operators.testing.CollectSink"


def manifest() -> Manifest:
    return Manifest(window=(1_700_000_000 << 32) + 41, app_name="wc",
                    application_id="app-0001", operators=[
                        SavedOperator("source", SOURCE, [SavedPartition(1, 40)]),
                        SavedOperator("sink", SINK, [SavedPartition(2, 41)])])


def dag(sink: str, sink_class: type = CollectSink) -> Dag:
    d = Dag("wc")
    source = d.add_operator("source", ListSource([[{"x": 1}]]))
    d.add_stream("rows", source.output, d.add_operator(sink, sink_class()).input)
    return d


def test_a_written_manifest_reads_back_and_marks_the_savepoint_used(tmp_path):
    path = str(tmp_path / "sp")
    check_unused(path)
    (tmp_path / "sp").mkdir()
    write_manifest(path, manifest())
    assert read_manifest(path) == manifest()
    with pytest.raises(SavepointError, match="already holds a savepoint; name a new folder"):
        check_unused(path)


def test_a_folder_without_a_manifest_is_not_a_savepoint(tmp_path):
    with pytest.raises(SavepointError, match="holds no savepoint.json: it is not a savepoint, "
                                             "or one that did not complete"):
        read_manifest(str(tmp_path))


def test_the_same_dag_keeps_every_operator():
    matched = match(dag("sink").to_descriptor(with_payload=False), manifest())
    assert (matched.kept, matched.new, matched.dropped) == (["source", "sink"], [], [])
    assert matched.refusal(allow_dropped=False) is None


def test_a_renamed_sink_is_new_and_its_old_name_dropped_which_must_be_allowed():
    matched = match(dag("published").to_descriptor(with_payload=False), manifest())
    assert matched.new == ["published"] and matched.dropped == ["sink"]
    refusal = matched.refusal(allow_dropped=False)
    assert refusal is not None and "pass --allow-dropped" in refusal
    assert "dropped sink (its state is not used)" in refusal
    assert matched.refusal(allow_dropped=True) is None


def test_a_changed_class_is_refused_even_when_dropping_is_allowed():
    class OtherSink(CollectSink):
        pass

    matched = match(dag("sink", sink_class=OtherSink).to_descriptor(with_payload=False),
                    manifest())
    assert [name for name, _, _ in matched.class_changed] == ["sink"]
    refusal = matched.refusal(allow_dropped=True)
    assert refusal is not None and "changed class" in refusal


def test_a_changed_partition_count_is_kept_and_said():
    matched = match(dag("sink").to_descriptor(with_payload=False), manifest(),
                    partitions={"source": 1, "sink": 3})
    assert matched.repartitioned == [("sink", 1, 3)]
    assert any("1 -> 3 partitions" in line for line in matched.lines())

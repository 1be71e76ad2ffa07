"""What was pickled before a module moved still loads: a checkpoint or savepoint whose
state names ``operators.durable.…`` (written by an earlier Weir), and a journal record."""

from __future__ import annotations

import pickle

import pytest

from weir.storage import moved
from weir.storage.commit_steps import PublishFile
from weir.storage.savepoint_manifest import Manifest, SavedOperator, SavedPartition


def renamed(data: bytes, new: str, old: str) -> bytes:
    """``data`` as an earlier Weir wrote it: module ``new`` named ``old`` (protocol 0
    names modules as text lines, so the lengths may differ)."""
    assert new.encode() in data
    return data.replace(new.encode(), old.encode())


def test_a_state_naming_the_old_durable_package_loads_as_the_new_class():
    step = PublishFile("/stage/part-1", "/out/part-1")
    old = renamed(pickle.dumps({"pending": [step]}, protocol=0), "weir.storage.commit_steps",
                  "operators.durable.commit_steps")
    loaded = moved.loads(old)
    assert loaded == {"pending": [step]} and type(loaded["pending"][0]) is PublishFile


def test_a_journaled_manifest_naming_the_old_savepoints_module_loads():
    manifest = Manifest(window=7, app_name="wc", application_id="app-0001", operators=[
        SavedOperator("count", "weir.operators.library.RunningCount", [SavedPartition(2, 7)])])
    data = pickle.dumps(manifest, protocol=0)
    old = renamed(data, "weir.storage.savepoint_manifest", "operators.savepoints")
    assert moved.loads(old) == manifest


@pytest.mark.parametrize(("old", "new"), [
    ("operators.durable", "weir.storage"), ("operators.durable.records", "weir.storage.records"),
    ("operators.savepoints", "weir.storage.savepoints"),
    ("operators.operator_state", "weir.runtime.operator_state"),
    ("operators.ports", "weir.operators.ports"), ("operators.durablex", "weir.operators.durablex"),
    ("storage.records", "weir.storage.records"), ("weir.storage", "weir.storage"),
    ("masterful", "masterful"), ("numpy.core", "numpy.core")])
def test_module_names_map_by_whole_components(old, new):
    assert moved.current_module(old) == new


def test_a_savepoint_of_a_class_under_its_old_module_path_matches_its_operator():
    """A savepoint written before the parts became ``weir.*`` names its classes by their old
    paths: the operator keeps its state, it did not change class."""
    from weir.operators import Dag
    from weir.operators.testing import CollectSink, ListSource
    from weir.storage.savepoint_manifest import match

    dag = Dag("wc")
    source = dag.add_operator("source", ListSource([[1]]))
    sink = dag.add_operator("sink", CollectSink())
    dag.add_stream("s", source.output, sink.input)
    manifest = Manifest(window=7, app_name="wc", application_id="app-0001", operators=[
        SavedOperator("source", "operators.testing.ListSource", [SavedPartition(1, 7)]),
        SavedOperator("sink", "operators.library.RunningCount", [SavedPartition(2, 7)])])
    result = match(dag.to_descriptor(), manifest)
    assert result.kept == ["source"]
    assert [name for name, *_ in result.class_changed] == ["sink"]

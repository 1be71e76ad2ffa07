"""What was pickled before a module moved still loads: a checkpoint or savepoint whose
state names ``operators.durable.…`` (written by an earlier Weir), and a journal record."""

from __future__ import annotations

import pickle

import pytest

from storage import moved
from storage.commit_steps import PublishFile
from storage.savepoint_manifest import Manifest, SavedOperator, SavedPartition


def renamed(data: bytes, new: str, old: str) -> bytes:
    """``data`` as an earlier Weir wrote it: module ``new`` named ``old`` (protocol 0
    names modules as text lines, so the lengths may differ)."""
    assert new.encode() in data
    return data.replace(new.encode(), old.encode())


def test_a_state_naming_the_old_durable_package_loads_as_the_new_class():
    step = PublishFile("/stage/part-1", "/out/part-1")
    old = renamed(pickle.dumps({"pending": [step]}, protocol=0), "storage.commit_steps",
                  "operators.durable.commit_steps")
    loaded = moved.loads(old)
    assert loaded == {"pending": [step]} and type(loaded["pending"][0]) is PublishFile


def test_a_journaled_manifest_naming_the_old_savepoints_module_loads():
    manifest = Manifest(window=7, app_name="wc", application_id="app-0001", operators=[
        SavedOperator("count", "operators.library.RunningCount", [SavedPartition(2, 7)])])
    data = pickle.dumps(manifest, protocol=0)
    old = renamed(data, "storage.savepoint_manifest", "operators.savepoints")
    assert moved.loads(old) == manifest


@pytest.mark.parametrize(("old", "new"), [
    ("operators.durable", "storage"), ("operators.durable.records", "storage.records"),
    ("operators.savepoints", "storage.savepoints"),
    ("operators.operator_state", "runtime.operator_state"),
    ("operators.ports", "operators.ports"), ("operators.durablex", "operators.durablex")])
def test_module_names_map_by_whole_components(old, new):
    assert moved.current_module(old) == new

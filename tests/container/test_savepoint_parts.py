"""Savepoint parts in a container: an operator's part is its last checkpoint and its
durable folder; a new run's operator takes one part as it is (folder included), or merges
several (a new partition count), which a part with a durable folder refuses."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import cloudpickle
import pytest

from weir.container.buffer_server import BufferServer
from weir.container.checkpoint_store import CheckpointStore
from weir.container.deploy import DeployError, Deployment
from weir.container.savepoint_parts import SavedParts, write_part
from weir.operators.operator import Operator
from weir.operators.ports import InputPort
from weir.proto import plan_pb2
from weir.runtime.operator_state import capture

WINDOW = (1_700_000_000 << 32) + 40


class Totals(Operator):
    input = InputPort()
    KEYED_STATE: ClassVar[tuple[str, ...]] = ("totals",)

    def __init__(self, totals: dict[str, int] | None = None) -> None:
        self.totals = dict(totals or {})


def old_run(tmp_path, parts: dict[int, dict[str, int]], durable: set[int] = frozenset()):
    """An old run's state folder with each operator's checkpoint at WINDOW (and a durable
    folder for those in ``durable``), and the savepoint written from it."""
    store = CheckpointStore(str(tmp_path / "old"))
    savepoint = str(tmp_path / "savepoint")
    for operator_id, totals in parts.items():
        store.save(operator_id, WINDOW, capture(Totals(totals)))
        folder = tmp_path / "old" / "operators" / str(operator_id)
        if operator_id in durable:
            folder.mkdir(parents=True)
            (folder / "store.db").write_text(f"store of {operator_id}")
        write_part(store, operator_id, WINDOW, str(folder), savepoint)
    return savepoint


def seeded(savepoint: str, from_ids: list[int]) -> plan_pb2.OperatorDeployInfo:
    return plan_pb2.OperatorDeployInfo(
        id=1, name="totals", type=plan_pb2.OPERATOR_TYPE_GENERIC, class_name="Totals",
        payload=cloudpickle.dumps(Totals()), generation=1,
        checkpoint=plan_pb2.Checkpoint(window_id=WINDOW),
        seed=plan_pb2.StateSeed(from_node_ids=from_ids, window_id=WINDOW,
                                savepoint_path=savepoint))


@pytest.fixture
def deployment(tmp_path):
    deployment = Deployment("app-0002", "app-0002-c0", BufferServer(), None, 0,  # type: ignore[arg-type]
                            {"STATE_DIR": str(tmp_path / "new")}, on_change=lambda: None)
    yield deployment
    deployment.stop_all()


def test_a_part_is_the_last_checkpoint_and_the_durable_folder(tmp_path):
    savepoint = old_run(tmp_path, {7: {"a": 1}}, durable={7})
    parts = SavedParts(savepoint)
    assert parts.has_durable_dir(7)
    assert (tmp_path / "savepoint" / "operators" / "7" / "store.db").read_text() == \
        "store of 7"
    assert CheckpointStore(savepoint).windows(7) == [WINDOW]


def test_one_part_is_taken_whole_with_its_folder_and_saved_as_the_first_checkpoint(
        tmp_path, deployment):
    savepoint = old_run(tmp_path, {7: {"a": 1, "b": 2}}, durable={7})
    operator = deployment._build(seeded(savepoint, [7]), WINDOW)
    assert operator.totals == {"a": 1, "b": 2}
    assert (Path(deployment.folders.operator_dir(1)) / "store.db").read_text() == "store of 7"
    assert deployment.store.windows(1) == [WINDOW]  # built once: a redeploy restores it


def test_several_parts_are_merged_by_key(tmp_path, deployment):
    savepoint = old_run(tmp_path, {7: {"a": 1}, 8: {"b": 2}})
    assert deployment._build(seeded(savepoint, [7, 8]), WINDOW).totals == {"a": 1, "b": 2}


def test_parts_with_durable_folders_cannot_be_merged(tmp_path, deployment):
    savepoint = old_run(tmp_path, {7: {"a": 1}, 8: {"b": 2}}, durable={8})
    with pytest.raises(DeployError, match=r"partitions \[8\] in the savepoint kept state in "
                                          "their local folders"):
        deployment._build(seeded(savepoint, [7, 8]), WINDOW)

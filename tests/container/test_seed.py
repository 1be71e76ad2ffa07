"""A partition made by a repartition: its container builds its first checkpoint from the old
partitions' checkpoints (keyed state merged and cut to its keys), once, and deletes the old
partitions' checkpoints after the commit."""

from __future__ import annotations

import cloudpickle
import pyarrow as pa
import pytest

from weir.container.deploy import DeployError, Deployment
from weir.operators.operator import Operator
from weir.operators.partitioning import PartitionFilter, partition_keys
from weir.operators.ports import InputPort
from weir.proto import plan_pb2
from weir.runtime.operator_state import capture

pytestmark = pytest.mark.timeout(60)

KEYS = [f"key{i}" for i in range(200)]


class Totals(Operator):
    KEYED_STATE = ("totals",)
    input = InputPort()

    def __init__(self, totals: dict[str, int] | None = None, label: str = "") -> None:
        self.totals = dict(totals or {})
        self.label = label


class NoBuffers:
    def purge_all(self, window_id: int) -> None:
        pass


@pytest.fixture
def deployment(tmp_path):
    return Deployment("app-0001", "app-0001-c1", NoBuffers(), None, 0,  # type: ignore[arg-type]
                      {"STATE_DIR": str(tmp_path)}, lambda: None)


def seeded_info(op_id: int, index: int, count: int, from_ids=(2, 3), retired=(2, 3, 4),
                window: int = 40) -> plan_pb2.OperatorDeployInfo:
    mask, keys = partition_keys(count)
    info = plan_pb2.OperatorDeployInfo(id=op_id, name=f"totals#{index}", class_name="Totals",
                                       payload=cloudpickle.dumps(Totals(label="payload")),
                                       checkpoint=plan_pb2.Checkpoint(window_id=window))
    info.seed.window_id = window
    info.seed.from_node_ids.extend(from_ids)
    info.seed.retired_node_ids.extend(retired)
    info.seed.key_column, info.seed.mask = "k", mask
    info.seed.keys.extend(sorted(keys[index]))
    return info


def old_partitions(deployment: Deployment) -> dict[str, int]:
    """Two old partitions' checkpoints at window 40, split by the 2-partition keys."""
    mask, keys = partition_keys(2)
    everything = {key: n + 1 for n, key in enumerate(KEYS)}
    for index, op_id in enumerate((2, 3)):
        share = PartitionFilter("k", mask, keys[index])
        mine = {k: v for k, v, kept in zip(everything, everything.values(),
                                           share.owns(list(everything)), strict=True) if kept}
        deployment.store.save(op_id, 40, capture(Totals(mine, label=f"old{index}")))
    return everything


def test_each_new_partition_takes_exactly_the_keys_whose_rows_it_will_get(deployment):
    everything = old_partitions(deployment)
    built = [deployment._build(seeded_info(10 + i, i, 4), 40) for i in range(4)]

    merged: dict[str, int] = {}
    for operator in built:
        assert not merged.keys() & operator.totals.keys()
        merged.update(operator.totals)
        assert operator.label == "old0"  # other attributes: the first old partition's
    assert merged == everything
    batch = pa.record_batch({"k": KEYS})
    mask, keys = partition_keys(4)
    for index, operator in enumerate(built):
        rows = PartitionFilter("k", mask, keys[index]).select(batch).column("k").to_pylist()
        assert sorted(rows) == sorted(operator.totals)
    # saved as each partition's own first checkpoint
    assert all(deployment.store.windows(10 + i) == [40] for i in range(4))


def test_a_redeploy_restores_its_own_first_checkpoint_instead_of_merging_again(deployment):
    old_partitions(deployment)
    deployment._build(seeded_info(10, 0, 4), 40)
    deployment.store.delete(2)  # the old partitions may be gone by now
    again = deployment._build(seeded_info(10, 0, 4), 40)
    assert again.totals and again.label == "old0"


def test_one_partition_takes_every_key_and_missing_or_clashing_state_is_an_error(deployment):
    everything = old_partitions(deployment)
    info = seeded_info(10, 0, 4)
    info.seed.key_column = ""
    assert deployment._build(info, 40).totals == everything

    with pytest.raises(DeployError, match="cannot take the state of partitions") as caught:
        deployment._build(seeded_info(11, 0, 4, from_ids=(2, 9)), 40)
    assert not caught.value.fatal  # storage may come back
    deployment.store.save(5, 40, capture(Totals({"key1": 1})))
    with pytest.raises(DeployError, match="in two old partitions") as caught:
        deployment._build(seeded_info(12, 0, 4, from_ids=(2, 3, 5)), 40)
    assert caught.value.fatal


def test_a_unifier_made_by_a_repartition_starts_from_its_payload(deployment):
    info = seeded_info(20, 0, 4, from_ids=())
    info.seed.key_column = ""
    assert deployment._build(info, 40).label == "payload"
    assert deployment.store.windows(20) == [40]


def test_the_old_partitions_checkpoints_go_once_the_commit_passes_the_seed(deployment):
    old_partitions(deployment)
    deployment._build(seeded_info(10, 0, 4), 40)
    deployment.committed(40)
    assert deployment.store.windows(2) == [40]
    deployment.committed(41)
    assert deployment.store.windows(2) == []
    assert deployment.store.windows(3) == []
    assert deployment.store.windows(10) == [40]


def test_a_later_deploy_builds_nothing_but_still_deletes_the_retired_checkpoints(deployment):
    old_partitions(deployment)
    deployment.store.save(10, 60, capture(Totals({"key1": 5}, label="own")))
    info = seeded_info(10, 0, 4)  # redeployed from its own checkpoint at 60, past the seed
    info.checkpoint.window_id = 60
    assert deployment._build(info, 60).label == "own"
    assert deployment.store.windows(10) == [60]  # no seed was built at 40
    deployment.committed(61)
    assert deployment.store.windows(2) == []

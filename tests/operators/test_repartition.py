"""Merging keyed state into new partitions: mappings and Arrow tables, the types kept, the
errors, and an operator's own ``repartitioned``."""

from __future__ import annotations

import collections

import pyarrow as pa
import pytest

from weir.operators.keyed_state import RepartitionError, merge_keyed_state
from weir.operators.library import RunningCount
from weir.operators.operator import Operator
from weir.operators.partitioning import PartitionFilter, partition_keys
from weir.operators.state_store import StoreError, StoreHandle
from weir.runtime.operator_state import new_partition


def shares(count: int) -> list[PartitionFilter]:
    mask, keys = partition_keys(count)
    return [PartitionFilter("word", mask, k) for k in keys]


def test_arrow_tables_are_cut_by_the_partition_key_column_like_the_stream():
    old = [pa.table({"word": ["a", "b"], "count": [1, 2]}),
           pa.table({"word": ["c", "d"], "count": [3, 4]})]
    parts = [merge_keyed_state(old, share, "totals") for share in shares(3)]
    rows = sorted(row for part in parts for row in zip(part["word"].to_pylist(),
                                                       part["count"].to_pylist(), strict=True))
    assert rows == [("a", 1), ("b", 2), ("c", 3), ("d", 4)]
    for share, part in zip(shares(3), parts, strict=True):
        batch = pa.record_batch({"word": ["a", "b", "c", "d"]})
        assert sorted(part["word"].to_pylist()) == \
            sorted(share.select(batch)["word"].to_pylist())
    with pytest.raises(RepartitionError, match="partition key column 'word'"):
        merge_keyed_state([pa.table({"key": ["a"]})], shares(2)[0], "totals")


def test_mappings_keep_their_type_and_a_key_in_two_partitions_is_refused():
    merged = merge_keyed_state([collections.Counter(a=1), collections.Counter(b=2)], None, "t")
    assert merged == {"a": 1, "b": 2} and isinstance(merged, collections.Counter)
    with pytest.raises(RepartitionError, match="in two old partitions"):
        merge_keyed_state([{"a": 1}, {"a": 2}], None, "t")
    with pytest.raises(RepartitionError, match="mapping by key or an Arrow table"):
        merge_keyed_state([[1, 2]], None, "t")
    assert merge_keyed_state([None, None], None, "t") is None


def test_running_count_partitions_name_the_old_stores_and_their_share():
    old = []
    for index in range(2):
        op = RunningCount(key="word")
        op.state = StoreHandle(f"/state/{index}/running-count.sqlite", 10 + index)
        old.append(op)
    new = [new_partition(old, share) for share in shares(4)]
    for op, share in zip(new, shares(4), strict=True):
        assert op is not old[0] and op.state.seed is not None
        assert op.state.seed.sources == (("/state/0/running-count.sqlite", 10),
                                         ("/state/1/running-count.sqlite", 11))
        assert PartitionFilter.from_json(op.state.seed.share) == share
    legacy = RunningCount(key="word")
    legacy.totals = pa.table({"word": ["a"], "count": [1]})
    with pytest.raises(StoreError, match="predates the keyed store"):
        new_partition([legacy], shares(2)[0])


class Total(Operator):
    """A total over every key: the default cannot split it, so it overrides the hook."""

    def __init__(self, total: int) -> None:
        self.total = total

    def repartitioned(self, partitions, share):
        self.total = sum(p.total for p in partitions) if share is None else 0
        return self


def test_an_operator_can_split_its_state_its_own_way():
    assert new_partition([Total(3), Total(4)], None).total == 7
    assert new_partition([Total(3), Total(4)], shares(2)[0]).total == 0
    with pytest.raises(RepartitionError, match="at least one"):
        new_partition([], None)

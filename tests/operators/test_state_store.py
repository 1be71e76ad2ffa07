"""The keyed store without Spark: apply, undo to a checkpoint, commit, time-to-live, a
restore after a simulated crash (the process gone, the file reopened), and repartitions
that split and merge stores by the partition key like the stream."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from weir.operators.partitioning import PartitionFilter, partition_keys
from weir.operators.state_store import KeyedStore, StoreError


def shares(count: int) -> list[PartitionFilter]:
    mask, keys = partition_keys(count)
    return [PartitionFilter("word", mask, k) for k in keys]


def test_apply_adds_deltas_and_returns_the_new_totals_of_the_touched_keys(tmp_path):
    store = KeyedStore(str(tmp_path / "s.sqlite"))
    assert sorted(zip(*store.apply(10, ["a", "b"], [1, 2]), strict=True)) == [("a", 1), ("b", 2)]
    assert sorted(zip(*store.apply(11, ["b", "c"], [5, 1]), strict=True)) == [("b", 7), ("c", 1)]
    assert sorted(store.items()) == [("a", 1), ("b", 7), ("c", 1)]
    assert store.applied == 11 and store.keys == 3
    with pytest.raises(StoreError, match="not after the last applied window 11"):
        store.apply(11, ["a"], [1])
    assert store.apply(12, [], []) == ([], [])


def test_restore_undoes_the_windows_after_a_checkpoint_and_commit_forgets_them(tmp_path):
    store = KeyedStore(str(tmp_path / "s.sqlite"))
    store.apply(1, ["a", "b"], [1, 1])
    store.apply(2, ["a", "c"], [1, 1])
    store.apply(3, ["a", "d"], [1, 1])
    store.restore_to(1)
    assert sorted(store.items()) == [("a", 1), ("b", 1)] and store.applied == 1
    assert store.keys == 2
    store.apply(2, ["a", "c"], [1, 1])  # the replay
    store.apply(3, ["a", "d"], [1, 1])
    store.committed(2)
    store.restore_to(2)
    assert sorted(store.items()) == [("a", 2), ("b", 1), ("c", 1)]
    store.committed(2)
    store.restore_to(1)  # the undo log up to 2 is gone: 2 stays
    assert sorted(store.items()) == [("a", 2), ("b", 1), ("c", 1)]


def test_ttl_drops_keys_not_updated_for_that_long_and_the_drop_undoes_too(tmp_path):
    store = KeyedStore(str(tmp_path / "s.sqlite"), ttl_windows=2)
    store.apply(1, ["a", "b"], [1, 1])
    store.apply(2, ["b"], [1])
    store.apply(3, ["c"], [1])  # a: last seen at 1, 3 - 2 >= 1: gone
    assert sorted(store.items()) == [("b", 2), ("c", 1)] and store.keys == 2
    store.apply(4, ["a"], [5])  # b expires; a starts again
    assert sorted(store.items()) == [("a", 5), ("c", 1)]
    store.restore_to(2)
    assert sorted(store.items()) == [("a", 1), ("b", 2)] and store.keys == 2


def test_fetch_finds_every_held_key_across_its_in_list_chunks_and_skips_expired_ones(tmp_path):
    store = KeyedStore(str(tmp_path / "s.sqlite"), ttl_windows=2)
    held = [f"k{i}".encode() for i in range(0, 70_000, 2)]  # more than two chunks asked
    store.put(1, [(k, b"v" + k, True) for k in held])
    store.put(2, [(b"fresh", b"f", True), (b"pinned", b"p", False)])
    asked = [f"k{i}".encode() for i in range(70_000)] + [b"fresh", b"pinned", b"none"]
    assert store.fetch(asked) == {**{k: b"v" + k for k in held}, b"fresh": b"f",
                                  b"pinned": b"p"}
    # window 3's put expires what window 1 wrote (3 - 2 >= 1); rows put never to expire stay
    assert store.fetch(asked, window_id=3) == {b"fresh": b"f", b"pinned": b"p"}


def test_put_sets_and_deletes_across_its_insert_chunks_and_counts_keys_exactly(tmp_path):
    store = KeyedStore(str(tmp_path / "s.sqlite"))
    rows = [(f"k{i:05}".encode(), i, False) for i in range(4_501)]  # three insert chunks
    store.put(1, rows)
    assert store.keys == 4_501 and store.fetch([b"k04500"]) == {b"k04500": 4_500}
    # a new key, a changed one, a deleted one and a deletion of a key it does not hold
    store.put(2, [(b"k00000", None, False), (b"k00001", 10, False), (b"new", 1, False),
                  (b"never", None, False)])
    assert store.keys == 4_501 and store.fetch([b"k00000", b"k00001", b"new", b"never"]) \
        == {b"k00001": 10, b"new": 1}
    store.restore_to(1)
    assert store.keys == 4_501 and store.fetch([b"k00000", b"k00001", b"new"]) \
        == {b"k00000": 0, b"k00001": 1}


def test_keys_through_finds_the_range_keys_whose_value_is_at_most_the_bound(tmp_path):
    store = KeyedStore(str(tmp_path / "s.sqlite"))
    store.put(1, [(b"sa", 5, False), (b"sb", 9, False), (b"sc", 3, False), (b"tz", 1, False)])
    assert store.keys_through(b"s", b"t", 5) == [b"sa", b"sc"]
    assert store.keys_through(b"s", b"t", 2) == []


def test_fetch_takes_keys_of_several_types_that_do_not_sort_together(tmp_path):
    store = KeyedStore(str(tmp_path / "s.sqlite"))
    store.put(1, [(7, b"int", True), ("a", b"text", True), (b"a", b"bytes", True)])
    assert store.fetch([b"a", 7, "a", 8]) == {7: b"int", "a": b"text", b"a": b"bytes"}


CRASH = """
import os, sys
from weir.operators.state_store import KeyedStore
store = KeyedStore(sys.argv[1])
store.apply(1, ["a", "b"], [1, 1]); store.sync()  # the checkpoint at 1
store.apply(2, ["a", "c"], [1, 1])
store.apply(3, ["a"], [1])
os.kill(os.getpid(), 9)
"""


def test_a_killed_process_leaves_a_store_that_restores_to_its_checkpoint(tmp_path):
    path = str(tmp_path / "s.sqlite")
    done = subprocess.run([sys.executable, "-c", CRASH, path], cwd=Path(__file__).parents[2],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -9, done.stderr
    store = KeyedStore(path)
    assert store.applied == 3 and store.get("a") == 3  # committed windows survive a kill
    store.restore_to(1)
    assert sorted(store.items()) == [("a", 1), ("b", 1)]
    store.apply(2, ["a", "c"], [1, 1])  # replayed exactly once
    assert sorted(store.items()) == [("a", 2), ("b", 1), ("c", 1)]


def _old_stores(tmp_path, count: int) -> list[tuple[str, int]]:
    """``count`` partitions' stores of the words a..z, each holding its share, checkpointed
    at window 2 and then one more window (3) that the new partitions must not see."""
    words = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    sources = []
    for index, share in enumerate(shares(count)):
        mine = [w for w, kept in zip(words, share.owns(words), strict=True) if kept]
        path = str(tmp_path / f"old{index}.sqlite")
        store = KeyedStore(path)
        store.apply(1, mine, [1] * len(mine))
        store.apply(2, mine, [ord(w) for w in mine])
        store.apply(3, mine, [1000] * len(mine))  # after the checkpoint
        store.close()
        sources.append((path, 2))
    return sources


@pytest.mark.parametrize(("old", "new"), [(2, 4), (4, 2), (3, 1)])
def test_a_repartition_gives_each_new_store_exactly_its_keys_as_of_the_checkpoint(
        tmp_path, old, new):
    sources = _old_stores(tmp_path, old)
    cuts = shares(new) if new > 1 else [None]
    parts = []
    for index, cut in enumerate(cuts):
        store = KeyedStore(str(tmp_path / f"new{index}.sqlite"))
        store.seed_from(sources, cut.owns if cut is not None else None)
        store.seed_from(sources, cut.owns if cut is not None else None)  # a retry: once
        parts.append(store)
        if cut is not None:
            keys = [k for k, _ in store.items()]
            assert all(cut.owns(keys))
    merged = sorted(item for store in parts for item in store.items())
    assert merged == [(chr(c), 1 + c) for c in range(ord("a"), ord("z") + 1)]
    assert all(store.applied == 2 for store in parts)


def test_a_seed_from_a_store_on_another_machine_is_a_clear_error(tmp_path):
    store = KeyedStore(str(tmp_path / "new.sqlite"))
    with pytest.raises(StoreError, match="not on this machine"):
        store.seed_from([(str(tmp_path / "elsewhere.sqlite"), 2)], None)
    assert not os.path.exists(tmp_path / "elsewhere.sqlite")

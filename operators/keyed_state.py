"""Keyed state moved between partitions when an operator is repartitioned at run time.

Apex hands the old partitions, restored from their checkpoints, to the operator's
partitioner, which makes the new ones. In Weir the container that first deploys a new
partition builds it: it restores every old partition from its checkpoint at the window
the new partitions start from, and ``Operator.repartitioned`` merges them and keeps the
keys the new partition owns (``KEYED_STATE``: mappings by key, or Arrow tables with the
key column). Keys hash exactly as the buffer server splits the stream
(``operators.partitioning``), so each key's state lands where its rows will arrive.

>>> from weir.operators.partitioning import PartitionFilter
>>> share = PartitionFilter("word", 3, frozenset({0, 1}))
>>> other = PartitionFilter("word", 3, frozenset({2, 3}))
>>> old = [{"a": 1, "b": 2}, {"c": 3}]
>>> mine, theirs = merge_keyed_state(old, share, "totals"), merge_keyed_state(old, other, "t")
>>> sorted(mine | theirs), set(mine) & set(theirs)
(['a', 'b', 'c'], set())
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from weir.operators.partitioning import PartitionFilter

__all__ = ["RepartitionError", "merge_keyed_state"]

class RepartitionError(ValueError):
    """Old partitions' states cannot be merged into a new partition; says what and why."""


def merge_keyed_state(values: Sequence[Any], share: PartitionFilter | None, where: str) -> Any:
    """One ``KEYED_STATE`` attribute of a new partition from the old partitions' values.

    Mappings are united (a key held by two old partitions is an error: keyed state
    belongs to one partition); Arrow tables are concatenated. Then only the keys of
    ``share`` are kept (all of them when ``share`` is None); a table's keys are in its
    ``share.column`` column.

    Raises:
        RepartitionError: a value is neither a mapping nor an Arrow table, a key is in
            two partitions, or a table has no key column.
    """
    present = [v for v in values if v is not None]
    if not present:
        return None
    if all(isinstance(v, Mapping) for v in present):
        merged: dict[Any, Any] = {}
        for value in present:
            twice = merged.keys() & value.keys()
            if twice:
                raise RepartitionError(
                    f"{where}: keys {sorted(map(repr, twice))[:5]} are in two old partitions; "
                    "keyed state must be split by the partition key (PARTITION_KEY)")
            merged.update(value)
        if share is not None and merged:
            keys = list(merged)
            keep = share.owns(keys)
            merged = {key: merged[key] for key, kept in zip(keys, keep, strict=True) if kept}
        return _like(present[0], merged)
    if all(isinstance(v, pa.Table | pa.RecordBatch) for v in present):
        table = pa.concat_tables([pa.Table.from_batches([v]) if isinstance(v, pa.RecordBatch)
                                  else v for v in present], promote_options="permissive")
        if share is None:
            return table
        if share.column not in table.column_names:
            raise RepartitionError(
                f"{where}: an Arrow table of keyed state needs the partition key column "
                f"{share.column!r}; its columns are {table.column_names}")
        keep = share.owns(table.column(share.column))
        return table.filter(pa.array(np.asarray(keep), pa.bool_()))
    kinds = sorted({type(v).__name__ for v in present})
    raise RepartitionError(f"{where}: keyed state must be a mapping by key or an Arrow table "
                           f"in every partition, not {kinds}; list only such attributes in "
                           "KEYED_STATE, or override Operator.repartitioned")


def _like(model: Mapping[Any, Any], items: dict[Any, Any]) -> Mapping[Any, Any]:
    """``items`` in a mapping of ``model``'s type (a Counter stays a Counter, a
    defaultdict keeps its factory)."""
    if isinstance(model, MutableMapping):
        result = copy.copy(model)
        result.clear()
        result.update(items)
        return result
    return items

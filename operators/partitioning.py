"""Splitting a stream by key hash, Apex style: a partition takes the rows whose hash bucket
(``hash & mask``) is one of its keys.

The buffer server filters each DATA batch for a subscriber that carries a
``PartitionFilter`` (Apex filters server-side too, so a partition's rows never cross the
network to the others). The hash must be the same in every process, on every host, for
every run: Python's ``hash()`` is salted per process, so it is computed here with numpy,
vectorised over the whole column (no Python per row): strings and binaries get a
polynomial hash over their bytes, numbers a 64-bit mix of their value, and every hash is
finished with splitmix64 so that the low bits (what the mask keeps) are well spread.

>>> import pyarrow as pa
>>> batch = pa.record_batch({"word": ["a", "b", "c", "a"], "n": [1, 2, 3, 4]})
>>> parts = [PartitionFilter("word", 3, frozenset({i})).select(batch) for i in range(4)]
>>> sum(p.num_rows for p in parts)
4
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["PartitionFilter", "hash_column", "partition_keys"]

_PRIME = np.uint64(0x100000001B3)  # FNV-64's prime, as the polynomial's base
_NULL_HASH = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every input bit reaches the low bits the mask keeps."""
    z = values + _NULL_HASH
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _hash_bytes(array: pa.Array) -> np.ndarray:
    """Polynomial hash of each value's bytes (string and binary layouts), mixed with length."""
    offset_type = np.int64 if pa.types.is_large_string(array.type) or \
        pa.types.is_large_binary(array.type) else np.int32
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=offset_type)[array.offset:
                                                           array.offset + len(array) + 1]
    offsets = offsets.astype(np.int64)
    start, end = int(offsets[0]), int(offsets[-1])
    data = np.frombuffer(buffers[2], dtype=np.uint8)[start:end] if buffers[2] is not None \
        else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    relative = offsets - start
    longest = int(lengths.max()) if len(lengths) else 0
    powers = np.ones(max(longest, 1), dtype=np.uint64)
    if longest > 1:
        powers[1:] = np.cumprod(np.full(longest - 1, _PRIME, dtype=np.uint64))
    position = np.arange(end - start, dtype=np.int64) - np.repeat(relative[:-1], lengths)
    terms = (data.astype(np.uint64) + np.uint64(1)) * powers[position]
    sums = np.concatenate([np.zeros(1, np.uint64), np.cumsum(terms, dtype=np.uint64)])
    per_value = sums[relative[1:]] - sums[relative[:-1]]  # wraps mod 2^64, like the sums
    return _splitmix(per_value ^ (lengths.astype(np.uint64) * _MIX1))


def _hash_numbers(array: pa.Array) -> np.ndarray:
    """Integers, booleans, temporals and floats by value (1 and 1.0 differ: types do)."""
    if pa.types.is_floating(array.type):
        values = pc.add(array.cast(pa.float64()), 0.0)  # -0.0 + 0.0 == 0.0: one bucket
        bits = np.asarray(values.fill_null(0.0).to_numpy(zero_copy_only=False),
                          dtype=np.float64).view(np.uint64)
        return _splitmix(bits ^ _MIX2)
    if pa.types.is_boolean(array.type):
        array = array.cast(pa.int64())
    elif pa.types.is_temporal(array.type):
        array = array.view(pa.int64() if array.type.bit_width == 64 else pa.int32())
    ints = np.asarray(array.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False),
                      dtype=np.int64)
    return _splitmix(ints.view(np.uint64))


def hash_column(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A stable 64-bit hash per value (nulls share one), vectorised; the same in every
    process and run, unlike Python's ``hash``.

    Raises:
        TypeError: the type has no hash here (nested types: partition on a plain column).
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    kind = array.type
    if pa.types.is_dictionary(kind):
        hashes = hash_column(array.dictionary)
        indices = np.asarray(array.indices.fill_null(0).to_numpy(zero_copy_only=False))
        out = hashes[indices] if len(hashes) else np.zeros(len(array), np.uint64)
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind) or \
            pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        out = _hash_bytes(array)
    elif pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        out = _hash_bytes(array.cast(pa.large_binary()))
    elif pa.types.is_integer(kind) or pa.types.is_floating(kind) or \
            pa.types.is_boolean(kind) or pa.types.is_temporal(kind):
        out = _hash_numbers(array)
    elif pa.types.is_null(kind):
        out = np.zeros(len(array), np.uint64)
    else:
        raise TypeError(f"partition key of type {kind} cannot be hashed; partition on a "
                        "string, binary, integer, floating-point, boolean or temporal column")
    if array.null_count:
        valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False))
        out = np.where(valid, out, _NULL_HASH)
    return out


def partition_keys(count: int) -> tuple[int, list[frozenset[int]]]:
    """The mask and each of ``count`` partitions' keys (hash buckets).

    Apex gives partitions the buckets of ``hash & mask`` round robin. With the smallest
    mask (the next power of two) three partitions would get 2, 1 and 1 buckets of four;
    16 buckets per partition at least keep the shares within about 1/16 of each other,
    and leave room to split a partition's buckets later.
    """
    if count < 1:
        raise ValueError(f"{count} partitions: need at least one")
    buckets = 1
    while buckets < 16 * count:
        buckets <<= 1
    return buckets - 1, [frozenset(range(i, buckets, count)) for i in range(count)]


@dataclasses.dataclass(frozen=True)
class PartitionFilter:
    """The rows of one partition: those whose key column hashes into one of its ``keys``
    under ``mask``."""

    column: str
    mask: int
    keys: frozenset[int]

    def __post_init__(self) -> None:
        if not self.column:
            raise ValueError("a partition filter needs a key column")
        if self.mask < 0 or any(k < 0 or k > self.mask for k in self.keys):
            raise ValueError(f"partition keys {sorted(self.keys)} do not fit mask {self.mask}")

    def to_json(self) -> dict[str, Any]:
        return {"column": self.column, "mask": self.mask, "keys": sorted(self.keys)}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> PartitionFilter:
        """Parses ``to_json``'s form; raises ValueError or TypeError when it is not that."""
        column, mask, keys = value["column"], value["mask"], value["keys"]
        if not isinstance(column, str) or not isinstance(mask, int) or \
                not all(isinstance(k, int) for k in keys):
            raise TypeError("partition: 'column' must be a string, 'mask' an integer and "
                            "'keys' a list of integers")
        return cls(column, mask, frozenset(keys))

    def buckets_of(self, batch: pa.RecordBatch) -> np.ndarray:
        """Each row's hash bucket (``hash & mask``), to share between the partitions of
        one split: every partition of an operator has the same column and mask.

        Raises:
            KeyError: the batch has no key column.
        """
        index = batch.schema.get_field_index(self.column)
        if index < 0:
            raise KeyError(f"partition key column {self.column!r} is not in the stream's "
                           f"batches (columns {batch.schema.names}); set PARTITION_KEY to one "
                           "of them")
        return self._buckets(batch.column(index))

    def owns_buckets(self, buckets: np.ndarray) -> np.ndarray:
        """A boolean per bucket of ``buckets_of``: whether this partition takes it."""
        if self._table is not None:  # a lookup table beats isin
            return self._table[buckets]
        return np.isin(buckets, np.fromiter(self.keys, np.uint64, len(self.keys)))

    def _buckets(self, array: pa.Array | pa.ChunkedArray) -> np.ndarray:
        buckets = hash_column(array) & np.uint64(self.mask)
        return buckets.astype(np.uint16) if self._table is not None else buckets

    @functools.cached_property
    def _table(self) -> np.ndarray | None:
        """Whether each bucket is this partition's, for masks small enough to tabulate."""
        if self.mask >= 1 << 16:
            return None
        table = np.zeros(self.mask + 1, dtype=bool)
        table[list(self.keys)] = True
        return table

    def mask_of(self, batch: pa.RecordBatch) -> np.ndarray:
        """A boolean per row: whether the row belongs to this partition.

        Raises:
            KeyError: the batch has no key column.
        """
        return self.owns_buckets(self.buckets_of(batch))

    def owns(self, values: Any) -> np.ndarray:
        """A boolean per key value (a sequence, or an Arrow array): whether this
        partition takes it. Hashes like ``mask_of``: a key's state goes where its rows go."""
        array = values if isinstance(values, pa.Array | pa.ChunkedArray) else pa.array(values)
        return self.owns_buckets(self._buckets(array))

    def select(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch's rows of this partition, in their order."""
        return batch.filter(pa.array(self.mask_of(batch), pa.bool_()))

"""Operators whose keyed state lives in a ``KeyedStore`` on local disk (``state_store``).

The store's life is the same for each of them: opened under the operator's own durable
folder at ``setup``; a fresh operator empties it, a recovered one undoes the windows after
its checkpoint, a new partition made by a run-time repartition copies its keys out of the
old partitions' stores (once); fsynced at each checkpoint, its undo log trimmed at each
commit, closed at teardown. The checkpoint holds only a ``StoreHandle``.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any, ClassVar

import numpy as np

from weir.operators.operator import Operator, OperatorContext
from weir.operators.partitioning import PartitionFilter
from weir.operators.ports import SchemaMismatch
from weir.operators.state_store import KeyedStore, StoreError, StoreHandle, StoreSeed

__all__ = ["StoreBacked"]

_LOGGER = logging.getLogger(__name__)

Owns = Callable[[list[Any]], np.ndarray]


class StoreBacked:
    """Mixin for an ``Operator`` keeping its keyed state in a ``KeyedStore``.

    The operator sets ``STORE_FILE`` and calls ``open_store`` from ``setup``; ``state`` (its
    ``StoreHandle``) is checkpointed, ``_store`` is not (add ``STORE_NON_STATE`` to its
    ``NON_STATE``). Its ``checkpointed``, ``committed`` and ``teardown`` should call
    ``store_checkpointed``, ``store_committed`` and ``close_store``.
    """

    STORE_FILE: ClassVar[str] = "state.sqlite"
    STORE_NON_STATE: ClassVar[tuple[str, ...]] = ("_store", "_context", "_scratch")

    state: StoreHandle | None = None

    @property
    def store(self) -> KeyedStore:
        store: KeyedStore | None = self.__dict__.get("_store")
        if store is None:
            raise StoreError(f"{type(self).__name__}: its keyed store is not open (setup "
                             "has not run, or teardown has)")
        return store

    def open_store(self, context: OperatorContext, *, ttl_windows: int | None = None,
                   ttl_millis: int | None = None, owns: Callable[[PartitionFilter], Owns]
                   | None = None) -> KeyedStore:
        """Opens the store and brings it to the state the operator's checkpoint counts on.

        ``owns``: how a partition filter picks this operator's stored keys when a new
        partition copies its share out of the old stores (default: the stored keys are the
        partition key's values).
        """
        path = self._store_path(context)
        if ttl_millis is not None:
            ttl_windows = math.ceil(ttl_millis / context.window_size_millis)
        self._context = context
        store = self._store = KeyedStore(path, ttl_windows)
        handle: StoreHandle | None = self.__dict__.get("state")
        if handle is not None and handle.seed is not None:
            share = handle.seed.share
            cut = PartitionFilter.from_json(share) if share is not None else None
            pick = None if cut is None else (owns(cut) if owns is not None else cut.owns)
            store.seed_from(handle.seed.sources, pick)  # once: a redeploy finds it seeded
            store.restore_to(handle.applied)  # and undoes the windows it applied since
        elif context.recovered_window < 0:
            store.reset()  # fresh: nothing of an earlier run counts
        else:
            store.restore_to(context.recovered_window)
            if handle is not None and store.applied < handle.applied:
                raise StoreError(
                    f"operator {context.name!r}: its store {path} holds windows up to "
                    f"{store.applied}, but its checkpoint counts on {handle.applied} (the "
                    "machine lost writes that were not yet synced); its state cannot be "
                    "recovered exactly")
        self.state = StoreHandle(path, store.applied)
        return store

    def _store_path(self, context: OperatorContext) -> str:
        """The store's file under the operator's own folder (the same for each instance)."""
        if context.state_dir:
            return os.path.join(context.durable_dir(), self.STORE_FILE)
        state_dir = str(context.attributes.get("STATE_DIR") or "")
        kind = type(self).__name__
        if state_dir:
            raise StoreError(
                f"operator {context.name!r}: {kind} keeps its state in a local store "
                f"(sqlite) under STATE_DIR, but STATE_DIR is {state_dir!r}, not a local path; "
                "set STATE_DIR to a local path (or file://...) for this application")
        # no runtime folder at all (unit tests): a scratch one, gone at teardown
        scratch = self._scratch = tempfile.mkdtemp(prefix=f"weir-{kind.lower()}-")
        _LOGGER.warning("operator %s: no STATE_DIR; its state goes to %s and is not durable",
                        context.name, scratch)
        return os.path.join(scratch, self.STORE_FILE)

    def store_applied(self, window_id: int) -> None:
        """Records that the store holds ``window_id`` (after a write of that window)."""
        self.state = StoreHandle(self.store.path, window_id)

    def commit_window(self, window_id: int, changes: dict[Any, Any],
                      expires: Callable[[Any], bool] | None = None) -> None:
        """Writes a window's changes (key -> value, None: delete) as its one transaction,
        keys in order, unless this deployment was replaced (``Fenced``); ``expires``: which
        keys the TTL may drop. Nothing to write: nothing happens."""
        if not changes:
            return
        self._context.check_fence()  # a replaced deployment must not write the store
        keys = sorted(changes)  # in key order: neighbours in the B-tree written together
        flags = repeat(False) if expires is None else map(expires, keys)
        self.store.put(window_id, zip(keys, map(changes.__getitem__, keys), flags,
                                      strict=False))  # repeat() is endless
        self.store_applied(window_id)

    def store_checkpointed(self) -> None:
        """The windows the checkpoint counts on reach the disk (see ``StoreHandle``:
        a power loss before this is found at recovery, never silently wrong)."""
        store: KeyedStore | None = self.__dict__.get("_store")
        if store is not None:
            store.sync()

    def store_committed(self, window_id: int) -> None:
        store: KeyedStore | None = self.__dict__.get("_store")
        if store is not None:
            store.committed(window_id)

    def close_store(self) -> None:
        store: KeyedStore | None = self.__dict__.pop("_store", None)
        if store is not None:
            store.close()
        scratch = self.__dict__.pop("_scratch", None)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)

    def seed_handle(self, partitions: Sequence[Operator],
                    share: PartitionFilter | None) -> StoreHandle:
        """A new partition's handle: it names the old stores (as of each one's checkpoint)
        and its share of the keys; ``open_store`` copies them into its own store, once."""
        sources: list[tuple[str, int]] = []
        for old in partitions:
            handle: StoreHandle | None = old.__dict__.get("state")
            if handle is not None:
                sources.append((handle.path, handle.applied))
        seed = StoreSeed(tuple(sources), share.to_json() if share is not None else None)
        return StoreHandle("", max((w for _, w in sources), default=-1), seed)

    def check_partition_key(self, context: OperatorContext, keys: Sequence[str]) -> None:
        """Refuses a ``PARTITION_KEY`` its stored keys cannot be split by."""
        partition_key = context.attributes.get("PARTITION_KEY")
        if partition_key and not keys:
            raise SchemaMismatch(
                f"operator {context.name!r}: {type(self).__name__} has no keys, so its "
                f"state cannot be split; remove PARTITION_KEY={partition_key!r}")
        if partition_key and partition_key not in keys:
            raise SchemaMismatch(
                f"operator {context.name!r}: {type(self).__name__} keeps its state by "
                f"{list(keys)} but PARTITION_KEY is {partition_key!r}; partition it by its "
                f"key: -D {context.name}.PARTITION_KEY={keys[0]}")

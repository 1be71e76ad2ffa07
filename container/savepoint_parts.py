"""A container's side of savepoints (``operators.savepoints``): each operator writes its
part when its stream ended for one, and a new run's operators read theirs back.

A part is the operator's last checkpoint, under the savepoint's ``checkpoints/<id>/`` as in
a state folder (the same file format, read by the same ``CheckpointStore``), and a copy of
its durable folder (stores, logs: ``operators/<id>/``) when it has one.
"""

from __future__ import annotations

import logging
import os
import posixpath
import shutil
from collections.abc import Callable

import pyarrow.fs as pafs

from container.checkpoint_store import CheckpointStore
from container.operator_state import new_partition, restore
from operators.keyed_state import RepartitionError
from operators.operator import Operator
from operators.partitioning import PartitionFilter
from operators.savepoints import filesystem

__all__ = ["SavedParts", "write_part"]

_LOGGER = logging.getLogger(__name__)


def write_part(store: CheckpointStore, operator_id: int, window_id: int, durable_dir: str,
               savepoint_path: str) -> None:
    """Copies the operator's checkpoint of ``window_id`` and its durable folder (if it has
    anything in it) under ``savepoint_path``.

    Raises:
        OSError, FileNotFoundError: the checkpoint is gone or the savepoint cannot be
            written (the master then says the savepoint is incomplete).
    """
    CheckpointStore(savepoint_path).save(operator_id, window_id,
                                         store.load(operator_id, window_id))
    if durable_dir and os.path.isdir(durable_dir) and os.listdir(durable_dir):
        fs, root = filesystem(savepoint_path)
        target = posixpath.join(root, "operators", str(operator_id))
        fs.create_dir(target, recursive=True)
        pafs.copy_files(durable_dir, target, source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=fs)
    _LOGGER.info("operator %d wrote its savepoint part (checkpoint %d) to %s", operator_id,
                 window_id, savepoint_path)


class SavedParts:
    """The parts of one savepoint, as a new run's container reads them."""

    def __init__(self, savepoint_path: str) -> None:
        self.path = savepoint_path
        self.store = CheckpointStore(savepoint_path)

    def operator(self, old_ids: list[int], fresh: Callable[[], Operator], name: str,
                 share: PartitionFilter | None, durable_dir: str) -> Operator:
        """A new run's operator from its partitions ``old_ids`` in the savepoint: one part
        is taken as it is, with its durable folder; several are merged and cut to
        ``share`` (a changed partition count), which only state held in checkpoints
        allows (``RepartitionError`` otherwise)."""
        old = [restore(fresh(), self.load(old_id), name) for old_id in old_ids]
        if len(old) == 1 and share is None:
            self.restore_durable_dir(old_ids[0], durable_dir)
            return old[0]
        kept = [old_id for old_id in old_ids if self.has_durable_dir(old_id)]
        if kept:
            raise RepartitionError(
                f"its partitions {kept} in the savepoint kept state in their local folders "
                "(a store, a log), which cannot be re-split into another partition count; "
                "keep the savepoint's PARTITIONS for it")
        return new_partition(old, share)

    def load(self, operator_id: int) -> bytes:
        """The operator's state in the savepoint (its only checkpoint there)."""
        windows = self.store.windows(operator_id)
        if not windows:
            raise FileNotFoundError(f"the savepoint at {self.path} has no checkpoint of "
                                    f"operator {operator_id}")
        return self.store.load(operator_id, windows[-1])

    def has_durable_dir(self, operator_id: int) -> bool:
        fs, root = filesystem(self.path)
        selector = pafs.FileSelector(posixpath.join(root, "operators", str(operator_id)),
                                     allow_not_found=True)
        return bool(fs.get_file_info(selector))

    def restore_durable_dir(self, operator_id: int, durable_dir: str) -> None:
        """Replaces ``durable_dir`` with the operator's durable folder in the savepoint."""
        if not self.has_durable_dir(operator_id):
            return
        if not durable_dir:
            raise OSError(f"operator {operator_id} of the savepoint at {self.path} kept files "
                          "in its local state folder, but this run's STATE_DIR is not a "
                          "local path; set STATE_DIR to a local path")
        fs, root = filesystem(self.path)
        shutil.rmtree(durable_dir, ignore_errors=True)
        os.makedirs(durable_dir, mode=0o700, exist_ok=True)
        pafs.copy_files(posixpath.join(root, "operators", str(operator_id)), durable_dir,
                        source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())

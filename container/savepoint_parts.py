"""A container's side of savepoints (``storage.savepoints``): each operator writes its
part when its stream ended for one, and a new run's operators read theirs back.

A part is the operator's last checkpoint, under the savepoint's ``checkpoints/<id>/`` as in
a state folder (the same file format, read by the same ``CheckpointStore``), and a copy of
its durable folder (stores, logs: ``operators/<id>/``) when it has one.

A part is code (it is unpickled) and holds the operator's data (a source's log, a store),
so on this machine's file system it is written owner-only (folders 0700, files 0600,
created new: never through a link), into a savepoint folder that is this user's and
writable by nobody else; and a savepoint is read only once every folder and file in it
is checked so (``check_private_tree``), before anything is unpickled. A durable folder is
copied back owner-only too. In a remote store (a URI), the store's access control keeps
the savepoint.
"""

from __future__ import annotations

import logging
import os
import posixpath
import shutil
import stat
import tempfile
from collections.abc import Callable

import pyarrow.fs as pafs

from weir.container.checkpoint_store import CheckpointStore
from weir.operators.keyed_state import RepartitionError
from weir.operators.operator import Operator
from weir.operators.partitioning import PartitionFilter
from weir.runtime.operator_state import OperatorStateError, new_partition, restore
from weir.storage.private_files import UntrustedPath, check_private_tree, make_private_dir
from weir.storage.savepoints import ADVICE, Location, SavepointError, location

__all__ = ["SavedParts", "UntrustedSavepoint", "copy_private_tree", "write_part"]

_LOGGER = logging.getLogger(__name__)
_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CHUNK = 1 << 20


class UntrustedSavepoint(OperatorStateError):
    """A savepoint another user could have written into: nothing of it is unpickled (an
    ``OperatorStateError``, so the deployment fails at once rather than retrying)."""


def write_part(store: CheckpointStore, operator_id: int, window_id: int, durable_dir: str,
               savepoint_path: str) -> None:
    """Copies the operator's checkpoint of ``window_id`` and its durable folder (if it has
    anything in it) under ``savepoint_path``.

    Raises:
        OSError, FileNotFoundError: the checkpoint is gone or the savepoint cannot be
            written (the master then says the savepoint is incomplete).
        SavepointError: the savepoint folder (or one in it) is another user's, writable by
            others, or a link.
    """
    where = location(savepoint_path)
    data = store.load(operator_id, window_id)
    has_folder = bool(durable_dir) and os.path.isdir(durable_dir) and bool(os.listdir(durable_dir))
    if where.local:
        _private_dirs(where, "checkpoints", str(operator_id))
    CheckpointStore(where.root, where.fs).save(operator_id, window_id, data)
    if has_folder:
        if where.local:
            _private_dirs(where, "operators")
            _replace_folder(durable_dir, where.join("operators", str(operator_id)))
        else:
            target = where.join("operators", str(operator_id))
            where.fs.create_dir(target, recursive=True)
            pafs.copy_files(durable_dir, target, source_filesystem=pafs.LocalFileSystem(),
                            destination_filesystem=where.fs)
    _LOGGER.info("operator %d wrote its savepoint part (checkpoint %d) to %s", operator_id,
                 window_id, where.shown)


def _private_dirs(where: Location, *names: str) -> None:
    """The savepoint folder and ``names`` below it, each made 0700 or checked to be this
    user's and writable by nobody else."""
    folder = where.root
    try:
        make_private_dir(folder, "the savepoint folder", advice=ADVICE)
        for name in names:
            folder = posixpath.join(folder, name)
            make_private_dir(folder, "a folder of the savepoint", advice=ADVICE)
    except UntrustedPath as exc:
        raise SavepointError(f"cannot write to the savepoint at {where.shown}: "
                             f"{exc.strerror}") from None


def _replace_folder(source: str, target: str) -> None:
    """``target`` becomes an owner-only copy of ``source``: copied into a new folder beside
    it, which then replaces it (a part written again leaves no stale file)."""
    parent = os.path.dirname(target)
    fresh = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.", dir=parent)
    try:
        copy_private_tree(source, fresh, exists=True)
        if os.path.lexists(target):
            shutil.rmtree(target)
        os.rename(fresh, target)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise


def copy_private_tree(source: str, target: str, *, exists: bool = False) -> None:
    """Copies the folder ``source`` to ``target`` owner-only: folders 0700 and files 0600,
    each created new (``O_EXCL``, never through a link). A link or anything but a folder or
    a regular file in ``source`` is refused (``SavepointError``): a state folder has none.
    ``exists``: ``target`` is an empty folder of this user's already."""
    if not exists:
        os.mkdir(target, 0o700)
    os.chmod(target, 0o700)
    with os.scandir(source) as entries:
        for entry in entries:
            mode = entry.stat(follow_symlinks=False).st_mode
            into = os.path.join(target, entry.name)
            if stat.S_ISDIR(mode):
                copy_private_tree(entry.path, into)
            elif stat.S_ISREG(mode):
                _copy_file(entry.path, into)
            else:
                raise SavepointError(f"{entry.path} is a link or a special file: a state "
                                     "folder holds only folders and regular files")


def _copy_file(source: str, target: str) -> None:
    """Copies a regular file (not through a link) to a new file ``target``, mode 0600,
    synced: a savepoint outlives the machine's crash."""
    read_fd = os.open(source, os.O_RDONLY | _NO_FOLLOW | os.O_NONBLOCK)
    with os.fdopen(read_fd, "rb") as reader:
        if not stat.S_ISREG(os.fstat(reader.fileno()).st_mode):
            raise SavepointError(f"{source} is not a regular file")
        write_fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW, 0o600)
        with os.fdopen(write_fd, "wb") as writer:
            os.fchmod(writer.fileno(), 0o600)
            shutil.copyfileobj(reader, writer, _CHUNK)
            writer.flush()
            os.fsync(writer.fileno())


class SavedParts:
    """The parts of one savepoint, as a new run's container reads them.

    Raises (on creation):
        UntrustedSavepoint: a local savepoint holds a folder or file that is another
            user's, writable by others, or a link: nothing of it is read.
        SavepointError: the path is not one a savepoint can have.
    """

    def __init__(self, savepoint_path: str) -> None:
        self.path = savepoint_path
        self.where = location(savepoint_path)
        if self.where.local:
            try:
                check_private_tree(self.where.root, "the savepoint", advice=ADVICE)
            except UntrustedPath as exc:
                raise UntrustedSavepoint(exc.strerror) from None
        self.store = CheckpointStore(self.where.root, self.where.fs)

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
            raise FileNotFoundError(f"the savepoint at {self.where.shown} has no checkpoint "
                                    f"of operator {operator_id}")
        return self.store.load(operator_id, windows[-1])

    def _durable_source(self, operator_id: int) -> str:
        return self.where.join("operators", str(operator_id))

    def has_durable_dir(self, operator_id: int) -> bool:
        selector = pafs.FileSelector(self._durable_source(operator_id), allow_not_found=True)
        return bool(self.where.fs.get_file_info(selector))

    def restore_durable_dir(self, operator_id: int, durable_dir: str) -> None:
        """Replaces ``durable_dir`` with an owner-only copy of the operator's durable folder
        in the savepoint."""
        if not self.has_durable_dir(operator_id):
            return
        if not durable_dir:
            raise OSError(f"operator {operator_id} of the savepoint at {self.where.shown} kept "
                          "files in its local state folder, but this run's STATE_DIR is not a "
                          "local path; set STATE_DIR to a local path")
        shutil.rmtree(durable_dir, ignore_errors=True)
        os.makedirs(os.path.dirname(os.path.abspath(durable_dir)), mode=0o700, exist_ok=True)
        if self.where.local:
            copy_private_tree(self._durable_source(operator_id), durable_dir)
        else:
            _copy_from_store(self.where.fs, self._durable_source(operator_id), durable_dir)


def _copy_from_store(fs: pafs.FileSystem, source: str, target: str) -> None:
    """Copies the folder ``source`` of a remote store to the new local folder ``target``,
    owner-only as ``copy_private_tree`` does."""
    os.mkdir(target, 0o700)
    infos = fs.get_file_info(pafs.FileSelector(source, recursive=True))
    for info in sorted(infos, key=lambda i: i.path):
        relative = posixpath.relpath(info.path, source)
        if relative.startswith("..") or posixpath.isabs(relative):
            raise SavepointError(f"the store listed {info.path} under {source}")
        into = os.path.join(target, *relative.split("/"))
        if info.type == pafs.FileType.Directory:
            os.mkdir(into, 0o700)
        elif info.type == pafs.FileType.File:
            fd = os.open(into, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW, 0o600)
            with os.fdopen(fd, "wb") as writer, fs.open_input_stream(info.path) as reader:
                while chunk := reader.read(_CHUNK):
                    writer.write(chunk)

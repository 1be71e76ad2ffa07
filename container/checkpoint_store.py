"""Operator checkpoints on a local disk or any pyarrow.fs, written atomically and checksummed.

Layout: ``<root>/checkpoints/<operator_id>/<window id as 16 hex digits>.ckpt``. A file is a
32-byte little-endian header followed by the payload:

====== ===== =========================================================
offset bytes field
====== ===== =========================================================
0      8     magic ``b"WEIRCKPT"``
8      4     format version (1)
12     8     window id (unsigned)
20     8     payload length
28     4     CRC32 of header bytes 0..27 followed by the payload
====== ===== =========================================================

A save writes a temporary file (``.<name>.<random>.tmp``) in the same folder, syncs it
(local disks: ``fsync`` of the file, then of the folder after the rename) and renames it over
the final name, so a reader sees either the whole previous state or the whole new one.

The folder also holds the operator's fence (``FENCE``, ``storage.fence``): a save
given a ``check`` calls it just before the rename, so a deployment that was replaced leaves
no checkpoint behind (its temporary file is removed).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import struct
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable

import pyarrow.fs as pafs

from weir.operators.operator import Operator
from weir.runtime.operator_state import capture
from weir.storage.fence import CHECKPOINTS_FOLDER, Fence

__all__ = [
    "HEADER_SIZE", "MAGIC", "VERSION", "CheckpointInfo", "CheckpointStore", "CorruptCheckpoint",
    "StoreCheckpointer",
]

_LOGGER = logging.getLogger(__name__)

MAGIC = b"WEIRCKPT"
VERSION = 1
_HEADER = struct.Struct("<8sIQQ")  # magic, version, window id, payload length; then CRC32
_CRC = struct.Struct("<I")
HEADER_SIZE = _HEADER.size + _CRC.size
_NAME = re.compile(r"^([0-9a-f]{16})\.ckpt$")
_MAX_WINDOW = (1 << 64) - 1


class CorruptCheckpoint(Exception):
    """A checkpoint file is torn or corrupt; its payload must not be used.

    Attributes:
        path: the file.
        reason: what is wrong, in a few words.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"corrupt checkpoint {path}: {reason}")
        self.path = path
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """One saved checkpoint.

    Attributes:
        window_id: the window the state is as of (after its end).
        bytes: size of the file written, header included.
        seconds: how long the save took (write, sync, rename).
    """

    window_id: int
    bytes: int
    seconds: float


class CheckpointStore:
    """Checkpoints of the operators of an application, under one state directory.

    Args:
        root: a local path, or any ``pyarrow.fs`` URI (``file:///...``, ``s3://...``,
            ``hdfs://...``); with ``filesystem``, a path inside it.
        filesystem: a ready filesystem (credentials, options); default from ``root``.

    Thread safety: calls for different operators may run concurrently; saves of the same
    operator and window race harmlessly (the last rename wins, both files are whole).
    """

    def __init__(self, root: str, filesystem: pafs.FileSystem | None = None) -> None:
        if filesystem is not None:
            self.fs, path = filesystem, root
        elif "://" in root:
            self.fs, path = pafs.FileSystem.from_uri(root)
        else:
            self.fs, path = pafs.LocalFileSystem(), os.path.abspath(root)
        self.root = path.rstrip("/")
        self._local = isinstance(self.fs, pafs.LocalFileSystem)

    def __repr__(self) -> str:
        return f"CheckpointStore({self.root!r}, {type(self.fs).__name__})"

    # -- paths ---------------------------------------------------------------------------
    def folder(self, operator_id: int | str) -> str:
        """The folder holding the checkpoints of ``operator_id``."""
        name = str(operator_id)
        if not name or name in (".", "..") or "/" in name or "\\" in name:
            raise ValueError(f"operator id {name!r} cannot name a checkpoint folder")
        return f"{self.root}/{CHECKPOINTS_FOLDER}/{name}"

    def path(self, operator_id: int | str, window_id: int) -> str:
        """The file of the checkpoint of ``operator_id`` as of ``window_id``."""
        if not 0 <= window_id <= _MAX_WINDOW:
            raise ValueError(f"window id {window_id} is outside 0..2**64-1")
        return f"{self.folder(operator_id)}/{window_id:016x}.ckpt"

    # -- writing -------------------------------------------------------------------------
    def fence(self, operator_id: int | str, generation: int, what: str = "") -> Fence:
        """The fence of ``operator_id`` (in its checkpoint folder), seen by ``generation``."""
        return Fence(self.fs, self.folder(operator_id), generation,
                     what or f"operator {operator_id}")

    def save(self, operator_id: int | str, window_id: int, data: bytes,
             check: Callable[[], None] | None = None) -> CheckpointInfo:
        """Stores ``data`` as the checkpoint of ``operator_id`` as of ``window_id``.

        Args:
            operator_id: the physical operator id.
            window_id: the last window the state includes.
            data: the serialised state (``operator_state.capture``).
            check: called right before the rename; raising refuses the save (the fence).

        Returns:
            The window id, the bytes written and the seconds it took.

        Raises:
            OSError: the filesystem failed; no partial checkpoint is left under the name.
        """
        start = time.perf_counter()
        path = self.path(operator_id, window_id)
        header = _HEADER.pack(MAGIC, VERSION, window_id, len(data))
        crc = zlib.crc32(data, zlib.crc32(header))
        blob = b"".join((header, _CRC.pack(crc), data))
        if self._local:
            _write_local(path, blob, check)
        else:
            self._write_fs(path, blob, check)
        info = CheckpointInfo(window_id, len(blob), time.perf_counter() - start)
        _LOGGER.debug("saved checkpoint %s (%d bytes, %.3f s)", path, info.bytes, info.seconds)
        return info

    def _write_fs(self, path: str, blob: bytes, check: Callable[[], None] | None) -> None:
        folder, name = path.rsplit("/", 1)
        self.fs.create_dir(folder, recursive=True)
        tmp = f"{folder}/.{name}.{uuid.uuid4().hex}.tmp"
        try:
            with self.fs.open_output_stream(tmp) as out:
                out.write(blob)
            if check is not None:
                check()
            self.fs.move(tmp, path)
        except BaseException:
            _quietly(self.fs.delete_file, tmp)
            raise

    # -- reading -------------------------------------------------------------------------
    def load(self, operator_id: int | str, window_id: int) -> bytes:
        """The payload of a checkpoint, verified.

        Raises:
            FileNotFoundError: there is no checkpoint of that operator and window.
            CorruptCheckpoint: bad magic or version, truncated or trailing bytes, checksum
                mismatch, or the header names another window.
        """
        path = self.path(operator_id, window_id)
        try:
            with self.fs.open_input_stream(path) as stream:
                blob = stream.read()
        except FileNotFoundError:
            raise FileNotFoundError(f"no checkpoint of operator {operator_id} as of window "
                                    f"{window_id} ({path})") from None
        return _verify(path, blob, window_id)

    def windows(self, operator_id: int | str) -> list[int]:
        """The window ids of the operator's checkpoints, ascending (temporary files skipped)."""
        selector = pafs.FileSelector(self.folder(operator_id), allow_not_found=True)
        found = []
        for info in self.fs.get_file_info(selector):
            match = _NAME.match(info.base_name)
            if match and info.type == pafs.FileType.File:
                found.append(int(match.group(1), 16))
        return sorted(found)

    def latest(self, operator_id: int | str, at_most: int | None = None) -> int | None:
        """The newest checkpoint's window id (not after ``at_most`` if given), or None."""
        candidates = [w for w in self.windows(operator_id) if at_most is None or w <= at_most]
        return candidates[-1] if candidates else None

    # -- deleting ------------------------------------------------------------------------
    def delete_before(self, operator_id: int | str, window_id: int) -> int:
        """Deletes the operator's checkpoints older than ``window_id``; returns how many."""
        deleted = 0
        for w in self.windows(operator_id):
            if w >= window_id:
                break
            try:
                self.fs.delete_file(self.path(operator_id, w))
                deleted += 1
            except FileNotFoundError:
                pass  # deleted by someone else meanwhile
        if deleted:
            _LOGGER.debug("deleted %d checkpoints of operator %s before window %d",
                          deleted, operator_id, window_id)
        return deleted

    def delete_temporaries(self, operator_id: int | str) -> int:
        """Deletes the temporary files of saves that never finished (a process killed, or
        fenced, mid-save); returns how many. Call it when no other save can be under way."""
        selector = pafs.FileSelector(self.folder(operator_id), allow_not_found=True)
        deleted = 0
        for info in self.fs.get_file_info(selector):
            if info.base_name.startswith(".") and info.base_name.endswith(".tmp"):
                try:
                    self.fs.delete_file(info.path)
                    deleted += 1
                except FileNotFoundError:
                    pass
        return deleted

    def delete(self, operator_id: int | str) -> None:
        """Deletes every checkpoint of the operator (and leftover temporary files)."""
        folder = self.folder(operator_id)
        if self.fs.get_file_info(folder).type != pafs.FileType.NotFound:
            self.fs.delete_dir(folder)


def _verify(path: str, blob: bytes, window_id: int) -> bytes:
    if len(blob) < HEADER_SIZE:
        raise CorruptCheckpoint(path, f"truncated: {len(blob)} bytes, shorter than the "
                                      f"{HEADER_SIZE}-byte header")
    magic, version, saved_window, length = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise CorruptCheckpoint(path, f"bad magic {magic!r} (expected {MAGIC!r}): "
                                      "not a Weir checkpoint")
    if version != VERSION:
        raise CorruptCheckpoint(path, f"unsupported format version {version} "
                                      f"(this Weir reads {VERSION})")
    actual = len(blob) - HEADER_SIZE
    if actual < length:
        raise CorruptCheckpoint(path, f"truncated: header says {length} payload bytes, "
                                      f"file has {actual}")
    if actual > length:
        raise CorruptCheckpoint(path, f"{actual - length} bytes of trailing data after the "
                                      f"{length}-byte payload")
    payload = blob[HEADER_SIZE:]
    (stored,) = _CRC.unpack_from(blob, _HEADER.size)
    computed = zlib.crc32(payload, zlib.crc32(blob[:_HEADER.size]))
    if stored != computed:
        raise CorruptCheckpoint(path, f"checksum mismatch (stored CRC32 {stored:08x}, "
                                      f"computed {computed:08x})")
    if saved_window != window_id:
        raise CorruptCheckpoint(path, f"window id mismatch: header says {saved_window:016x}, "
                                      f"file name says {window_id:016x}")
    return payload


def _write_local(path: str, blob: bytes, check: Callable[[], None] | None = None) -> None:
    folder, name = os.path.split(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)  # state is private to its owner
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(blob)
            out.flush()
            os.fsync(out.fileno())
        if check is not None:
            check()
        os.replace(tmp, path)
    except BaseException:
        _quietly(os.unlink, tmp)
        raise
    _fsync_dir(folder)


def _fsync_dir(folder: str) -> None:
    """Makes a rename in ``folder`` durable (where the OS allows opening folders)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _quietly(func: Callable[[str], object], path: str) -> None:
    try:
        func(path)
    except Exception:  # noqa: BLE001 - best effort cleanup after a failure
        _LOGGER.debug("could not remove temporary checkpoint file %s", path)


class StoreCheckpointer:
    """One deployment's checkpoints in a ``CheckpointStore``: captured state, saved
    atomically, and only while ``fence`` says this deployment was not replaced."""

    def __init__(self, store: CheckpointStore, fence: Fence | None = None) -> None:
        self.store = store
        self.fence = fence

    def checkpoint(self, operator_id: int, window_id: int, operator: Operator) -> int:
        check = self.fence.check if self.fence is not None else None
        return self.store.save(operator_id, window_id, capture(operator), check).bytes

    def has(self, operator_id: int, window_id: int) -> bool:
        return window_id in self.store.windows(operator_id)

    def committed(self, operator_id: int, window_id: int) -> None:
        if self.fence is not None:
            self.fence.check()
        self.store.delete_before(operator_id, window_id)

"""Savepoints: an application's operator states at the end of its stream, to start a new
run (a new version of the code) from.

A savepoint is a folder (a local path or any ``pyarrow.fs`` URI) laid out like a state
folder, so a container reads it with the code that reads checkpoints::

    savepoint.json                      the manifest, written last: it exists = complete
    checkpoints/<operator id>/<w>.ckpt  each physical operator's last checkpoint
    operators/<operator id>/...         its durable folder (stores, logs), if it had one

The manifest describes it without Weir: the DAG (operators with their classes, partitions
and attributes; streams), the window every operator ended at (``window``: the new run's
windows follow it), the application it came from and the Weir version.

A savepoint is code: a new run unpickles its parts. So a local one is trusted only if this
user owns every folder and file in it and nobody else can write them (checked before
anything is read: ``storage.private_files``), and everything Weir writes into one
is owner-only (folders 0700, files 0600; the manifest through a random temporary name, so
a planted link is never written through). A savepoint folder that exists must be this
user's and not writable by others; a missing one is created 0700. For a URI (S3, GCS,
HDFS, Azure) the store's own access control is what keeps it: only its owner should be
able to write there. Paths are absolute (the CLI makes them so from the caller's working
folder) and the manifest is checked whole: a JSON object of the expected fields, every
number in range, at most ``MAX_MANIFEST_BYTES``.

A new run is matched to a savepoint by operator name (``match``): an operator is *kept*
(state restored; a new partition count re-splits keyed state as a repartition does),
*new* (starts fresh), *dropped* (its state is not used: refused unless allowed) or has
its *class changed* (refused: another class cannot read the state).

The manifest's format and the matching of a new run's DAG are in
``storage.savepoint_manifest`` (re-exported here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import posixpath
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.fs as pafs

from weir.storage.locations import redact_location
from weir.storage.private_files import (
    UntrustedPath,
    check_private_dir,
    check_private_tree,
    make_private_dir,
    read_private_file,
    write_private_file,
)
from weir.storage.savepoint_manifest import (
    MAX_MANIFEST_BYTES,
    Manifest,
    SavedOperator,
    SavedPartition,
    SavepointError,
    SavepointMatch,
    match,
)

__all__ = ["MANIFEST", "MAX_MANIFEST_BYTES", "SCHEMES", "Location", "Manifest", "SavedOperator",
           "SavedPartition", "SavepointError", "SavepointMatch", "check_unused", "location",
           "match", "read_manifest", "write_manifest"]

MANIFEST = "savepoint.json"
SCHEMES = ("file", "local", "s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")
"""The URI schemes of the ``pyarrow.fs`` stores a savepoint may live in."""
ADVICE = ("a savepoint is code (its parts are unpickled): keep it in a folder only you can "
          "write, or name a new folder")


@dataclasses.dataclass(frozen=True)
class Location:
    """Where a savepoint is: its store, the folder in it, whether that is this machine's
    file system (whose owners and modes Weir checks), and how to show it (no keys)."""

    fs: pafs.FileSystem
    root: str
    local: bool
    shown: str

    def join(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)


def location(path: str) -> Location:
    """Where the savepoint at ``path`` (an absolute local path or a URI of ``SCHEMES``) is.

    Raises:
        SavepointError: the path is empty, relative, holds a NUL or cannot be encoded, or
            names a store this Weir cannot reach (the message lists what it can).
    """
    shown = _check_path(path)
    scheme, is_uri, _ = path.partition("://")
    if not is_uri:
        if not posixpath.isabs(path):
            raise SavepointError(f"savepoint path {shown!r} is relative: give an absolute path "
                                 "(the weir CLI makes one from its working folder) or a URI")
        return Location(pafs.LocalFileSystem(), posixpath.normpath(path), True, shown)
    if scheme.lower() not in SCHEMES:
        raise SavepointError(f"savepoint path {shown!r} has an unknown scheme {scheme!r}: give "
                             "an absolute local path or a URI of "
                             + ", ".join(f"{name}://" for name in SCHEMES))
    try:
        fs, root = pafs.FileSystem.from_uri(path)
    except (ValueError, OSError, pa.ArrowException) as exc:
        raise SavepointError(f"savepoint path {shown!r} is not a usable pyarrow.fs URI: "
                             f"{_first_line(exc)}") from None
    local = isinstance(fs, pafs.LocalFileSystem)
    return Location(fs, posixpath.normpath(root) if local else root.rstrip("/"), local, shown)


def filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem of a local path or URI, and the path within it (``location``)."""
    where = location(path)
    return where.fs, where.root


def _check_path(path: object) -> str:
    """``path`` as it may be shown; raises unless it is a non-empty string a file system
    takes (no NUL, encodable)."""
    if not isinstance(path, str) or not path:
        raise SavepointError("name the folder of the savepoint (a path or a URI)")
    shown = redact_location(path)
    if "\0" in path:
        raise SavepointError(f"savepoint path {shown!r} holds a NUL character")
    try:
        os.fsencode(path)
    except UnicodeError:
        raise SavepointError(f"savepoint path {shown!r} cannot be encoded as a file "
                             "name") from None
    return shown


def _first_line(exc: BaseException) -> str:
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return (text.strip().splitlines() or [type(exc).__name__])[0][:300]


@contextlib.contextmanager
def _failures(doing: str) -> Iterator[None]:
    """Turns what a store raises into ``SavepointError``: ``doing`` said first."""
    try:
        yield
    except SavepointError:
        raise
    except UntrustedPath as exc:
        raise SavepointError(f"{doing}: {exc.strerror}") from None
    except (OSError, pa.ArrowException) as exc:
        raise SavepointError(f"{doing}: {_first_line(exc)}") from None


def read_manifest(path: str) -> Manifest:
    """The manifest of the savepoint at ``path``; a local one is trusted only if every
    folder and file in it is this user's and writable by nobody else (checked before
    anything of it is read).

    Raises:
        SavepointError: there is none (not a savepoint, or one that did not complete), it
            cannot be trusted or read, or it is not a manifest.
    """
    where = location(path)
    with _failures(f"cannot read the savepoint at {where.shown}"):
        data = _read_local(where) if where.local else _read_store(where)
    if len(data) > MAX_MANIFEST_BYTES:
        raise SavepointError(f"{where.join(MANIFEST)} is larger than "
                             f"{MAX_MANIFEST_BYTES >> 20} MB: it is not a savepoint manifest")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SavepointError(f"{redact_location(where.join(MANIFEST))} is not UTF-8 text: it "
                             "is not a savepoint manifest") from None
    try:
        return Manifest.from_json(text)
    except SavepointError as exc:
        raise SavepointError(f"{redact_location(where.join(MANIFEST))} is not a savepoint "
                             f"manifest: {exc}") from None


def _not_a_savepoint(where: Location) -> SavepointError:
    return SavepointError(f"{where.shown!r} holds no {MANIFEST}: it is not a savepoint, or "
                          "one that did not complete (`weir app APP_ID` says why)")


def _read_local(where: Location) -> bytes:
    if not os.path.lexists(where.join(MANIFEST)):
        raise _not_a_savepoint(where)
    check_private_tree(where.root, "the savepoint", advice=ADVICE)
    return read_private_file(where.join(MANIFEST), "the savepoint's manifest", advice=ADVICE)


def _read_store(where: Location) -> bytes:
    try:
        with where.fs.open_input_stream(where.join(MANIFEST)) as stream:
            return stream.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise _not_a_savepoint(where) from None


def write_manifest(path: str, manifest: Manifest) -> None:
    """Writes the manifest last (the savepoint is then complete): owner-only, through a
    new temporary file of a random name renamed over the final one (a link planted at
    either name is never written through).

    Raises:
        SavepointError: the folder cannot be trusted (another user's, or writable by
            others) or the store failed.
    """
    where = location(path)
    data = manifest.to_json().encode()
    with _failures(f"cannot write the manifest of the savepoint at {where.shown}"):
        if where.local:
            make_private_dir(where.root, "the savepoint folder", advice=ADVICE)
            write_private_file(where.join(MANIFEST), data)
        else:
            _write_store(where, data)


def _write_store(where: Location, data: bytes) -> None:
    where.fs.create_dir(where.root, recursive=True)
    temporary = where.join(f".{MANIFEST}.{uuid.uuid4().hex}.tmp")
    try:
        with where.fs.open_output_stream(temporary) as stream:
            stream.write(data)
        where.fs.move(temporary, where.join(MANIFEST))
    except BaseException:
        with contextlib.suppress(OSError, pa.ArrowException):
            where.fs.delete_file(temporary)
        raise


def check_unused(path: str) -> None:
    """Checks that a savepoint can be taken at ``path``: no savepoint there already (one is
    never overwritten), and a local folder that exists is this user's, not writable by
    others (a missing one is made 0700 by the first part written).

    Raises:
        SavepointError: it cannot (the message names the folder and what to do).
    """
    where = location(path)
    with _failures(f"cannot take a savepoint at {where.shown}"):
        if where.local:
            if not os.path.lexists(where.root):
                return
            check_private_dir(where.root, "the savepoint folder", advice=ADVICE)
            used = os.path.lexists(where.join(MANIFEST))
        else:
            used = where.fs.get_file_info(where.join(MANIFEST)).type != pafs.FileType.NotFound
    if used:
        raise SavepointError(f"{where.shown!r} already holds a savepoint; name a new folder")

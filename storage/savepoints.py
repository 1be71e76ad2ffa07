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

>>> m = Manifest(window=42, app_name="wc", application_id="app-0001", operators=[
...     SavedOperator("source", "operators.library.DirectorySource", [SavedPartition(1, 40)]),
...     SavedOperator("count", "operators.library.RunningCount", [SavedPartition(2, 42)])])
>>> Manifest.from_json(m.to_json()) == m
True
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import posixpath
import time
import uuid
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from proto import plan_pb2
from storage.locations import redact_location
from storage.private_files import (
    UntrustedPath,
    check_private_dir,
    check_private_tree,
    make_private_dir,
    read_private_file,
    write_private_file,
)

__all__ = ["MANIFEST", "MAX_MANIFEST_BYTES", "SCHEMES", "Location", "Manifest", "SavedOperator",
           "SavedPartition", "SavepointError", "SavepointMatch", "check_unused", "location",
           "match", "read_manifest", "write_manifest"]

MANIFEST = "savepoint.json"
FORMAT = 1
MAX_MANIFEST_BYTES = 16 << 20
"""A manifest is a few KB per operator; anything larger is not one."""
SCHEMES = ("file", "local", "s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")
"""The URI schemes of the ``pyarrow.fs`` stores a savepoint may live in."""
ADVICE = ("a savepoint is code (its parts are unpickled): keep it in a folder only you can "
          "write, or name a new folder")
_INT_LIMIT = 1 << 63  # every number of a manifest is below it (proto int64, window ids)


class SavepointError(ValueError):
    """A savepoint cannot be read, written or used; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class SavedPartition:
    """One physical operator in the savepoint: its id there and its last checkpoint."""

    id: int
    window: int


@dataclasses.dataclass(frozen=True)
class SavedOperator:
    """One logical operator in the savepoint."""

    name: str
    class_name: str
    partitions: list[SavedPartition]
    attributes: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Manifest:
    """What a savepoint holds (``savepoint.json``)."""

    window: int
    app_name: str
    application_id: str
    operators: list[SavedOperator]
    streams: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    attributes: dict[str, str] = dataclasses.field(default_factory=dict)
    created_ms: int = 0
    weir_version: str = ""
    format: int = FORMAT

    def operator(self, name: str) -> SavedOperator | None:
        return next((op for op in self.operators if op.name == name), None)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """The manifest in ``text``, checked whole: the fields it must have, of their types,
        every number in range (window ids as ``operators.windows`` makes them).

        Raises:
            SavepointError: it is not one (the message names the field).
        """
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise SavepointError(f"not JSON: {str(exc)[:200]}") from None
        raw = _object(raw, "the manifest")
        if raw.get("format") != FORMAT:
            raise SavepointError(f"savepoint format {_shown(raw.get('format'))} is not "
                                 f"{FORMAT}, the one this Weir reads")
        operators = [_operator(o) for o in _list(raw, "operators")]
        names = [op.name for op in operators]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise SavepointError(f"operators {twice} appear more than once")
        return cls(window=_int(raw, "window", 0), app_name=_str(raw, "app_name"),
                   application_id=_str(raw, "application_id"), operators=operators,
                   streams=[_stream(s) for s in _list(raw, "streams", [])],
                   attributes=_strings(raw.get("attributes", {}), "attributes"),
                   created_ms=_int(raw, "created_ms", 0, 0),
                   weir_version=_str(raw, "weir_version", ""), format=FORMAT)

    @classmethod
    def describe(cls, dag: plan_pb2.DagDescriptor, application_id: str, window: int,
                 partitions: dict[str, list[SavedPartition]]) -> Manifest:
        """The manifest of a savepoint of ``dag`` whose operators ended as ``partitions``."""
        return cls(
            window=window, app_name=dag.name, application_id=application_id,
            operators=[SavedOperator(op.name, op.class_name, partitions.get(op.name, []),
                                     dict(op.attributes)) for op in dag.operators],
            streams=[{"name": s.name, "source": f"{s.source_operator}.{s.source_port}",
                      "sinks": [f"{k.operator}.{k.port}" for k in s.sinks]}
                     for s in dag.streams],
            attributes=dict(dag.attributes), created_ms=int(time.time() * 1000),
            weir_version=weir_version())


_MISSING = object()


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _field(raw: dict[str, Any], key: str, default: object) -> object:
    value = raw.get(key, default)
    if value is _MISSING:
        raise SavepointError(f"it has no {key!r}")
    return value


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SavepointError(f"{what} is {_shown(value)}, not a JSON object")
    return value


def _list(raw: dict[str, Any], key: str, default: object = _MISSING) -> list[Any]:
    value = _field(raw, key, default)
    if not isinstance(value, list):
        raise SavepointError(f"{key!r} is {_shown(value)}, not a list")
    return value


def _str(raw: dict[str, Any], key: str, default: object = _MISSING) -> str:
    value = _field(raw, key, default)
    if not isinstance(value, str):
        raise SavepointError(f"{key!r} is {_shown(value)}, not a string")
    return value


def _int(raw: dict[str, Any], key: str, low: int, default: object = _MISSING) -> int:
    """An integer in ``low``..2**63-1 (JSON's true and false are not numbers here)."""
    value = _field(raw, key, default)
    if type(value) is not int or not low <= value < _INT_LIMIT:
        raise SavepointError(f"{key!r} is {_shown(value)}, not an integer in {low}..2**63-1")
    return value


def _strings(value: object, what: str) -> dict[str, str]:
    mapping = _object(value, what)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        raise SavepointError(f"{what} must map names to strings")
    return dict(mapping)


def _operator(value: object) -> SavedOperator:
    raw = _object(value, "an operator")
    name = _str(raw, "name")
    try:
        partitions = [_partition(p) for p in _list(raw, "partitions")]
        return SavedOperator(name, _str(raw, "class_name"), partitions,
                             _strings(raw.get("attributes", {}), "its attributes"))
    except SavepointError as exc:
        raise SavepointError(f"operator {_shown(name)}: {exc}") from None


def _partition(value: object) -> SavedPartition:
    """A partition: its id, and the window of its checkpoint (-1, ``NO_WINDOW``: none)."""
    raw = _object(value, "a partition")
    return SavedPartition(_int(raw, "id", 0), _int(raw, "window", -1))


def _stream(value: object) -> dict[str, Any]:
    raw = _object(value, "a stream")
    sinks = _list(raw, "sinks", [])
    if not all(isinstance(sink, str) for sink in sinks):
        raise SavepointError(f"stream {_shown(raw.get('name'))}: its sinks must be strings")
    return {"name": _str(raw, "name"), "source": _str(raw, "source"), "sinks": list(sinks)}


def weir_version() -> str:
    try:
        return metadata.version("weir")
    except metadata.PackageNotFoundError:
        return "unknown"


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


@dataclasses.dataclass
class SavepointMatch:
    """How a DAG's operators match a savepoint's, by name."""

    kept: list[str]
    new: list[str]
    dropped: list[str]
    class_changed: list[tuple[str, str, str]]  # name, savepoint's class, the DAG's
    repartitioned: list[tuple[str, int, int]]  # name, savepoint's partitions, the DAG's

    def lines(self) -> list[str]:
        """One line per operator, for people."""
        moved = {name: (old, new) for name, old, new in self.repartitioned}
        out = [f"  kept           {name}" + (f" ({moved[name][0]} -> {moved[name][1]} "
                                              "partitions: keyed state re-split)"
                                              if name in moved else "")
               for name in self.kept]
        out += [f"  new            {name} (starts fresh)" for name in self.new]
        out += [f"  dropped        {name} (its state is not used)" for name in self.dropped]
        out += [f"  class changed  {name}: {old} -> {new} (its state cannot be read)"
                for name, old, new in self.class_changed]
        return out

    def refusal(self, allow_dropped: bool) -> str | None:
        """Why the DAG cannot start from the savepoint, or None."""
        problems = []
        if self.class_changed:
            problems.append("operators changed class: rename them to start them fresh, or "
                            "keep their class")
        if self.dropped and not allow_dropped:
            problems.append("operators of the savepoint are not in the DAG: pass "
                            "--allow-dropped to leave their state behind")
        if not problems:
            return None
        return "; ".join(problems) + "; per operator: " + "; ".join(
            " ".join(line.split()) for line in self.lines())


def match(dag: plan_pb2.DagDescriptor, manifest: Manifest,
          partitions: dict[str, int] | None = None) -> SavepointMatch:
    """Matches ``dag``'s operators to the savepoint's by name.

    Args:
        partitions: the DAG's partition count per operator, when known (planned); a
            difference is reported, not refused.
    """
    saved = {op.name: op for op in manifest.operators}
    names = [op.name for op in dag.operators]
    result = SavepointMatch([], [], sorted(set(saved) - set(names)), [], [])
    for op in dag.operators:
        old = saved.get(op.name)
        if old is None:
            result.new.append(op.name)
        elif old.class_name != op.class_name:
            result.class_changed.append((op.name, old.class_name, op.class_name))
        else:
            result.kept.append(op.name)
            count = (partitions or {}).get(op.name)
            if count is not None and count != len(old.partitions):
                result.repartitioned.append((op.name, len(old.partitions), count))
    return result



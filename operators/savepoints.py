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

import dataclasses
import json
import posixpath
import time
from importlib import metadata
from typing import Any

import pyarrow.fs as pafs

from proto import plan_pb2

__all__ = ["MANIFEST", "Manifest", "SavedOperator", "SavedPartition", "SavepointError",
           "SavepointMatch", "match", "read_manifest", "write_manifest"]

MANIFEST = "savepoint.json"
FORMAT = 1


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
        raw = json.loads(text)
        if raw.get("format") != FORMAT:
            raise SavepointError(f"savepoint format {raw.get('format')!r} is not {FORMAT}, "
                                 "the one this Weir reads")
        operators = [SavedOperator(o["name"], o["class_name"],
                                   [SavedPartition(int(p["id"]), int(p["window"]))
                                    for p in o["partitions"]], dict(o.get("attributes", {})))
                     for o in raw["operators"]]
        return cls(window=int(raw["window"]), app_name=raw["app_name"],
                   application_id=raw["application_id"], operators=operators,
                   streams=list(raw.get("streams", [])),
                   attributes=dict(raw.get("attributes", {})),
                   created_ms=int(raw.get("created_ms", 0)),
                   weir_version=str(raw.get("weir_version", "")), format=FORMAT)

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


def weir_version() -> str:
    try:
        return metadata.version("weir")
    except metadata.PackageNotFoundError:
        return "unknown"


def filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem of a local path or URI, and the path within it."""
    if "://" in path:
        try:
            return pafs.FileSystem.from_uri(path)
        except (pafs.ArrowInvalid, ValueError, OSError) as exc:  # type: ignore[attr-defined]
            raise SavepointError(f"savepoint path {path!r} is not a usable pyarrow.fs URI: "
                                 f"{exc}") from None
    return pafs.LocalFileSystem(), posixpath.abspath(path)


def read_manifest(path: str) -> Manifest:
    """The manifest of the savepoint at ``path``.

    Raises:
        SavepointError: there is none (not a savepoint, or one that did not complete) or
            it cannot be read.
    """
    fs, root = filesystem(path)
    where = posixpath.join(root, MANIFEST)
    try:
        with fs.open_input_stream(where) as stream:
            text = stream.read().decode()
    except FileNotFoundError:
        raise SavepointError(f"{path!r} holds no {MANIFEST}: it is not a savepoint, or one "
                             "that did not complete (`weir app APP_ID` says why)") from None
    except OSError as exc:
        raise SavepointError(f"cannot read the savepoint at {path!r}: {exc}") from None
    try:
        return Manifest.from_json(text)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, SavepointError):
            raise
        raise SavepointError(f"{where} is not a savepoint manifest: {exc}") from None


def write_manifest(path: str, manifest: Manifest) -> None:
    """Writes the manifest last, under a temporary name renamed over the final one."""
    fs, root = filesystem(path)
    fs.create_dir(root, recursive=True)
    temporary = posixpath.join(root, f".{MANIFEST}.tmp")
    with fs.open_output_stream(temporary) as stream:
        stream.write(manifest.to_json().encode())
    fs.move(temporary, posixpath.join(root, MANIFEST))


def check_unused(path: str) -> None:
    """Raises if ``path`` already holds a savepoint (one is never overwritten)."""
    fs, root = filesystem(path)
    if fs.get_file_info(posixpath.join(root, MANIFEST)).type != pafs.FileType.NotFound:
        raise SavepointError(f"{path!r} already holds a savepoint; name a new folder")


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



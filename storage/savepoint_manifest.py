"""The savepoint manifest (``savepoint.json``): what a savepoint holds, described without
Weir (the DAG, the window every operator ended at, where it came from), read back checked
whole, and how a new run's DAG matches it (``match``). Where a savepoint lives and whether
it may be trusted is ``storage.savepoints``.

>>> m = Manifest(window=42, app_name="wc", application_id="app-0001", operators=[
...     SavedOperator("source", "weir.operators.library.DirectorySource", [SavedPartition(1, 40)]),
...     SavedOperator("count", "weir.operators.library.RunningCount", [SavedPartition(2, 42)])])
>>> Manifest.from_json(m.to_json()) == m
True
"""

from __future__ import annotations

import dataclasses
import json
import time
from importlib import metadata
from typing import Any

from weir.proto import plan_pb2
from weir.storage.moved import current_module

__all__ = ["FORMAT", "MAX_MANIFEST_BYTES", "Manifest", "SavedOperator", "SavedPartition",
           "SavepointError", "SavepointMatch", "match", "weir_version"]

FORMAT = 1
MAX_MANIFEST_BYTES = 16 << 20
"""A manifest is a few KB per operator; anything larger is not one."""
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
        elif current_module(old.class_name) != current_module(op.class_name):  # moved classes
            result.class_changed.append((op.name, old.class_name, op.class_name))
        else:
            result.kept.append(op.name)
            count = (partitions or {}).get(op.name)
            if count is not None and count != len(old.partitions):
                result.repartitioned.append((op.name, len(old.partitions), count))
    return result

"""Commit steps recorded before they run, so a crash in the middle of a commit is finished,
never repeated (Gobblin's CommitStepStore).

An exactly-once sink stages each window's output and, once the window is committed,
publishes it: the store first records the whole sequence of steps durably, then runs
them one by one, then marks the sequence done. Each step can tell whether it is already
done (``verify``) and does it idempotently (``execute``), so a sink that starts after a
crash calls ``recover()`` and the recorded sequence is completed exactly once, whatever
point the crash hit. The store also keeps the sink's high watermark: the last window
whose output is published (a step of every sequence advances it).

Records (JSON, in a ``RecordLog``): ``{"t": "begin", "id", "steps"}``,
``{"t": "done", "id"}`` and ``{"t": "watermark", "w"}``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

from weir.storage.records import RecordLog, sync_folder

__all__ = [
    "AdvanceWatermark",
    "CommitError",
    "CommitStep",
    "CommitStepStore",
    "PublishFile",
    "register_step",
]

_LOGGER = logging.getLogger(__name__)


class CommitError(RuntimeError):
    """A recorded commit step can neither be verified as done nor executed."""


class CommitStep(Protocol):
    """One idempotent step of a commit."""

    kind: ClassVar[str]

    def verify(self, store: CommitStepStore) -> bool:
        """True if the step's effect is already in place (it must not run again)."""
        ...

    def execute(self, store: CommitStepStore) -> None:
        """Does the step; safe to call again after a crash inside it."""
        ...

    def to_record(self) -> dict[str, Any]:
        """The step as JSON fields (``kind`` is added by the store)."""
        ...


_KINDS: dict[str, Callable[..., CommitStep]] = {}


def register_step(cls: type) -> type:
    """Class decorator: makes a step kind known, so recorded steps of it can be rebuilt."""
    _KINDS[cls.kind] = cls  # type: ignore[attr-defined]
    return cls


@register_step
@dataclasses.dataclass(frozen=True)
class PublishFile:
    """Moves a staged file to its final name (an atomic rename in one filesystem)."""

    kind: ClassVar[str] = "publish_file"
    staged: str
    final: str

    def verify(self, store: CommitStepStore) -> bool:
        if os.path.exists(self.staged):
            return False
        if os.path.exists(self.final):
            return True
        raise CommitError(f"commit step {self.kind}: neither the staged file {self.staged} nor "
                          f"the published {self.final} exists: the staged output was removed "
                          "by someone else and this window's output is lost")

    def execute(self, store: CommitStepStore) -> None:
        os.replace(self.staged, self.final)
        sync_folder(os.path.dirname(self.final))

    def to_record(self) -> dict[str, Any]:
        return {"staged": self.staged, "final": self.final}


@register_step
@dataclasses.dataclass(frozen=True)
class AdvanceWatermark:
    """Raises the sink's high watermark: windows up to it are published and are skipped if
    they ever come again."""

    kind: ClassVar[str] = "advance_watermark"
    window_id: int

    def verify(self, store: CommitStepStore) -> bool:
        return store.watermark >= self.window_id

    def execute(self, store: CommitStepStore) -> None:
        store._record({"t": "watermark", "w": self.window_id})
        store.watermark = self.window_id

    def to_record(self) -> dict[str, Any]:
        return {"window_id": self.window_id}


class CommitStepStore:
    """The durable record of a sink's commit sequences and high watermark.

    Args:
        folder: where the store's log lives (the sink's durable folder).
        crash_point: called at ``commit.recorded``, ``commit.between_steps`` and
            ``commit.executed`` (``OperatorContext.crash_point``), for crash tests.
        segment_bytes: log segment size; older segments go once a sequence is done.
        guard: called before every record and every step run; raises to refuse it (the
            operator's fence: a replaced deployment neither records nor publishes).
    """

    def __init__(self, folder: str, crash_point: Callable[[str], None] | None = None,
                 segment_bytes: int = 256 << 10,
                 guard: Callable[[], None] | None = None) -> None:
        self.folder = folder
        self._crash = crash_point or (lambda name: None)
        self._guard = guard or (lambda: None)
        self._log = RecordLog(folder, segment_bytes, guard)
        self.watermark = -1
        self.sequences_done = 0
        self._next_id = 0
        self._pending: tuple[int, list[CommitStep]] | None = None
        for seq, payload in self._log.records():
            self._replay(seq, json.loads(payload))

    @property
    def pending(self) -> list[CommitStep] | None:
        """The steps of a recorded sequence not marked done (a crash hit it), or None."""
        return None if self._pending is None else list(self._pending[1])

    def recover(self) -> int:
        """Finishes a sequence a crash interrupted; returns how many of its steps still ran."""
        if self._pending is None:
            return 0
        sequence_id, steps = self._pending
        ran = self._execute(steps)
        self._finish(sequence_id)
        _LOGGER.info("commit-step store %s: finished interrupted commit %d (%d of %d steps "
                     "were still to do)", self.folder, sequence_id, ran, len(steps))
        return ran

    def commit(self, steps: Sequence[CommitStep]) -> None:
        """Records ``steps`` durably, runs them, marks them done."""
        if self._pending is not None:
            raise CommitError(f"commit-step store {self.folder}: an interrupted commit is "
                              "pending; call recover() before committing again")
        if not steps:
            return
        sequence_id = self._next_id
        self._next_id += 1
        self._record({"t": "begin", "id": sequence_id,
                      "steps": [{"kind": s.kind, **s.to_record()} for s in steps]})
        self._pending = (sequence_id, list(steps))
        self._crash("commit.recorded")
        self._execute(steps)
        self._crash("commit.executed")
        self._finish(sequence_id)

    def close(self) -> None:
        self._log.close()

    # -- internals -----------------------------------------------------------------
    def _execute(self, steps: Sequence[CommitStep]) -> int:
        ran = 0
        for index, step in enumerate(steps):
            if not step.verify(self):
                self._guard()
                step.execute(self)
                ran += 1
            if index == 0 and len(steps) > 1:
                self._crash("commit.between_steps")
        return ran

    def _finish(self, sequence_id: int) -> None:
        self._record({"t": "done", "id": sequence_id})
        self._pending = None
        self.sequences_done += 1
        if self._log.segment_count > 1:
            self._compact()

    def _compact(self) -> None:
        """Starts a new segment with the watermark and drops the older ones."""
        self._log.roll()
        seq = self._record({"t": "watermark", "w": self.watermark, "next_id": self._next_id})
        self._log.delete_before(seq)

    def _record(self, record: dict[str, Any]) -> int:
        seq = self._log.append(json.dumps(record).encode())
        self._log.sync()
        return seq

    def _replay(self, seq: int, record: dict[str, Any]) -> None:
        kind = record.get("t")
        if kind == "begin":
            steps = [self._step(seq, s) for s in record["steps"]]
            self._pending = (int(record["id"]), steps)
            self._next_id = int(record["id"]) + 1
        elif kind == "done":
            self._pending = None
            self.sequences_done += 1
        elif kind == "watermark":
            self.watermark = max(self.watermark, int(record["w"]))
            self._next_id = max(self._next_id, int(record.get("next_id", 0)))
        else:
            raise CommitError(f"commit-step store {self.folder}: record {seq} has unknown type "
                              f"{kind!r}")

    def _step(self, seq: int, fields: dict[str, Any]) -> CommitStep:
        fields = dict(fields)
        kind = fields.pop("kind", None)
        factory = _KINDS.get(str(kind))
        if factory is None:
            raise CommitError(f"commit-step store {self.folder}: record {seq} names step kind "
                              f"{kind!r}, unknown here (known: {sorted(_KINDS)}); import the "
                              "module that registers it before opening the store")
        return factory(**fields)

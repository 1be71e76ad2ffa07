"""What of the master survives its restart: every application, journaled when it changes.

Each application is a few journal records: ``<app id>/plan`` (the DAG and the pickled
operators, written at submit and after a repartition: they can be large), ``<app id>``
(state, containers, committed window, failures) and one per operator, retired ones too
(its state, assignment, inputs, recovery and deploy windows, checkpoint book and totals
without the recent-window rings), each rewritten when what recovery needs of it changes.
The master saves before it answers the heartbeat or request that caused the change, so
whatever a container or user was told survives a crash of the master.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import pickle
from collections.abc import Callable
from typing import Any

from weir.master.application import Application
from weir.master.checkpoints import CheckpointBook
from weir.master.errors import Unavailable
from weir.master.journal import Journal
from weir.master.physical_plan import PTContainer, PTOperator
from weir.master.rpc import STOPPED_MESSAGE
from weir.master.savepoint_progress import WRITING
from weir.master.state_owner import StateClaim
from weir.storage import moved
from weir.storage.private_files import check_private_tree, make_private_dir

__all__ = ["ApplicationJournal", "HaltingJournal", "JournalError", "Prepared", "heartbeat_changes",
           "loop_changes"]

_LOGGER = logging.getLogger(__name__)

_WHAT = "the master's journal"
_ADVICE = "remove it, or give --state-dir a folder of your own"


class JournalError(RuntimeError):
    """A journal record cannot be turned back into an application."""


def _app_mark(app: Application) -> tuple[Any, ...]:
    """What of the application itself must be journaled again when it changes."""
    savepoint = app.savepoint
    return (app.state, app.diagnostics, app.committed_window_id, app.shutdown_requested,
            app.recoveries, app.repartitions, app.from_savepoint,
            (savepoint.path, savepoint.state, len(savepoint.written)) if savepoint else None,
            tuple((c.id, c.state, c.replaced_by, c.buffer_server_port, c.spare)
                  for c in app.plan.containers.values()))


def _operator_mark(app: Application, op: PTOperator) -> tuple[Any, ...]:
    book = app.checkpoints.get(op.id) or CheckpointBook()  # retired ones have none
    return (op.state, op.container_id, op.recovery_window_id, op.deploy_window_id,
            op.failure_count, op.failures_in_a_row, op.ready, op.generation, book.high_water,
            len(book.windows), app.repartitions)  # a repartition may rewire any operator


_STATIC_FIELDS = ("id", "name", "class_name", "type", "payload", "attributes", "inputs",
                  "outputs", "logical_name", "partition_index", "partition_count")
"""What of an operator only planning sets (and a repartition, which rewrites the plan
record): journaled once in the plan record, not in every rewrite of its own record
(profiled: pickling the whole operator was half of a heartbeat's journal write)."""
_DYNAMIC_FIELDS = tuple(f.name for f in dataclasses.fields(PTOperator)
                        if f.name not in _STATIC_FIELDS)


def _static(op: PTOperator) -> PTOperator:
    """The operator as the plan record keeps it: without its payload (kept apart)."""
    return dataclasses.replace(op, payload=b"")


def _operator_record(app: Application, op: PTOperator) -> bytes:
    """An operator's own record: its dynamic fields (named in the plan record), its
    checkpoint book and totals."""
    return pickle.dumps((_DYNAMIC_FIELDS, tuple(getattr(op, name) for name in _DYNAMIC_FIELDS),
                         app.checkpoints.get(op.id), app.operator_stats[op.id]))


def _operator_from(record: tuple[Any, ...], statics: dict[int, PTOperator], op_id: int
                   ) -> tuple[PTOperator, Any, Any]:
    """An operator back from its record: a whole one (a journal written before the plan
    record kept the static fields), or its static fields with its dynamic ones set."""
    if len(record) == 3:
        return record  # type: ignore[return-value]
    names, values, book, stats = record
    op = copy.copy(statics[op_id])
    for name, value in zip(names, values, strict=True):
        setattr(op, name, value)
    return op, book, stats


def _plan_mark(app: Application) -> int:
    """The plan record is written again when a repartition adds or retires operators."""
    return app.repartitions


def heartbeat_changes(app: Application, container: PTContainer | None) -> set[int] | None:
    """The operators a heartbeat of ``container`` may have changed, for its journal write:
    its own (retired ones too) and those ``Application.touched``; None (all) while a
    savepoint is written, which may change every operator's book."""
    touched = app.take_touched()
    if container is None or (app.savepoint is not None and app.savepoint.state == WRITING):
        return None
    return touched | set(container.operator_ids) | {
        op.id for op in app.plan.retired_in(container)}


def loop_changes(app: Application, lost: bool) -> set[int] | None:
    """The operators a pass of the master loop may have changed, for its journal write:
    every one after a loss (it redeploys everything downstream), else only those
    ``Application.touched`` (a pass changes the application's own record at most:
    containers launched), so no operator's marks are computed five times a second."""
    return None if lost else app.take_touched()


@dataclasses.dataclass(frozen=True)
class Prepared:
    """An application's changed records, pickled (``ApplicationJournal.prepare``)."""

    writes: list[tuple[str, bytes]]
    marks: dict[str, Any]


class ApplicationJournal:
    """Saves and loads applications (with their state-folder claims) in a ``Journal``.

    Records per application: ``<id>/plan`` (DAG and operator payloads, once), ``<id>``
    (the application without its operators) and ``<id>/op/<n>`` per operator (its state,
    checkpoint book and totals): a checkpoint of one operator rewrites one small record.

    The records are unpickled at load, so the folder is made owner-only, or checked with
    every segment in it (this user's, no links, writable by nobody else) before one is
    read.

    Raises:
        UntrustedPath: the folder or a file in it fails those checks (named).
    """

    def __init__(self, folder: str) -> None:
        make_private_dir(folder, _WHAT, advice=_ADVICE)
        check_private_tree(folder, _WHAT, advice=_ADVICE)
        self.journal = Journal(folder)
        self._saved: dict[str, tuple[Any, ...]] = {}

    def save(self, app: Application, claim: StateClaim | None,
             only: set[int] | None = None) -> bool:
        """Journals what changed of ``app`` since it was last saved; True if it wrote.

        What was saved is remembered only once the write (and its sync) succeeded: a
        failed write is attempted again, whole, by the next save.

        Raises:
            OSError: the journal could not be written (nothing is marked saved).
        """
        return self.commit(self.prepare(app, claim, only))

    def prepare(self, app: Application, claim: StateClaim | None,
                only: set[int] | None = None) -> Prepared:
        """The records of ``app`` that changed since it was last saved, pickled, and
        their marks: what ``commit`` writes. A new application's are prepared without
        the master's lock (no other thread sees it yet): pickling a 10,000-operator plan
        took 0.6 s, the write of it 0.15 s. ``only``: the operators that may have changed
        (a heartbeat's: its container's and those ``Application.touched``); the others'
        marks are not computed (profiled: 6 of 12 ms of a heartbeat of an application of
        1,000 operators went to marking every operator)."""
        writes = []
        marks: dict[str, Any] = {}
        key, mark = f"{app.id}/plan", _plan_mark(app)
        if self._saved.get(key) != mark:
            every = {**app.plan.operators, **app.plan.retired}
            payloads = {op_id: op.payload for op_id, op in every.items()}
            statics = {op_id: _static(op) for op_id, op in every.items()}
            writes.append((key, pickle.dumps((app.dag, payloads, set(app.plan.retired),
                                              statics))))
            marks[key] = mark
        every_op = [*app.plan.operators.values(), *app.plan.retired.values()] if only is None \
            else [op for i in only
                  if (op := app.plan.operators.get(i) or app.plan.retired.get(i)) is not None]
        for op in every_op:
            key, mark = f"{app.id}/op/{op.id}", _operator_mark(app, op)
            if self._saved.get(key) != mark:
                writes.append((key, _operator_record(app, op)))
                marks[key] = mark
        mark = _app_mark(app)
        if self._saved.get(app.id) != mark:
            writes.append((app.id, pickle.dumps((_without_operators(app), claim))))
            marks[app.id] = mark
        return Prepared(writes, marks)

    def commit(self, prepared: Prepared) -> bool:
        """Writes prepared records as one record (a crash never leaves half a change: a
        plan without its operators); True if there was anything to write.

        Raises:
            OSError: the journal could not be written (nothing is marked saved).
        """
        if not prepared.writes:
            return False
        self.journal.put_many(prepared.writes)
        self._saved.update(prepared.marks)
        return True

    def load(self) -> list[tuple[Application, StateClaim | None]]:
        """Every journaled application, in id order, with its claim."""
        records = self.journal.load()
        apps = []
        for key in sorted(k for k in records if "/" not in k):
            try:
                app, claim = moved.loads(records[key])
                dag, payloads, *rest = moved.loads(records[f"{key}/plan"])
                retired = rest[0] if rest else set()
                statics = rest[1] if len(rest) > 1 else None
                operators = {op_id: _operator_from(moved.loads(records[f"{key}/op/{op_id}"]),
                                                   statics or {}, op_id)
                             for op_id in payloads}
            except KeyError as exc:
                raise JournalError(f"journal {self.journal.folder}: application {key} has no "
                                   f"record {exc}; the journal is incomplete") from None
            except Exception as exc:  # noqa: BLE001 - any unpickling error is a bad record
                raise JournalError(f"journal {self.journal.folder}: the records of {key} "
                                   f"cannot be read back: {type(exc).__name__}: {exc}") from None
            app.dag = dag
            app.plan.retired = {}
            for op_id, (op, book, stats) in sorted(operators.items()):
                op.payload = payloads[op_id]
                if op_id in retired:
                    app.plan.retired[op_id] = op
                else:
                    app.plan.operators[op_id] = op
                    app.checkpoints[op_id] = book
                app.operator_stats[op_id] = stats
            self._saved[app.id] = _app_mark(app)
            if statics is not None:  # else written again whole at the next save: the
                self._saved[f"{app.id}/plan"] = _plan_mark(app)  # operators' records need it
            for op in [*app.plan.operators.values(), *app.plan.retired.values()]:
                self._saved[f"{app.id}/op/{op.id}"] = _operator_mark(app, op)
            apps.append((app, claim))
        return apps

    def forget(self, app: Application) -> None:
        """Deletes every record of ``app`` (one synced write).

        Raises:
            OSError: the journal could not be written.
        """
        keys = [key for key in self.journal.load()
                if key == app.id or key.startswith(f"{app.id}/")]
        for key in keys:
            self.journal.delete(key, sync=False)
        self.journal.sync()
        for key in keys:
            self._saved.pop(key, None)

    @property
    def write_seconds(self) -> float:
        return self.journal.write_seconds

    @property
    def writes(self) -> int:
        return self.journal.writes

    def close(self) -> None:
        self.journal.close()


def _without_operators(app: Application) -> Application:
    """A shallow copy of ``app`` without its DAG and operators (journaled apart)."""
    light = copy.copy(app)
    light.dag = None  # type: ignore[assignment]
    light.__dict__.pop("_described", None)  # an index of the DAG: made again on use
    light.__dict__.pop("_touched", None)  # what the next write looks at, not state
    light.__dict__.pop("_progress_facts", None)  # derived from the plan: made again on use
    light.plan = copy.copy(app.plan)
    light.plan.operators = {}
    light.plan.retired = {}
    light.checkpoints = {}
    light.operator_stats = {}
    light.launcher_actions = []
    return light


class HaltingJournal:
    """The journal as the master's core writes it: a write that fails halts the master.

    Kafka halts a broker whose log folder fails: the master may not answer what it could
    not make durable, and a master restarted on a healthy folder takes the applications
    back from the last record that was. Every later write is refused the same way.

    Args:
        journal: where the applications go.
        on_halt: told once, with the reason, when a write first fails.
    """

    def __init__(self, journal: ApplicationJournal, on_halt: Callable[[str], None]) -> None:
        self.journal = journal
        self.halted = ""  # why the master stopped serving ("" = it serves)
        self._on_halt = on_halt

    def save(self, app: Application, claim: StateClaim | None,
             prepared: Prepared | None = None, only: set[int] | None = None) -> None:
        """``ApplicationJournal.save`` (of the operators ``only``, if given; or its
        ``commit`` of ``prepared``, made without the lock); raises Unavailable once the
        journal failed."""
        if prepared is not None:
            self._write(lambda: self.journal.commit(prepared))
        else:
            self._write(lambda: self.journal.save(app, claim, only))

    def prepare(self, app: Application, claim: StateClaim | None) -> Prepared:
        """``ApplicationJournal.prepare``: pickling, nothing written."""
        return self.journal.prepare(app, claim)

    def forget(self, app: Application) -> None:
        """``ApplicationJournal.forget``; raises Unavailable once the journal failed."""
        self._write(lambda: self.journal.forget(app))

    def _write(self, write: Callable[[], object]) -> None:
        if self.halted:
            raise Unavailable(self.halted)
        try:
            write()
        except OSError as exc:
            self.halted = (f"{STOPPED_MESSAGE} it cannot write its journal "
                           f"{self.journal.journal.folder} ({exc.strerror or exc}); free the "
                           "disk and start it again on the same --state-dir: its "
                           "containers keep running and it takes them back")
            _LOGGER.critical("%s", self.halted)
            self._on_halt(self.halted)
            raise Unavailable(self.halted) from None

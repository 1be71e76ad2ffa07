"""What of the master survives its restart: every application, journaled when it changes.

Each application is two journal records: ``<app id>/plan`` (the DAG and the pickled
operators, written once at submit: they can be large) and ``<app id>`` (everything else:
state, plan assignments, operator and container states, checkpoint books, committed
window, failures, statistics without their recent-window rings), rewritten whenever
that state changes in a way that matters for recovery. The master saves before it
answers the heartbeat or request that caused the change, so whatever a container or
user was told survives a crash of the master.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import pickle
from typing import Any

from master.application import Application
from master.journal import Journal
from master.state_owner import StateClaim

__all__ = ["ApplicationJournal", "JournalError", "fingerprint"]

_LOGGER = logging.getLogger(__name__)


class JournalError(RuntimeError):
    """A journal record cannot be turned back into an application."""


def fingerprint(app: Application) -> tuple[Any, ...]:
    """What must be journaled again when it changes (cheap: runs on every heartbeat)."""
    return (
        app.state, app.diagnostics, app.committed_window_id, app.shutdown_requested,
        app.recoveries,
        tuple((op.state, op.container_id, op.recovery_window_id, op.deploy_window_id,
               op.failure_count, op.failures_in_a_row, op.ready,
               app.checkpoints[op.id].high_water, len(app.checkpoints[op.id].windows))
              for op in app.plan.operators.values()),
        tuple((c.id, c.state, c.replaced_by, c.buffer_server_port)
              for c in app.plan.containers.values()),
    )


class ApplicationJournal:
    """Saves and loads applications (with their state-folder claims) in a ``Journal``."""

    def __init__(self, folder: str) -> None:
        self.journal = Journal(folder)
        self._saved: dict[str, tuple[Any, ...]] = {}

    def save(self, app: Application, claim: StateClaim | None) -> bool:
        """Journals ``app`` if it changed since it was last saved; True if it wrote."""
        mark = fingerprint(app)
        if self._saved.get(app.id) == mark:
            return False
        if f"{app.id}/plan" not in self.journal:
            payloads = {op.id: op.payload for op in app.plan.operators.values()}
            self.journal.put(f"{app.id}/plan", pickle.dumps((app.dag, payloads)), sync=False)
        self.journal.put(app.id, pickle.dumps((_without_plan(app), claim)))
        self._saved[app.id] = mark
        return True

    def load(self) -> list[tuple[Application, StateClaim | None]]:
        """Every journaled application, in id order, with its claim."""
        records = self.journal.load()
        apps = []
        for key in sorted(k for k in records if "/" not in k):
            try:
                app, claim = pickle.loads(records[key])
                dag, payloads = pickle.loads(records[f"{key}/plan"])
            except KeyError:
                raise JournalError(f"journal {self.journal.folder}: application {key} has no "
                                   "plan record; the journal is incomplete") from None
            except Exception as exc:  # noqa: BLE001 - any unpickling error is a bad record
                raise JournalError(f"journal {self.journal.folder}: the record of {key} cannot "
                                   f"be read back: {type(exc).__name__}: {exc}") from None
            app.dag = dag
            for op in app.plan.operators.values():
                op.payload = payloads[op.id]
            self._saved[app.id] = fingerprint(app)
            apps.append((app, claim))
        return apps

    @property
    def write_seconds(self) -> float:
        return self.journal.write_seconds

    @property
    def writes(self) -> int:
        return self.journal.writes

    def close(self) -> None:
        self.journal.close()


def _without_plan(app: Application) -> Application:
    """A shallow copy of ``app`` without its DAG and operator payloads (journaled apart)."""
    light = copy.copy(app)
    light.dag = None  # type: ignore[assignment]
    light.plan = copy.copy(app.plan)
    light.plan.operators = {i: dataclasses.replace(op, payload=b"")
                            for i, op in app.plan.operators.items()}
    light.launcher_actions = []
    return light

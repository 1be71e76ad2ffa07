"""A savepoint's manifest, written once every operator wrote its part (``master.savepoints``
says when): in a thread of its own, since the store may be slow or never answer, and
neither the master's lock nor the heartbeat that completed the savepoint waits for it."""

from __future__ import annotations

import threading
from collections.abc import Callable

from weir.master import savepoints
from weir.master.application import Application
from weir.master.run_store import RunStore
from weir.storage.savepoints import Manifest

__all__ = ["ManifestWriter"]


class ManifestWriter:
    """At most one manifest write per application at a time.

    Args:
        store: writes the manifest (bounded: a store that never answers times out).
        lock: the master's lock, taken to record the outcome.
        written: told under the lock once the outcome is recorded (to journal it).
    """

    def __init__(self, store: RunStore, lock: threading.RLock,
                 written: Callable[[Application], None]) -> None:
        self.store = store
        self.lock = lock
        self.written = written
        self._writing: set[str] = set()

    def take_due(self, app: Application) -> tuple[str, Manifest] | None:
        """A manifest of ``app`` now due and not yet being written (lock held)."""
        due = savepoints.manifest_due(app)
        if due is None or app.id in self._writing:
            return None
        self._writing.add(app.id)
        return due

    def write_later(self, app: Application, path: str, manifest: Manifest) -> None:
        """Writes what ``take_due`` gave, in a thread (call without the lock)."""
        def write() -> None:
            error = self.store.write_manifest(path, manifest)
            with self.lock:
                self._writing.discard(app.id)
                savepoints.manifest_written(app, path, error)
                self.written(app)

        threading.Thread(target=write, name=f"weir-savepoint-{app.id}", daemon=True).start()

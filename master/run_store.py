"""Every store call the master makes for a run: its state folder (claim, fences) and its
savepoints (check, read, manifest), each made outside the master's lock and bounded by
``timeout_s`` (``master.store_calls``): a store may never answer."""

from __future__ import annotations

from weir.master.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument
from weir.master.run_folders import RunFolders
from weir.master.state_owner import StateClaim, first_generation
from weir.master.store_calls import STORE_TIMEOUT_S, call_store
from weir.storage.locations import redact_location
from weir.storage.savepoints import (
    Manifest,
    SavepointError,
    check_unused,
    read_manifest,
    write_manifest,
)

__all__ = ["RunStore"]


class RunStore:
    """The store side of submits, restores and savepoints (call it without the lock).

    Raises ``DeadlineExceeded`` from any call the store does not answer in time.
    """

    def __init__(self, timeout_s: float = STORE_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s

    def claim(self, state_dir: str, app_id: str, run_id: str) -> StateClaim:
        """Claims a run's state folder (``RunFolders.claim``'s errors)."""
        return call_store(lambda: RunFolders.claim(state_dir, app_id, run_id),
                          f"STATE_DIR {redact_location(state_dir)}", self.timeout_s)

    def first_generation(self, state_dir: str) -> int:
        """The generation a new run on ``state_dir`` starts at (above its fences)."""
        return call_store(lambda: first_generation(state_dir),
                          f"STATE_DIR {redact_location(state_dir)}", self.timeout_s)

    def read_savepoint(self, path: str) -> Manifest:
        """The manifest of the savepoint at ``path``.

        Raises:
            InvalidArgument: not a complete savepoint this master may read.
        """
        try:
            return call_store(lambda: read_manifest(path), self._shown(path), self.timeout_s)
        except SavepointError as exc:
            raise InvalidArgument(str(exc)) from None

    def check_unused(self, path: str) -> None:
        """Refuses a savepoint target that is in use or not ours.

        Raises:
            FailedPrecondition: it is (with why).
        """
        try:
            call_store(lambda: check_unused(path), self._shown(path), self.timeout_s)
        except SavepointError as exc:
            raise FailedPrecondition(str(exc)) from None

    def write_manifest(self, path: str, manifest: Manifest) -> str:
        """Writes a savepoint's manifest; "" when written, else why not."""
        try:
            call_store(lambda: write_manifest(path, manifest), self._shown(path),
                       self.timeout_s)
        except (SavepointError, OSError, DeadlineExceeded) as exc:
            return str(exc)
        return ""

    @staticmethod
    def _shown(path: str) -> str:
        return f"the savepoint at {redact_location(path)}"

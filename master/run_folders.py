"""The state folder of every application run the master knows: claimed while the run
lives, released when it ends, and, for a default folder, deleted once its containers
have exited (``master.state_owner`` does the claiming and deleting itself)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from weir.master.application import Application, ApplicationState
from weir.master.errors import InvalidArgument
from weir.master.state_owner import (
    StateClaim,
    claim_state_dir,
    delete_default_state_dir,
    is_default_state_dir,
    release_state_dir,
)
from weir.storage.locations import redact_location

__all__ = ["RunFolders"]

_LOGGER = logging.getLogger(__name__)


class RunFolders:
    """Claims by application id, and default folders waiting for their containers to exit.

    Not thread-safe: the master calls it under its lock, and ``claim`` and ``release``
    (which touch files, maybe a remote store) outside it. A folder is first ``reserve``d
    under the lock, so two submits racing for one folder are told apart in memory; the
    reservation becomes a claim (``hold``) once its file is written, or is dropped.
    """

    def __init__(self) -> None:
        self._claims: dict[str, StateClaim] = {}
        self._reserved: dict[str, str] = {}  # app id -> the state folder it is claiming
        self._discard: dict[str, str] = {}  # app id -> its default folder, to delete

    def reserve(self, state_dir: str, app_id: str) -> None:
        """Refuses a folder that another run of this master claims or is claiming."""
        taken = {c.state_dir: c.app_id for c in self._claims.values()}
        taken.update((folder, owner) for owner, folder in self._reserved.items())
        other = taken.get(state_dir)
        if other is not None and other != app_id:
            raise InvalidArgument(
                f"STATE_DIR {redact_location(state_dir)} is in use by application {other}; "
                "two applications must not share a state folder: give this one its own "
                "STATE_DIR (or leave it empty for a fresh private folder), or stop the other")
        self._reserved[app_id] = state_dir

    def unreserve(self, app_id: str) -> None:
        self._reserved.pop(app_id, None)

    @staticmethod
    def claim(state_dir: str, app_id: str, run_id: str) -> StateClaim:
        """Writes the run's claim file (``state_owner.claim_state_dir``'s errors); call it
        without the lock, then ``hold`` the claim."""
        return claim_state_dir(state_dir, app_id, run_id)

    def hold(self, claim: StateClaim) -> None:
        """The run's claim is written: it holds its folder until it ends."""
        self._reserved.pop(claim.app_id, None)
        self._claims[claim.app_id] = claim

    def get(self, app_id: str) -> StateClaim | None:
        return self._claims.get(app_id)

    def holds(self, app_id: str) -> bool:
        """Whether the app's folder is still claimed or waits to be deleted."""
        return app_id in self._claims or app_id in self._discard

    def ended(self, apps: Iterable[Application], all_stopped: bool, *, forever: bool = False
              ) -> tuple[list[StateClaim], list[str]]:
        """Claims of runs that ended (to release), and default folders no container uses
        any more (to delete); ``all_stopped``: every container has been stopped;
        ``forever``: no master will take any run back (one without a journal stops), so
        every run has ended."""
        apps = list(apps)
        ended = [self._claims.pop(a.id) for a in apps
                 if (a.terminal or forever) and a.id in self._claims]
        by_id = {a.id: a for a in apps}
        for claim in ended:
            self._discard_later(by_id[claim.app_id], claim.state_dir)
        discard = [self._discard.pop(a.id) for a in apps
                   if a.id in self._discard and (all_stopped or not a.plan.live_containers())]
        return ended, discard

    def _discard_later(self, app: Application, state_dir: str) -> None:
        """A finished or killed run's default folder goes; a failed run's is kept for
        inspection, and a folder the user named is never deleted."""
        if not is_default_state_dir(state_dir):
            return
        if app.state == ApplicationState.FAILED:
            _LOGGER.info("app=%s failed; its state folder %s is kept for inspection",
                         app.id, state_dir)
            return
        self._discard[app.id] = state_dir

    @staticmethod
    def release(ended: list[StateClaim], discard: list[str]) -> None:
        """Releases the claims and deletes the folders (files: call without the lock)."""
        for claim in ended:
            release_state_dir(claim)
        for state_dir in discard:
            delete_default_state_dir(state_dir)

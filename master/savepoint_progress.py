"""A savepoint an application is taking, as the master keeps it on the ``Application``
(``master.savepoints`` applies the rules over it)."""

from __future__ import annotations

import dataclasses

from weir.storage.savepoints import Manifest

__all__ = ["COMPLETE", "WRITING", "SavepointProgress"]

WRITING = "writing"
COMPLETE = "complete"


@dataclasses.dataclass
class SavepointProgress:
    """A savepoint an application is taking (or took)."""

    path: str
    written: set[int] = dataclasses.field(default_factory=set)  # operators that wrote theirs
    state: str = WRITING  # WRITING, COMPLETE, or why it failed
    stop: bool = True  # the application finishes with it
    window: int = -1  # without a stop: the window of the checkpoints it holds, once chosen
    manifest: Manifest | None = None  # every part is written: this is due, still WRITING

    @property
    def running(self) -> bool:
        """A savepoint without a stop, still being written."""
        return not self.stop and self.state == WRITING

"""The master's own thread: a pass of its periodic rules (liveness, stats listeners) at
every tick, and at once when a container process ended (``wake``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from weir.master.errors import Unavailable

__all__ = ["MasterLoop"]

_LOGGER = logging.getLogger("weir.master.core")


class MasterLoop:
    """Runs ``passes`` in turn every ``interval_s`` until stopped.

    A pass that raises is logged and the loop goes on (a bug in one pass must not stop
    liveness for good); ``Unavailable`` (the journal failed: the master halted) ends it.
    """

    def __init__(self, passes: Sequence[Callable[[], object]], interval_s: float) -> None:
        self.passes = list(passes)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="weir-master-loop", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Runs the next pass now, not at the tick."""
        self._wake.set()

    def halt(self) -> None:
        """Ends the loop after the pass under way (callable from any thread, also from a
        pass)."""
        self._stop.set()
        self._wake.set()

    def stop(self) -> None:
        """Ends the loop and waits for its thread."""
        self.halt()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval_s)  # a tick, or a container process ended
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                for run_pass in self.passes:
                    run_pass()
            except Unavailable:
                return  # halted: nothing more is decided here
            except Exception:  # noqa: BLE001 - the loop must survive a bug in one pass
                _LOGGER.exception("master loop pass failed")

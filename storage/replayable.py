"""Sources that re-read identical windows after a crash: a read position they own, plus a
window log of what each window read.

Kafka's consumer model: the input is addressed by offsets the source owns (file and byte
offset, log sequence number); the offsets are part of the checkpointed state, so a
restored source seeks back to them. That alone would replay the right data but cut it
into different windows (a window's content depends on timing); the ``WindowLog`` keeps
each window's extent so the replayed windows are the same windows, which is what lets
downstream operators and exactly-once sinks recognise them.

Effects that free input (deleting a consumed file, acknowledging a message) happen only
in ``release(window_id)``, called from ``committed``: the input of windows up to the
committed window is durable downstream (Chukwa's asynchronous acknowledgements).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

from weir.operators.attributes import ProcessingMode
from weir.operators.operator import InputOperator, OperatorContext, TransientNonState
from weir.operators.windows import format_window_id
from weir.storage.window_log import WindowLog

__all__ = ["ReplayableSource", "take_committed"]


def take_committed(ends: dict[int, Any], window_id: int) -> Any | None:
    """What the newest window at or before ``window_id`` ended at (a read position), or
    None if no such window is known; older windows are dropped from ``ends``: a ``release``
    frees input up to the committed window with it.

    >>> ends = {1: "a", 2: "b", 5: "c"}
    >>> take_committed(ends, 3), ends
    ('b', {2: 'b', 5: 'c'})
    """
    known = [w for w in ends if w <= window_id]
    if not known:
        return None
    newest = max(known)
    for w in known:
        if w != newest:
            del ends[w]
    return ends[newest]


def _unfenced() -> None:
    """The fence check of a source not set up yet: nothing to refuse."""

_LOGGER = logging.getLogger(__name__)


class ReplayableSource(TransientNonState, InputOperator):
    """Base class of a source whose windows replay identically; subclasses implement
    ``read``, ``window_record`` and, if they free input, ``release``.

    The runtime's hooks are taken here (``setup``, ``begin_window``, ``emit_tuples``,
    ``end_window``, ``committed``); a subclass that overrides one calls ``super()``.
    The window log lives in the operator's durable folder (a local ``STATE_DIR``); without
    one the source still seeks back to its checkpointed position, but a restarted source
    cuts its windows anew (at least once, not exactly once), and it says so at setup.
    """

    NON_STATE: ClassVar[tuple[str, ...]] = ("_window_log", "_replay", "_limit",
                                            "_limit_read", "_window_id", "_fence")

    # -- what a subclass implements ------------------------------------------------
    def read(self, limit: Any | None) -> bool:
        """Emits input and advances the read position.

        Args:
            limit: None = emit what is available now (a bounded amount per call); else a
                value ``window_record`` returned for this window in an earlier run: emit
                exactly that input, all of it in this call.

        Returns:
            False once the input is exhausted (a bounded source), True otherwise.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement read()")

    def window_record(self) -> Any:
        """What the current window read (JSON), enough for ``read`` to read it again; the
        subclass resets its record in ``begin_window``."""
        raise NotImplementedError(f"{type(self).__name__} must implement window_record()")

    def release(self, window_id: int) -> None:
        """The input read in windows up to ``window_id`` is durable downstream: free it."""

    def reset_non_state(self) -> None:
        """A subclass that has its own ``NON_STATE`` extends this and calls ``super()``."""
        self._window_log: WindowLog | None = None
        self._replay: dict[int, Any] = {}
        self._limit: Any | None = None
        self._limit_read = False
        self._window_id = -1
        self._fence: Callable[[], None] = _unfenced

    # -- runtime hooks -----------------------------------------------------------------
    def setup(self, context: OperatorContext) -> None:
        ReplayableSource.reset_non_state(self)
        self._fence = context.check_fence
        if context.state_dir:
            self._window_log = WindowLog(context.durable_dir("window-log"),
                                         guard=context.check_fence)
            self._replay = self._window_log.after(context.recovered_window)
            mode = context.attributes.get("PROCESSING_MODE")
            if self._replay and mode == ProcessingMode.AT_MOST_ONCE:
                self._skip_logged_windows()
        else:
            _LOGGER.warning("operator %s: no local state folder, so no window log: after a "
                            "restart its windows are cut anew (at least once)", context.name)

    def _skip_logged_windows(self) -> None:
        """AT_MOST_ONCE after a restart: the input the logged windows read was emitted
        before the failure (and maybe processed), so it is read again without being
        emitted, and the source goes on after it: those windows are lost, never repeated."""
        runtime_emit = self.emitter
        self.connect_outputs(lambda port, batch: None)
        try:
            skipped = list(self._replay)
            while self._replay:
                self.begin_window(next(iter(self._replay)))
                self.emit_tuples()
        finally:
            self.connect_outputs(runtime_emit)
        self._window_id, self._limit, self._limit_read = -1, None, False
        _LOGGER.info("%s: AT_MOST_ONCE restart skips the input of %d logged windows (%s to %s)",
                     type(self).__name__, len(skipped), format_window_id(skipped[0]),
                     format_window_id(skipped[-1]))

    def first_window(self) -> int | None:
        replay = self.__dict__.get("_replay") or {}
        return next(iter(replay), None)

    def begin_window(self, window_id: int) -> None:
        self._window_id = window_id
        replay = self.__dict__.get("_replay") or {}
        self._limit, self._limit_read = None, False
        if replay:
            first = next(iter(replay))
            if window_id != first:
                raise RuntimeError(
                    f"{type(self).__name__}: window {format_window_id(window_id)} begins but the "
                    f"window log replays window {format_window_id(first)} next; the window log "
                    f"in {self._window_log.folder} does not belong to this run")
            self._limit = replay.pop(first)

    def emit_tuples(self) -> bool:
        if self._limit is None:
            return self.read(None)
        if self._limit_read:
            return True  # the replayed window is complete: nothing more in it
        self._limit_read = True
        return self.read(self._limit)

    def end_window(self) -> None:
        log = self.__dict__.get("_window_log")
        if log is not None and self._limit is None and self._window_id >= 0:
            log.save(self._window_id, self.window_record())

    def committed(self, window_id: int) -> None:
        self._fence()  # a replaced deployment frees no input
        self.release(window_id)
        log = self.__dict__.get("_window_log")
        if log is not None:
            log.committed(window_id)

    def teardown(self) -> None:
        log = self.__dict__.get("_window_log")
        if log is not None:
            log.close()

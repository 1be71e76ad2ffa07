"""The container's driver of the window engine (``runtime.window_engine``): one thread
per operator, its input ports, the lease, the publishers and the window stats.

An input operator's windows last their wall-clock time (``emit_tuples`` is called until
it is up); any other operator waits for every open input port to begin a window and runs
it (the engine says which). Checkpoints go to the container's store; the master's
committed window reaches the operator at the next window boundary, in its own thread.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping

from weir.container.lease import Lease, LeaseRevoked
from weir.container.operator_errors import describe_error, is_fatal, is_record_error
from weir.container.port_input import InputClosed, PortInput
from weir.container.runner_needs import SYSTEM_CLOCK, Checkpointer, Clock, Publisher
from weir.container.runner_phase import RunnerPhase, RunnerState
from weir.container.runner_savepoints import SavepointDuty
from weir.container.stream_messages import Kind
from weir.container.window_stats import WindowStats
from weir.operators.operator import Operator, OperatorContext
from weir.operators.watermarks import Watermarks
from weir.operators.windows import (
    format_window_id,
    make_window_id,
    window_base_seconds,
    window_counter,
)
from weir.proto import plan_pb2, umbilical_pb2
from weir.runtime.window_engine import WindowEngine

__all__ = ["OperatorRunner"]

_LOGGER = logging.getLogger(__name__)
_IDLE_S = 0.002


class OperatorRunner:
    """Runs one deployed operator in its own thread, window by window.

    Created by the deployment on a deploy request and dropped after it stopped. Its state
    and window stats are read by the heartbeat loop.

    Args:
        operator_id: physical id.
        operator: the operator instance.
        context: what ``setup`` receives.
        publishers: output port name → publisher on this container's buffer server.
        inputs: input port name → subscription feeding it.
        start_window_millis: the application's first window time; window ids count from it.
        on_change: called when the state changes (so a heartbeat goes out at once).
        wait_for_activation: an input operator waits for ``activate()`` (the master's
            word that every operator of the application is ready) before its first window.
        checkpointer: where checkpoints go; None = no checkpoints (tests).
        resume_window: the checkpoint the operator was restored from (-1 = fresh): the
            first window it processes is the one after it.
        skip_missed_windows: an input operator restored from a checkpoint resumes at the
            current window, not the one after the checkpoint (AT_MOST_ONCE).
        stopped: the stop event, shared with the input ports' subscribers.
        lease: the container's lease: each window, checkpoint and commit waits while it
            has lapsed (None: always held, in tests).
        clock: wall and monotonic time, and idling (the real clock by default).
    """

    def __init__(self, operator_id: int, operator: Operator, context: OperatorContext,
                 publishers: Mapping[str, Publisher], inputs: Mapping[str, PortInput],
                 start_window_millis: int, on_change: Callable[[], None], *,
                 wait_for_activation: bool = False, checkpointer: Checkpointer | None = None,
                 resume_window: int = -1, skip_missed_windows: bool = False,
                 stopped: threading.Event | None = None, lease: Lease | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.operator_id = operator_id
        self.operator = operator
        self.context = context
        self.publishers = dict(publishers)
        self.inputs = dict(inputs)
        self.start_window_millis = start_window_millis
        self.window_ms = context.window_size_millis
        self.checkpointer = checkpointer
        self.generation = context.generation
        self.redeployed = context.redeployed
        self.lease = lease
        self.clock = clock
        self.engine = WindowEngine(operator, context, self.inputs, self.publishers,
                                   resume_window=resume_window,
                                   skip_missed_windows=skip_missed_windows,
                                   record_error=is_record_error)
        self._committed_pending = -1
        self._committed_arrived = threading.Event()
        self.phase = RunnerPhase.SETTING_UP
        self._set_up = False
        self.error = ""
        self.fatal = False  # the error cannot succeed on retry (``is_fatal``)
        self._on_change = on_change
        self.stopped = stopped if stopped is not None else threading.Event()
        self.end_requested = threading.Event()
        self.savepoint = SavepointDuty()  # the part it owes one
        self.activated = threading.Event()
        if not wait_for_activation:
            self.activated.set()
        self.stats = WindowStats(self.publishers, self.inputs, clock)
        self._thread = threading.Thread(target=self._run, name=f"operator-{context.name}",
                                        daemon=True)

    @property
    def suspended(self) -> bool:
        """The stream ends (or ended) for a savepoint: without END_OF_TIME."""
        return self.engine.suspended

    @property
    def marks(self) -> Watermarks:
        return self.engine.marks

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        for port in self.inputs.values():
            port.start()
        self._thread.start()

    def request_end(self, *, suspend: bool = False) -> None:
        """An input operator ends its stream after its current window; ``suspend``: for a
        savepoint, so without END_OF_TIME (event-time windows stay open in its state)."""
        self.engine.suspended |= suspend
        self.end_requested.set()

    def activate(self) -> None:
        """Lets an input operator start its windows (idempotent)."""
        self.activated.set()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stops the thread (undeploy / abort) without END_STREAM."""
        self.stopped.set()
        for port in self.inputs.values():
            port.close()
        self._thread.join(timeout=timeout_s)

    def where(self) -> str:
        """Its thread's innermost frames: a log of it not stopping says where it is stuck."""
        frame = sys._current_frames().get(self._thread.ident or -1)
        return "".join(traceback.format_stack(frame)[-6:]).rstrip() if frame else "(ended)"

    def join(self, timeout_s: float) -> bool:
        """Waits for the thread to exit; True if it has."""
        self._thread.join(timeout=timeout_s)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        """Whether the operator's thread still runs (after ``stop``: it has not exited)."""
        return self._thread.is_alive()

    def drain_stats(self) -> list[umbilical_pb2.OperatorStats]:
        """Window stats completed since the previous call."""
        return self.stats.drain()

    @property
    def state(self) -> RunnerState:
        return self.phase.state

    @property
    def ready(self) -> bool:
        """``setup()`` returned (what the master waits for before it activates sources)."""
        return self._set_up

    def _enter(self, phase: RunnerPhase) -> None:
        self.phase = self.phase.to(phase, f"operator {self.context.name} ({self.operator_id})")

    def _run(self) -> None:
        name = self.context.name
        try:
            self.engine.setup()
            self._set_up = True
            self._enter(RunnerPhase.ACTIVATING)
            self._on_change()  # ready: the master may start the sources while it activates
            self.engine.activate()
            if self.engine.is_source:
                self._enter(RunnerPhase.WAITING)
                self._on_change()
                while not self.activated.wait(0.1):
                    if self.stopped.is_set():
                        self._enter(RunnerPhase.STOPPED)
                        return
                self._enter(RunnerPhase.RUNNING)
                self._run_input()
            else:
                self._enter(RunnerPhase.RUNNING)
                self._on_change()
                self._run_generic()
            if self.stopped.is_set():
                self._enter(RunnerPhase.STOPPED)
                return
            self._enter(RunnerPhase.DRAINING)
            self._await_final_commit()
            if self.stopped.is_set():
                self._enter(RunnerPhase.STOPPED)
                return
            self.engine.teardown()
            self.savepoint.at_stream_end(self.operator_id, self.engine.last_checkpoint)
            self._enter(RunnerPhase.FINISHED)
            _LOGGER.info("operator %s (%d) finished after window %s", name, self.operator_id,
                         format_window_id(self.engine.window))
        except InputClosed as exc:
            if not self.stopped.is_set():
                self._fail(exc)
        except LeaseRevoked as exc:  # the container was replaced: it stops, writing nothing
            if not self.stopped.is_set():
                _LOGGER.warning("operator %s (%d) stops: %s", name, self.operator_id, exc)
        except Exception as exc:  # noqa: BLE001 - any operator error fails the operator
            if self.stopped.is_set():  # undeployed meanwhile: what it did next was refused
                _LOGGER.info("operator %s (%d) stopped: %s", name, self.operator_id, exc)
            else:
                self._fail(exc)
        finally:
            if self.stopped.is_set() or not self.phase.ended:
                self._enter(RunnerPhase.STOPPED)
            self._on_change()

    def _fail(self, exc: BaseException) -> None:
        """Records the failure for the master: one line (where it happened included), and
        whether retrying can help; the container log gets the full traceback, written
        before the state changes (so before any heartbeat reports the failure)."""
        self.error = describe_error(exc)
        self.fatal = is_fatal(exc)
        _LOGGER.error("operator %s (%d) failed in window %s%s: %s", self.context.name,
                      self.operator_id, format_window_id(self.engine.window),
                      " (fatal: it cannot succeed on retry)" if self.fatal else "", self.error,
                      exc_info=exc)
        self._enter(RunnerPhase.FAILED)

    # -- windows -----------------------------------------------------------------
    def _begin(self, window_id: int) -> None:
        self._hold_lease()
        self.stats.begin_ms = self.clock.now_ms()
        cpu_start = time.thread_time_ns()
        self.engine.begin(window_id)
        self.stats.cpu_ns = time.thread_time_ns() - cpu_start

    def _end(self, window_id: int, *, last: bool = False) -> None:
        """Ends a window (the engine's rules), checkpoints when it is due, records the
        window's stats and hands the operator the committed window."""
        self._hold_lease()  # the window's results (a sink's writes) come from end_window
        cpu_start = time.thread_time_ns()
        ended = self.engine.end(window_id, last=last)
        self.stats.cpu_ns += time.thread_time_ns() - cpu_start
        stats = umbilical_pb2.OperatorStats(window_id=window_id, watermark_ms=ended.watermark)
        if ended.checkpoint:
            self._checkpoint(window_id, stats)
        self.stats.record(self.engine, stats)
        self._deliver_committed()

    def _run_input(self) -> None:
        """Numbers windows from the wall clock and fills each with ``emit_tuples``."""
        engine = self.engine
        window_id = engine.first_window(
            self.start_window_millis // 1000,
            max(0, self.clock.now_ms() - self.start_window_millis) // self.window_ms)
        while not self.stopped.is_set():
            self._begin(window_id)
            deadline = self.clock.monotonic() + self.window_ms / 1000
            exhausted = False
            while not self.stopped.is_set():
                cpu_start = time.thread_time_ns()
                before = engine.emitted
                more = engine.emit_tuples()
                self.stats.cpu_ns += time.thread_time_ns() - cpu_start
                if not more:
                    exhausted = True
                    break
                remaining = deadline - self.clock.monotonic()
                if remaining <= 0:
                    break
                if engine.emitted == before:
                    self.clock.sleep(min(_IDLE_S, remaining))
            if self.stopped.is_set():
                return
            ending = exhausted or self.end_requested.is_set()
            if exhausted:
                engine.source_exhausted()
            self._end(window_id, last=ending)
            if ending:
                engine.end_stream()
                return
            window_id = make_window_id(window_base_seconds(window_id),
                                       window_counter(window_id) + 1)

    def _run_generic(self) -> None:
        """Processes aligned windows until every input port has ended its stream."""
        engine = self.engine
        open_ports = dict(self.inputs)
        while open_ports:
            heads = {}
            for name, port in list(open_ports.items()):
                head = port.peek()
                while head.kind == Kind.RESET_WINDOW:
                    port.get()
                    head = port.peek()
                if head.kind == Kind.END_STREAM:
                    end = port.get()
                    del open_ports[name]
                    engine.input_stream_ended(name, end.window_id, end.watermark)
                    continue
                if head.kind != Kind.BEGIN_WINDOW:
                    raise RuntimeError(
                        f"input port {name!r}: expected BEGIN_WINDOW, got {head.kind.name} "
                        f"of window {format_window_id(head.window_id)}")
                heads[name] = head.window_id
            if not heads:
                break
            empties, window_id = engine.align(heads)
            for empty in empties:
                self._begin(empty)
                self._end(empty)
            self._begin(window_id)
            for name in [n for n, w in heads.items() if w == window_id]:
                self._process_window(name, open_ports[name], window_id)
            self._end(window_id)
        flush = engine.flush_window()
        if flush is not None:
            self._begin(flush)
            self._end(flush, last=True)
        engine.end_stream()

    def _process_window(self, name: str, port: PortInput, window_id: int) -> None:
        port.get()  # BEGIN_WINDOW
        while True:
            message = port.get()
            if message.kind == Kind.DATA:
                cpu_start = time.thread_time_ns()
                self.engine.process(name, message.batch())
                self.stats.cpu_ns += time.thread_time_ns() - cpu_start
            elif message.kind == Kind.END_WINDOW:
                if message.window_id != window_id:
                    raise RuntimeError(
                        f"input port {name!r}: END_WINDOW {format_window_id(message.window_id)} "
                        f"inside window {format_window_id(window_id)}")
                self.engine.input_window_ended(name, message.watermark)
                return
            else:
                raise RuntimeError(f"input port {name!r}: unexpected {message.kind.name} inside "
                                   f"window {format_window_id(window_id)}")

    # -- checkpoints and commits -------------------------------------------------
    def notify_committed(self, window_id: int) -> None:
        """The master's committed window; ``committed()`` reaches the operator at the next
        window boundary, in its own thread."""
        self._committed_pending = max(self._committed_pending, window_id)
        self._committed_arrived.set()

    def _hold_lease(self) -> None:
        """Waits while the container's lease has lapsed (see ``container.lease``)."""
        if self.lease is not None:
            self.lease.wait(self.stopped)

    def _checkpoint(self, window_id: int, stats: umbilical_pb2.OperatorStats) -> None:
        """Saves the state after ``window_id`` (an application-window boundary)."""
        if self.checkpointer is None:
            return
        self._hold_lease()
        started_ms, started = self.clock.now_ms(), time.perf_counter()
        size = self.checkpointer.checkpoint(self.operator_id, window_id, self.operator)
        took_ms = round((time.perf_counter() - started) * 1000)
        stats.checkpoint.CopyFrom(plan_pb2.Checkpoint(
            window_id=window_id, application_window_count=self.engine.app_window_count,
            checkpoint_window_count=self.engine.checkpoint_window_count))
        stats.checkpoint_stats.CopyFrom(umbilical_pb2.CheckpointStats(
            checkpoint_start_time=started_ms, checkpoint_time_ms=took_ms,
            checkpoint_bytes=size or 0))
        _LOGGER.debug("operator %s (%d) checkpointed window %s in %d ms", self.context.name,
                      self.operator_id, format_window_id(window_id), took_ms)
        self.engine.checkpointed(window_id)

    def _await_final_commit(self) -> None:
        """The stream ended: checkpoint the last window and wait until it is committed.

        Teardown waits for it so that ``committed`` reaches the operator for every one of
        its windows: a source frees the input it read, an exactly-once sink publishes what
        it staged. The master commits the end of the stream once every operator checkpointed
        it (operators that ended earlier and are done hold nothing back).
        """
        engine = self.engine
        if self.checkpointer is None or engine.window < 0:
            return
        if engine.final_checkpoint_due:
            stats = umbilical_pb2.OperatorStats(  # a repeat: the master takes its
                window_id=engine.window, watermark_ms=engine.marks.current)  # checkpoint only
            self._checkpoint(engine.window, stats)
            self.stats.keep(stats)
            self._on_change()
        while not self.stopped.is_set() and engine.committed_window < engine.window:
            self._committed_arrived.wait(0.5)
            self._committed_arrived.clear()
            self._deliver_committed()

    def _has_checkpoint(self, window_id: int) -> bool:
        return self.checkpointer is not None and self.checkpointer.has(self.operator_id,
                                                                       window_id)

    def _deliver_committed(self) -> None:
        """Between windows: the committed window reaches the operator, and the part of a
        savepoint taken while it runs is written (``container.runner_savepoints``)."""
        if self.savepoint.path:
            self.savepoint.while_running(self.operator_id, self.engine.window,
                                         self._has_checkpoint)
        committed = self._committed_pending
        if committed > self.engine.committed_window:
            self._hold_lease()
            self.engine.commit(committed)
            if self.checkpointer is not None:
                self.checkpointer.committed(self.operator_id, committed)

    # -- the heartbeat -----------------------------------------------------------
    def heartbeat(self, interval_ms: int) -> umbilical_pb2.OperatorHeartbeat:
        """This operator's part of the next heartbeat."""
        return umbilical_pb2.OperatorHeartbeat(
            node_id=self.operator_id, generated_tms=self.clock.now_ms(), interval_ms=interval_ms,
            state=self.state.value, window_stats=self.drain_stats(), error=self.error,
            ready=self.ready, fatal=self.fatal, generation=self.generation,
            recovering=self.recovering, savepoint_written=self.savepoint.written,
            activating=self.phase == RunnerPhase.ACTIVATING)

    @property
    def recovering(self) -> bool:
        """A redeployed instance that has not finished a window yet (restoring its state,
        starting Spark, replaying): the master shows it RECOVERING, not ACTIVE."""
        return (self.redeployed and self.engine.windows_done == 0
                and self.state == RunnerState.ACTIVE)

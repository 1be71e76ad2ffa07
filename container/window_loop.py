"""The window loop of one operator: input alignment, application windows, window stats.

One thread per operator. An input operator numbers windows and calls ``emit_tuples``
until each window's time is up; any other operator reads its input ports, processes
window ``w`` once every open port has begun it (alignment), and forwards the markers.
Each END_WINDOW carries the operator's watermark (``container.event_time``).
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping

import pyarrow as pa

from container.event_time import SourceEventTimes, operator_watermarks
from container.lease import Lease, LeaseRevoked
from container.operator_errors import describe_error, is_fatal, is_record_error
from container.port_input import InputClosed, PortInput
from container.runner_commits import CommitSteps
from container.runner_needs import SYSTEM_CLOCK, Checkpointer, Clock, Publisher
from container.runner_phase import RunnerPhase, RunnerState
from container.runner_savepoints import SavepointDuty
from container.stream_messages import Kind
from operators.dead_letters import METRIC, dead_letters_of
from operators.metrics import collect_metrics
from operators.operator import InputOperator, Operator, OperatorContext
from operators.process_calls import ProcessCalls
from operators.watermarks import NO_WATERMARK
from operators.windows import (
    application_window_position,
    format_window_id,
    make_window_id,
    window_base_seconds,
    window_counter,
)
from proto import umbilical_pb2

__all__ = ["OperatorRunner"]

_LOGGER = logging.getLogger(__name__)
_STATS_RING = 1024
_IDLE_S = 0.002

class OperatorRunner(CommitSteps):
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
        self.app_window_count = context.application_window_count
        self.checkpoint_window_count = int(context.attributes.get("CHECKPOINT_WINDOW_COUNT", 20))
        self.checkpointer = checkpointer
        self.resume_window = resume_window
        self.skip_missed_windows = skip_missed_windows
        self.generation = context.generation
        self.redeployed = context.redeployed
        self.lease = lease
        self.clock = clock
        self._windows_done = 0  # since this deployment started
        self._checkpoint_due = False
        self._committed_pending = -1
        self._committed_delivered = -1
        self._committed_arrived = threading.Event()
        self._last_checkpoint = -1
        self.phase = RunnerPhase.SETTING_UP
        self._set_up = False
        self.error = ""
        self.fatal = False  # the error cannot succeed on retry (``is_fatal``)
        self._on_change = on_change
        self.stopped = stopped if stopped is not None else threading.Event()
        self._unconnected = dict.fromkeys(  # unconnected port -> rows there were said to
            set(operator.output_ports()) - set(self.publishers), False)  # go nowhere
        self.dead_letters = dead_letters_of(operator, context)  # ON_ERROR="DEAD_LETTER"
        declared = operator.input_ports()  # batches are cast to a declared schema, or fail
        self.calls = ProcessCalls(operator, context.name, {
            name: declared[name].schema for name in self.inputs
            if name in declared and declared[name].schema is not None}, self.dead_letters,
            is_record_error)
        self.end_requested = threading.Event()
        # a stop for a savepoint: the stream ends without END_OF_TIME (``_end_stream``)
        self.suspended = False
        self.savepoint = SavepointDuty()  # the part it owes one
        self.activated = threading.Event()
        if not wait_for_activation:
            self.activated.set()
        self._stats: collections.deque[umbilical_pb2.OperatorStats] = collections.deque(
            maxlen=_STATS_RING)
        self._stats_lock = threading.Lock()
        self._window = -1
        self._app_position = 0  # streaming windows into the current application window
        self._in_counts: dict[str, int] = dict.fromkeys(self.inputs, 0)
        self._out_counts: dict[str, int] = dict.fromkeys(self.publishers, 0)
        self._out_bytes = {p: pub.bytes_published for p, pub in self.publishers.items()}
        self._cpu_ns = 0
        self._thread = threading.Thread(target=self._run, name=f"operator-{context.name}",
                                        daemon=True)
        # the operator's watermark: its own from a checkpoint, or a new one (state)
        self.marks = operator_watermarks(operator, self.inputs, context.attributes)
        self._event_times: SourceEventTimes | None = None  # a source's, from setup on
        operator.connect_outputs(self._emit)

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        for port in self.inputs.values():
            port.start()
        self._thread.start()

    def request_end(self, *, suspend: bool = False) -> None:
        """An input operator ends its stream after its current window; ``suspend``: for a
        savepoint, so without END_OF_TIME (event-time windows stay open in its state)."""
        self.suspended |= suspend
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
        with self._stats_lock:
            stats = list(self._stats)
            self._stats.clear()
        return stats

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
            self.operator.setup(self.context)
            if isinstance(self.operator, InputOperator) and self.marks.event_time_column:
                declared = self.operator.output_ports()
                self._event_times = SourceEventTimes(
                    self.marks, f"operator {name!r}",
                    {port: declared[port].schema if port in declared else None
                     for port in self.publishers}, self.operator.WATERMARK_SPLITS)
            self._set_up = True
            if isinstance(self.operator, InputOperator):
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
            self.operator.teardown()
            self.savepoint.at_stream_end(self.operator_id, self._last_checkpoint)
            self._enter(RunnerPhase.FINISHED)
            _LOGGER.info("operator %s (%d) finished after window %s", name, self.operator_id,
                         format_window_id(self._window))
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
                      self.operator_id, format_window_id(self._window),
                      " (fatal: it cannot succeed on retry)" if self.fatal else "", self.error,
                      exc_info=exc)
        self._enter(RunnerPhase.FAILED)

    # -- emitting ----------------------------------------------------------------
    def _emit(self, port: str, batch: pa.RecordBatch) -> None:
        publisher = self.publishers.get(port)
        if publisher is None:
            if port in self._unconnected:  # nothing subscribes: nothing to keep, but say so
                if batch.num_rows and not self._unconnected[port]:
                    self._unconnected[port] = True
                    _LOGGER.warning("operator=%s emits rows on its output port %r, which is "
                                    "not connected: they go nowhere; connect it to keep "
                                    "them", self.context.name, port)
                return
            raise KeyError(f"{self.context.name} has no output port {port!r}")
        if self._window < 0:
            raise RuntimeError(f"{self.context.name} emitted on {port!r} outside a window")
        if self.calls.hold(port, batch):  # a try of rows that may fail: kept until it passed
            return
        if self._event_times is not None:
            self._event_times.emitted(port, batch)
        if batch.num_rows:
            publisher.data(self._window, batch)
            self._out_counts[port] += batch.num_rows

    # -- windows -----------------------------------------------------------------
    def _begin(self, window_id: int) -> None:
        self._hold_lease()
        self._window = window_id
        cpu_start = time.thread_time_ns()
        for publisher in self.publishers.values():
            publisher.begin_window(window_id)
        if self._app_position == 0:
            self.operator.begin_window(window_id)
            if self._windows_done == 0 and self.resume_window < 0:
                self._app_position = application_window_position(window_id,
                                                                 self.app_window_count)
        self._cpu_ns = time.thread_time_ns() - cpu_start

    def _end(self, window_id: int, *, last: bool = False) -> None:
        """Ends a window: the watermark moves first (``end_window`` sees it), then goes
        downstream with END_WINDOW on every output."""
        self._hold_lease()  # the window's results (a sink's writes) come from end_window
        cpu_start = time.thread_time_ns()
        if self._event_times is not None:
            self._event_times.expect_splits(self.operator)  # type: ignore[arg-type]
        watermark = self.marks.advance()
        self._app_position += 1
        if self._app_position >= self.app_window_count or last:
            self.operator.end_window()
            self._app_position = 0
        outgoing = self.marks.outgoing()  # the watermark, or IDLE for an idle source
        for publisher in self.publishers.values():
            publisher.end_window(window_id, outgoing)
        self._cpu_ns += time.thread_time_ns() - cpu_start
        stats = umbilical_pb2.OperatorStats(window_id=window_id, watermark_ms=watermark)
        self._checkpoint_due |= (window_counter(window_id) + 1) % self.checkpoint_window_count == 0
        if (self._checkpoint_due or last) and self._app_position == 0:
            self._checkpoint(window_id, stats)
        self._record_stats(window_id, stats)
        self._windows_done += 1
        self._deliver_committed()

    def _record_stats(self, window_id: int, stats: umbilical_pb2.OperatorStats) -> None:
        now = self.clock.now_ms()
        stats.cpu_time_used_ns = self._cpu_ns
        stats.metrics.update(collect_metrics(self.operator))  # user metrics (@metric, METRICS)
        if self.dead_letters is not None:
            stats.metrics[METRIC] = self.dead_letters.count
        for port, count in self._in_counts.items():
            stats.input_ports.add(id=port, tuple_count=count, end_window_timestamp=now,
                                  queue_size=self.inputs[port].queue_size)
        for port, count in self._out_counts.items():
            published = self.publishers[port].bytes_published
            stats.output_ports.add(id=port, tuple_count=count, end_window_timestamp=now,
                                   buffer_server_bytes=published - self._out_bytes[port])
            self._out_bytes[port] = published
        self._in_counts = dict.fromkeys(self._in_counts, 0)
        self._out_counts = dict.fromkeys(self._out_counts, 0)
        with self._stats_lock:
            self._stats.append(stats)

    def _end_stream(self) -> None:
        """END_STREAM on every output; a suspended stream says its watermark with it
        (never NO_WATERMARK, which says the stream ended: everything downstream closes)."""
        for publisher in self.publishers.values():
            if self.suspended:
                publisher.end_stream(max(self.marks.current, NO_WATERMARK + 1))
            else:
                publisher.end_stream()

    def _run_input(self) -> None:
        """Numbers windows from the wall clock and fills each with ``emit_tuples``."""
        assert isinstance(self.operator, InputOperator)
        base_seconds = self.start_window_millis // 1000
        counter = max(0, self.clock.now_ms() - self.start_window_millis) // self.window_ms
        if self.resume_window >= 0:  # restored: carry on after the checkpointed window
            base_seconds = window_base_seconds(self.resume_window)
            after = window_counter(self.resume_window) + 1
            counter = max(after, counter) if self.skip_missed_windows else after
        elif (replay := self.operator.first_window()) is not None:
            # no checkpoint yet, but an earlier instance logged windows: replay them
            base_seconds, counter = window_base_seconds(replay), window_counter(replay)
        while not self.stopped.is_set():
            window_id = make_window_id(base_seconds, counter)
            self._begin(window_id)
            deadline = self.clock.monotonic() + self.window_ms / 1000
            exhausted = False
            while not self.stopped.is_set():
                cpu_start = time.thread_time_ns()
                before = sum(self._out_counts.values())
                more = self.operator.emit_tuples()
                self._cpu_ns += time.thread_time_ns() - cpu_start
                if not more:
                    exhausted = True
                    break
                remaining = deadline - self.clock.monotonic()
                if remaining <= 0:
                    break
                if sum(self._out_counts.values()) == before:
                    self.clock.sleep(min(_IDLE_S, remaining))
            if self.stopped.is_set():
                return
            ending = exhausted or self.end_requested.is_set()
            if exhausted:  # nothing older can come: every event-time window closes
                self.marks.ended()
            self._end(window_id, last=ending)
            if ending:
                self._end_stream()
                return
            counter += 1

    def _run_generic(self) -> None:
        """Processes aligned windows until every input port has ended its stream."""
        open_ports = dict(self.inputs)
        last_window = self.resume_window
        ended_at = -1  # the newest window an input's END_STREAM says its stream reached
        while open_ports:
            heads = {}
            for name, port in list(open_ports.items()):
                head = port.peek()
                while head.kind == Kind.RESET_WINDOW:
                    port.get()
                    head = port.peek()
                if head.kind == Kind.END_STREAM:
                    end = port.get()
                    ended_at = max(ended_at, end.window_id)
                    del open_ports[name]
                    if end.watermark == NO_WATERMARK:
                        self.marks.port_ended(name)  # it holds the watermark back no more
                    else:  # stopped for a savepoint: its watermark stays where it was
                        self.suspended = True
                    continue
                if head.kind != Kind.BEGIN_WINDOW:
                    raise RuntimeError(
                        f"input port {name!r}: expected BEGIN_WINDOW, got {head.kind.name} "
                        f"of window {format_window_id(head.window_id)}")
                heads[name] = head.window_id
            if not heads:
                break
            window_id = min(heads.values())
            if window_id <= last_window:
                raise RuntimeError(f"window {format_window_id(window_id)} arrived after window "
                                   f"{format_window_id(last_window)}: windows must increase")
            if last_window >= 0 and not self.skip_missed_windows:
                # Each port's windows follow one another (PortInput checks); between ports,
                # one may end before another begins: the windows in between are empty.
                for empty in range(last_window + 1, window_id):
                    self._begin(empty)
                    self._end(empty)
            self._begin(window_id)
            for name in [n for n, w in heads.items() if w == window_id]:
                self._process_window(name, open_ports[name], window_id)
            self._end(window_id)
            last_window = window_id
        if self._app_position or ended_at > last_window:
            # The stream ended inside an application window: flush it in one more window.
            # Or it ended after windows this operator skipped (AT_MOST_ONCE): it ends at
            # the inputs' end too, so that its upstream can commit its last window.
            window_id = max(last_window + 1, ended_at)
            self._begin(window_id)
            self._end(window_id, last=True)
        self._end_stream()

    def _process_window(self, name: str, port: PortInput, window_id: int) -> None:
        port.get()  # BEGIN_WINDOW
        while True:
            message = port.get()
            if message.kind == Kind.DATA:
                cpu_start = time.thread_time_ns()
                self.calls.process(name, message.batch(), self._window, self._emit)
                self._cpu_ns += time.thread_time_ns() - cpu_start
                self._in_counts[name] += message.rows
            elif message.kind == Kind.END_WINDOW:
                if message.window_id != window_id:
                    raise RuntimeError(
                        f"input port {name!r}: END_WINDOW {format_window_id(message.window_id)} "
                        f"inside window {format_window_id(window_id)}")
                self.marks.saw_input(name, message.watermark)
                return
            else:
                raise RuntimeError(f"input port {name!r}: unexpected {message.kind.name} inside "
                                   f"window {format_window_id(window_id)}")

    def heartbeat(self, interval_ms: int) -> umbilical_pb2.OperatorHeartbeat:
        """This operator's part of the next heartbeat."""
        return umbilical_pb2.OperatorHeartbeat(
            node_id=self.operator_id, generated_tms=self.clock.now_ms(), interval_ms=interval_ms,
            state=self.state.value, window_stats=self.drain_stats(), error=self.error,
            ready=self.ready, fatal=self.fatal, generation=self.generation,
            recovering=self.recovering, savepoint_written=self.savepoint.written)

    @property
    def recovering(self) -> bool:
        """A redeployed instance that has not finished a window yet (restoring its state,
        starting Spark, replaying): the master shows it RECOVERING, not ACTIVE."""
        return (self.redeployed and self._windows_done == 0
                and self.state == RunnerState.ACTIVE)

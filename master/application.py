"""One submitted application as the master sees it: its plan, state, stats and diagnostics.

Created by ``MasterCore.submit``; kept (terminal ones too) until the master stops, so
users can still ask about an application after it ended.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
from typing import TYPE_CHECKING, Any

from weir.master.checkpoint_book import CheckpointBook
from weir.master.errors import InvalidTransition
from weir.master.log_limits import LogLimiter
from weir.master.physical_plan import ContainerState, PhysicalPlan
from weir.master.stats import ContainerStatsTracker, OperatorStatsTracker
from weir.proto import plan_pb2

if TYPE_CHECKING:
    from weir.master.savepoint_progress import SavepointProgress

__all__ = ["Application", "ApplicationState", "LaunchKind", "LauncherAction", "ReportedError"]

_LOGGER = logging.getLogger(__name__)

_REPORTED_ERRORS_KEPT = 50


class ApplicationState(enum.Enum):
    """ACCEPTED -> RUNNING -> FINISHED | FAILED | KILLED."""

    ACCEPTED = "ACCEPTED"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({ApplicationState.FINISHED, ApplicationState.FAILED,
                       ApplicationState.KILLED})

_APP_NEXT: dict[ApplicationState, frozenset[ApplicationState]] = {
    ApplicationState.ACCEPTED: frozenset({ApplicationState.RUNNING, *_TERMINAL}),
    ApplicationState.RUNNING: _TERMINAL,
    ApplicationState.FINISHED: frozenset(),
    ApplicationState.FAILED: frozenset(),
    ApplicationState.KILLED: frozenset(),
}


class LaunchKind(enum.StrEnum):
    """What a ``LauncherAction`` asks of the launcher."""

    KILL = "kill"
    LAUNCH = "launch"


@dataclasses.dataclass(frozen=True)
class LauncherAction:
    """A container process to kill or launch, decided under the master's lock.

    The rules queue these on the application; the master carries them out after
    releasing its lock (a launcher may block).
    """

    kind: LaunchKind
    container_id: str
    dump_threads: bool = False  # a kill of a live process the master gave up on


@dataclasses.dataclass(frozen=True)
class ReportedError:
    """An error reported on the application: by a container (``source`` is its id) or by
    the master itself (``source`` is ``master``), shown among its recent failures."""

    time_ms: int
    source: str
    message: str


class Application:
    """An application's plan, state and statistics.

    Class-level defaults stand in for attributes added after a journal was written.

    Args:
        app_id: e.g. ``app-0001``.
        dag: the submitted (validated) DAG.
        plan: its physical plan.
        submitted_ms: when it was accepted (epoch ms).
    """

    repartitions = 0  # run-time changes of an operator's partition count
    savepoint: SavepointProgress | None = None  # the one being taken, or the last taken
    from_savepoint = ""  # the savepoint this run started from
    last_repartition = ""
    last_repartition_ms = 0
    spare_losses_in_a_row = 0  # spares lost before they were ready (``master.spares``)
    restart_at_ms = 0  # operators being restarted deploy from then on (``recovery.backoff``)
    restart_delay_ms = 0  # the delay of the last restart (0: at once)
    # the progress watchdog (``master.progress``): the committed window it last saw move,
    # when, the sources' emitted total then, and since when no window committed (0: none)
    progress_committed = -2
    progress_since_ms = 0
    progress_emitted = 0
    stalled_since_ms = 0

    def __init__(self, app_id: str, dag: plan_pb2.DagDescriptor, plan: PhysicalPlan,
                 submitted_ms: int) -> None:
        self.id = app_id
        self.dag = dag
        self.plan = plan
        self.state = ApplicationState.ACCEPTED
        self.diagnostics = ""
        self.submitted_ms = submitted_ms
        self.running_ms = 0
        self.finished_ms = 0
        # Window ids count from whole seconds: base seconds = start_window_millis // 1000.
        self.start_window_millis = submitted_ms - submitted_ms % 1000
        self.committed_window_id = -1
        self.blocked_checked_ms = 0  # when the master loop last looked for blocked operators
        self.shutdown_requested = False
        self.operator_stats = {op_id: OperatorStatsTracker() for op_id in plan.operators}
        self.container_stats = {cid: ContainerStatsTracker() for cid in plan.containers}
        self.checkpoints = {op_id: CheckpointBook() for op_id in plan.operators}
        self.reported_errors: collections.deque[ReportedError] = collections.deque(
            maxlen=_REPORTED_ERRORS_KEPT)
        self.recoveries = 0  # containers replaced
        self.last_recovery = ""
        self.last_recovery_ms = 0
        self.launcher_actions: list[LauncherAction] = []
        # Warnings a container can trigger in every heartbeat are rate-limited per kind.
        self.log_limits = LogLimiter()

    @property
    def name(self) -> str:
        return self.plan.name

    def touched(self, op_id: int) -> None:
        """Notes that an operator's journaled figures may have changed outside the
        heartbeating container (its recovery window moved, its book was pruned): the
        heartbeat's journal write looks at it too (``persistence.ApplicationJournal``)."""
        self.__dict__.setdefault("_touched", set()).add(op_id)

    def take_touched(self) -> set[int]:
        """The operators ``touched`` since the last journal write, forgotten."""
        return self.__dict__.pop("_touched", set())

    def described(self, logical_name: str) -> plan_pb2.OperatorDescriptor | None:
        """The DAG's descriptor of an operator, by name: an index made on first use (a
        deploy asks once per operator; a scan each time made a 10,000-operator
        application's first deploys quadratic), not kept in the journal."""
        index: dict[str, plan_pb2.OperatorDescriptor] | None = self.__dict__.get("_described")
        if index is None:
            index = self.__dict__["_described"] = {op.name: op for op in self.dag.operators}
        return index.get(logical_name)

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    def attribute(self, name: str) -> Any:
        """A resolved DAG attribute, typed."""
        return self.plan.attributes[name]

    @property
    def heartbeat_timeout_ms(self) -> int:
        return int(self.attribute("HEARTBEAT_TIMEOUT_MILLIS"))

    def all_containers_active(self) -> bool:
        """Every container not given up on is ACTIVE (lost ones were replaced); spares do
        not count: nothing waits for a spare to start."""
        live = self.plan.working_containers()
        return bool(live) and all(c.state == ContainerState.ACTIVE for c in live)

    def take_launcher_actions(self) -> list[LauncherAction]:
        """The queued kills and launches, emptied; kills first."""
        actions, self.launcher_actions = self.launcher_actions, []
        return sorted(actions, key=lambda a: a.kind != LaunchKind.KILL)

    def transition(self, to: ApplicationState, now_ms: int, diagnostics: str = "") -> bool:
        """Moves to ``to``; False if already there; raises InvalidTransition if not allowed."""
        if to == self.state:
            return False
        if to not in _APP_NEXT[self.state]:
            raise InvalidTransition(f"application {self.id}", self.state, to)
        self.state = to
        if diagnostics:
            self.diagnostics = diagnostics
        if to == ApplicationState.RUNNING:
            self.running_ms = now_ms
        if to.terminal:
            self.finished_ms = now_ms
        level = logging.WARNING if to == ApplicationState.FAILED else logging.INFO
        _LOGGER.log(level, "app=%s %s%s", self.id, to.value,
                    f": {diagnostics}" if diagnostics else "")
        return True

    def report_error(self, source: str, message: str, now_ms: int) -> bool:
        """Keeps an error among the last ``_REPORTED_ERRORS_KEPT``, unless it repeats the
        last one from the same source; True if kept."""
        last = self.reported_errors[-1] if self.reported_errors else None
        if last is not None and (last.source, last.message) == (source, message):
            return False
        self.reported_errors.append(ReportedError(now_ms, source, message))
        return True

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A journal written before errors had a time and source kept them as text
        (``<source> <message>``)."""
        errors = state.get("reported_errors")
        if errors and isinstance(errors[0], str):
            parts = [(text.split(" ", 1) + [""])[:2] for text in errors]
            state["reported_errors"] = collections.deque(
                (ReportedError(0, source.rstrip(":"), message) for source, message in parts),
                maxlen=_REPORTED_ERRORS_KEPT)
        self.__dict__.update(state)

    def fail(self, diagnostics: str, now_ms: int) -> bool:
        """FAILED with ``diagnostics`` unless already terminal; True if it changed."""
        if self.terminal:
            return False
        return self.transition(ApplicationState.FAILED, now_ms, diagnostics)

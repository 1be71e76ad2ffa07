"""An operator runner's phases and the moves between them: the container's side of the
discipline the master keeps with its states (``master.physical_plan.OperatorState``).

>>> RunnerPhase.SETTING_UP.to(RunnerPhase.ACTIVATING, "op").to(RunnerPhase.RUNNING, "op")
<RunnerPhase.RUNNING: 'running'>
>>> RunnerPhase.RUNNING.to(RunnerPhase.DRAINING, "op")
<RunnerPhase.DRAINING: 'draining'>
>>> RunnerPhase.FINISHED.to(RunnerPhase.STOPPED, "op").state
<RunnerState.SHUTDOWN: 2>
"""

from __future__ import annotations

import enum

from weir.proto import umbilical_pb2

__all__ = ["RunnerPhase", "RunnerState"]


class RunnerState(enum.Enum):
    """What the master hears of a runner (derived from its phase)."""

    ACTIVE = umbilical_pb2.OPERATOR_STATE_ACTIVE
    SHUTDOWN = umbilical_pb2.OPERATOR_STATE_SHUTDOWN
    FAILED = umbilical_pb2.OPERATOR_STATE_FAILED


class RunnerPhase(enum.Enum):
    """Where a runner's thread is; it only moves along ``_NEXT_PHASES``."""

    SETTING_UP = "setting up"  # setup() runs
    ACTIVATING = "activating"  # activate() runs (Spark starting, warming); sources may run
    WAITING = "waiting for activation"  # an input operator, until the master says go
    RUNNING = "running"  # windows
    DRAINING = "draining"  # the stream ended: the final checkpoint waits to be committed
    FINISHED = "finished"  # torn down after its last window was committed
    FAILED = "failed"
    STOPPED = "stopped"  # undeployed, aborted or replaced: it writes nothing more

    @property
    def state(self) -> RunnerState:
        return {RunnerPhase.FINISHED: RunnerState.SHUTDOWN,
                RunnerPhase.FAILED: RunnerState.FAILED}.get(self, RunnerState.ACTIVE)

    @property
    def ended(self) -> bool:
        return self in _ENDED

    def to(self, phase: RunnerPhase, who: str) -> RunnerPhase:
        """The phase after moving to ``phase``: an ended runner stays ended (a late
        STOPPED is ignored); a move ``_NEXT_PHASES`` does not allow is a bug.

        Raises:
            RuntimeError: naming ``who`` and the transition.
        """
        if phase is self or self in _ENDED:
            return self
        if phase not in _NEXT_PHASES[self]:
            raise RuntimeError(f"{who}: no transition {self.name} -> {phase.name}")
        return phase


_ENDED = frozenset({RunnerPhase.FINISHED, RunnerPhase.FAILED, RunnerPhase.STOPPED})
_NEXT_PHASES: dict[RunnerPhase, frozenset[RunnerPhase]] = {
    RunnerPhase.SETTING_UP: frozenset({RunnerPhase.ACTIVATING}) | _ENDED,
    RunnerPhase.ACTIVATING: frozenset({RunnerPhase.WAITING, RunnerPhase.RUNNING}) | _ENDED,
    RunnerPhase.WAITING: frozenset({RunnerPhase.RUNNING}) | _ENDED,
    RunnerPhase.RUNNING: frozenset({RunnerPhase.DRAINING}) | _ENDED,
    RunnerPhase.DRAINING: _ENDED,
    RunnerPhase.FINISHED: frozenset(),
    RunnerPhase.FAILED: frozenset(),
    RunnerPhase.STOPPED: frozenset(),
}

"""What a heartbeat's answer asks of a container, as instructions: a pure step (dask's
``WorkerState.handle_stimulus`` pattern), so the rules are read and tested apart from the
threads and processes that carry them out (``container.heartbeat_loop``).

>>> reply = umbilical_pb2.ContainerHeartbeatResponse(activate_request=[3],
...                                                  committed_window_id=12)
>>> instructions(reply, committed_window_id=10)
[Activate(operator_ids=(3,)), Commit(window_id=12)]
>>> instructions(umbilical_pb2.ContainerHeartbeatResponse(
...     shutdown=umbilical_pb2.SHUTDOWN_TYPE_ABORT), committed_window_id=-1)
[Abort()]
"""

from __future__ import annotations

import dataclasses

from weir.proto import plan_pb2, umbilical_pb2

__all__ = ["Abort", "Activate", "Commit", "EndInputs", "Instruction", "Redeploy",
           "TakeSavepoint", "instructions"]


@dataclasses.dataclass(frozen=True)
class Abort:
    """The master gave up on this container: it acts no more and exits."""


@dataclasses.dataclass(frozen=True)
class Redeploy:
    """Undeploy these operators, then deploy those (in the deploy queue, in order)."""

    undeploy: tuple[int, ...]
    deploy: tuple[plan_pb2.OperatorDeployInfo, ...]


@dataclasses.dataclass(frozen=True)
class Activate:
    """These input operators may start their windows (every operator is ready)."""

    operator_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class EndInputs:
    """The application shuts down gracefully: input operators end their streams; with a
    ``savepoint_path``, for a savepoint (no END_OF_TIME; operators write their parts)."""

    savepoint_path: str = ""


@dataclasses.dataclass(frozen=True)
class TakeSavepoint:
    """A savepoint while the application runs: operators write their checkpoint of
    ``window_id`` under ``path``."""

    path: str
    window_id: int


@dataclasses.dataclass(frozen=True)
class Commit:
    """A newer committed window: operators hear of it, the buffer server forgets it."""

    window_id: int


Instruction = Abort | Redeploy | Activate | EndInputs | TakeSavepoint | Commit


def instructions(response: umbilical_pb2.ContainerHeartbeatResponse,
                 committed_window_id: int) -> list[Instruction]:
    """What ``response`` asks, in the order to carry it out; ``committed_window_id``: the
    newest committed window this container already heard of (older ones are no news)."""
    if response.shutdown == umbilical_pb2.SHUTDOWN_TYPE_ABORT:
        return [Abort()]
    steps: list[Instruction] = []
    if response.undeploy_request or response.deploy_request:
        steps.append(Redeploy(tuple(response.undeploy_request),
                              tuple(response.deploy_request)))
    if response.activate_request:
        steps.append(Activate(tuple(response.activate_request)))
    if response.shutdown == umbilical_pb2.SHUTDOWN_TYPE_WAIT_TERMINATE:
        steps.append(EndInputs(response.savepoint_path))
    elif response.savepoint_path:
        steps.append(TakeSavepoint(response.savepoint_path, response.savepoint_window_id))
    if response.committed_window_id > committed_window_id:
        steps.append(Commit(response.committed_window_id))
    return steps

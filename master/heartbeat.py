"""Apex's heartbeat and liveness rules as pure functions: state and a message in, a decision out.

No threads, sockets or clocks here: the caller passes the time and holds the lock, so
tests step the protocol with hand-built heartbeats and a manual clock.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from master.application import Application, ApplicationState
from master.physical_plan import ContainerState, OperatorState, PTContainer, PTOperator
from operators.windows import format_window_id
from proto import plan_pb2, umbilical_pb2

__all__ = [
    "ContainerLoss",
    "abort_response",
    "check_liveness",
    "deploy_info",
    "lose_container",
    "process_heartbeat",
]

_LOGGER = logging.getLogger(__name__)


def abort_response() -> umbilical_pb2.ContainerHeartbeatResponse:
    """The answer to a container that must stop now."""
    return umbilical_pb2.ContainerHeartbeatResponse(
        shutdown=umbilical_pb2.SHUTDOWN_TYPE_ABORT, committed_window_id=-1)


def process_heartbeat(app: Application | None, heartbeat: umbilical_pb2.ContainerHeartbeat,
                      now_ms: int) -> umbilical_pb2.ContainerHeartbeatResponse:
    """Applies one container heartbeat to ``app`` and returns the container's orders.

    Rules (Apex's ``processHeartbeat``): an unknown or killed container gets ABORT; the
    first heartbeat records the buffer-server address and makes the container ACTIVE;
    reported operator states move the plan's operators; deploy requests go out only when
    every container of the application is ACTIVE and are repeated until the operator is
    reported; a terminal application answers ABORT.

    Args:
        app: the application owning ``heartbeat.container_id``, or None if unknown.
        heartbeat: the container's message.
        now_ms: the master's time (epoch ms).
    """
    cid = heartbeat.container_id
    container = app.plan.container(cid) if app is not None else None
    if app is None or container is None:
        _LOGGER.warning("container=%s heartbeat from an unknown container; answering ABORT", cid)
        return abort_response()
    if container.state == ContainerState.KILLED:
        _LOGGER.info("container=%s heartbeat from a killed container (%s); answering ABORT",
                     cid, container.diagnostics)
        return abort_response()
    app.container_stats[cid].record(heartbeat, now_ms)
    _LOGGER.debug("app=%s container=%s heartbeat: %d operators", app.id, cid,
                  len(heartbeat.stats.operators))
    if container.state != ContainerState.ACTIVE:
        _activate(app, container, heartbeat, now_ms)
    if heartbeat.restart_requested and not app.terminal:
        lose_container(app, container, "it asked to be restarted (its buffer server failed)",
                       now_ms)
        return abort_response()
    response = umbilical_pb2.ContainerHeartbeatResponse(
        committed_window_id=app.committed_window_id)
    reported = _apply_operator_reports(app, container, heartbeat, now_ms, response)
    if not app.terminal and app.all_containers_active():
        app.transition(ApplicationState.RUNNING, now_ms)
    if not app.terminal and all(op.state == OperatorState.SHUTDOWN
                                for op in app.plan.operators.values()):
        app.transition(ApplicationState.FINISHED, now_ms)
    if app.terminal:
        response.shutdown = umbilical_pb2.SHUTDOWN_TYPE_ABORT
        return response
    pending = [op for op in app.plan.operators_in(container)
               if op.state == OperatorState.PENDING_DEPLOY and op.id not in reported]
    if pending and container.state == ContainerState.ACTIVE and app.all_containers_active():
        for op in pending:
            response.deploy_request.append(deploy_info(app, op))
        _LOGGER.debug("app=%s container=%s deploy %s", app.id, cid, [op.name for op in pending])
    response.has_pending_requests = bool(pending)
    if _all_ready(app):
        response.activate_request.extend(
            op.id for op in app.plan.operators_in(container)
            if op.is_input and op.state == OperatorState.ACTIVE)
    if app.shutdown_requested:
        response.shutdown = umbilical_pb2.SHUTDOWN_TYPE_WAIT_TERMINATE
    return response


def _all_ready(app: Application) -> bool:
    """Every operator has finished setup (or already ended): inputs may start."""
    return all(op.ready or op.terminal for op in app.plan.operators.values())


def _activate(app: Application, container: PTContainer,
              heartbeat: umbilical_pb2.ContainerHeartbeat, now_ms: int) -> None:
    if not heartbeat.buffer_server_host or not heartbeat.buffer_server_port:
        _LOGGER.warning("app=%s container=%s heartbeat without a buffer-server address; the "
                        "container stays %s until it sends one", app.id, container.id,
                        container.state.value)
        return
    if container.state == ContainerState.NEW:  # started by hand, not by our launcher
        container.transition(ContainerState.ALLOCATED)
        container.allocated_ms = now_ms
    container.transition(ContainerState.ACTIVE)
    container.activated_ms = now_ms
    container.buffer_server_host = heartbeat.buffer_server_host
    container.buffer_server_port = heartbeat.buffer_server_port
    _LOGGER.info("app=%s container=%s ACTIVE: process %s, buffer server %s", app.id,
                 container.id, heartbeat.jvm_name or "?", container.buffer_server_address)


def _apply_operator_reports(app: Application, container: PTContainer,
                            heartbeat: umbilical_pb2.ContainerHeartbeat, now_ms: int,
                            response: umbilical_pb2.ContainerHeartbeatResponse) -> set[int]:
    """Moves operators to their reported states; returns the ids reported."""
    reported: set[int] = set()
    for report in heartbeat.stats.operators:
        op = app.plan.operators.get(report.node_id)
        if op is None or op.container_id != container.id:
            _LOGGER.warning("app=%s container=%s reports operator %d that is not planned "
                            "there; undeploying it", app.id, container.id, report.node_id)
            response.undeploy_request.append(report.node_id)
            continue
        reported.add(op.id)
        op.ready = op.ready or report.ready
        tracker = app.operator_stats[op.id]
        if tracker.record(report, now_ms):
            _LOGGER.debug("app=%s operator=%s window %s", app.id, op.name,
                          format_window_id(tracker.current_window_id))
        _apply_state(app, container, op, report, now_ms)
    return reported


def _apply_state(app: Application, container: PTContainer, op: PTOperator,
                 report: umbilical_pb2.OperatorHeartbeat, now_ms: int) -> None:
    if op.terminal:
        return  # SHUTDOWN and FAILED are final until recovery exists
    if report.state == umbilical_pb2.OPERATOR_STATE_ACTIVE:
        if op.transition(OperatorState.ACTIVE):
            _LOGGER.info("app=%s container=%s operator=%s (%d) ACTIVE", app.id, container.id,
                         op.name, op.id)
    elif report.state == umbilical_pb2.OPERATOR_STATE_SHUTDOWN:
        op.transition(OperatorState.SHUTDOWN)
        _LOGGER.info("app=%s container=%s operator=%s (%d) SHUTDOWN (its stream ended)",
                     app.id, container.id, op.name, op.id)
    elif report.state == umbilical_pb2.OPERATOR_STATE_FAILED:
        op.transition(OperatorState.FAILED)
        op.failure_count += 1
        op.error = report.error or "failed without an error message"
        _LOGGER.warning("app=%s container=%s operator=%s (%d) FAILED: %s", app.id,
                        container.id, op.name, op.id, op.error)
        app.fail(f"operator {op.name!r} ({op.id}) failed in container {container.id}: "
                 f"{op.error}", now_ms)


def deploy_info(app: Application, op: PTOperator) -> plan_pb2.OperatorDeployInfo:
    """What a container needs to run ``op``: payload, attributes and every port's stream.

    Inputs name the upstream operator's container buffer server and the stream
    ``(source_node_id, source_port_name)``; outputs name the operator's own container's.
    """
    own = app.plan.containers[op.container_id]
    info = plan_pb2.OperatorDeployInfo(
        id=op.id, name=op.name, type=op.type, class_name=op.class_name, payload=op.payload,
        checkpoint=plan_pb2.Checkpoint(window_id=op.recovery_window_id),
        context_attributes=op.attribute_text())
    for link in op.inputs:
        upstream = app.plan.container_of(link.source_operator_id)
        info.inputs.add(
            port_name=link.port_name, declared_stream_id=link.stream_name,
            source_node_id=link.source_operator_id, source_port_name=link.source_port_name,
            buffer_server_host=upstream.buffer_server_host,
            buffer_server_port=upstream.buffer_server_port)
    for link in op.outputs:
        info.outputs.add(
            port_name=link.port_name, declared_stream_id=link.stream_name,
            buffer_server_host=own.buffer_server_host, buffer_server_port=own.buffer_server_port)
    return info


@dataclasses.dataclass(frozen=True)
class ContainerLoss:
    """A container the liveness check gave up on; its process must be killed."""

    container_id: str
    cause: str


def lose_container(app: Application, container: PTContainer, cause: str,
                   now_ms: int) -> ContainerLoss:
    """Marks ``container`` KILLED; until recovery exists, its application fails with it."""
    container.transition(ContainerState.KILLED)
    container.finished_ms = now_ms
    container.diagnostics = cause
    container.buffer_server_host, container.buffer_server_port = "", 0
    if app.terminal:
        _LOGGER.info("app=%s container=%s stopped: %s", app.id, container.id, cause)
        return ContainerLoss(container.id, cause)
    _LOGGER.warning("app=%s container=%s lost: %s", app.id, container.id, cause)
    for op in app.plan.operators_in(container):
        if not op.terminal:
            op.transition(OperatorState.FAILED)
            op.failure_count += 1
            op.error = f"container {container.id} lost: {cause}"
    app.fail(f"container {container.id} lost: {cause}", now_ms)
    return ContainerLoss(container.id, cause)


def check_liveness(app: Application, now_ms: int, exit_codes: Mapping[str, int | None],
                   stop_grace_ms: int) -> list[ContainerLoss]:
    """The containers of ``app`` to give up on now, already marked KILLED.

    A container is lost when its process exited, when it sent no heartbeat for
    HEARTBEAT_TIMEOUT_MILLIS, or when it never sent one within twice that after its
    launch. Once the application is terminal, containers that exited are recorded and
    those still running ``stop_grace_ms`` after the end are stopped.

    Args:
        app: the application.
        now_ms: the master's time.
        exit_codes: container id -> exit code, None while running (from the launcher).
        stop_grace_ms: how long containers of an ended application may take to exit.
    """
    timeout_ms = app.heartbeat_timeout_ms
    losses: list[ContainerLoss] = []
    for container in app.plan.containers.values():
        if container.state == ContainerState.KILLED:
            continue
        cause = _cause(app, container, now_ms, exit_codes.get(container.id), timeout_ms,
                       stop_grace_ms)
        if cause:
            losses.append(lose_container(app, container, cause, now_ms))
    return losses


def _cause(app: Application, container: PTContainer, now_ms: int, exit_code: int | None,
           timeout_ms: int, stop_grace_ms: int) -> str:
    if app.terminal:
        if container.state == ContainerState.NEW:
            return f"never launched: the application is {app.state.value}"
        if exit_code is not None:
            return f"exited with code {exit_code} after the application ended"
        if now_ms - app.finished_ms >= stop_grace_ms:
            return (f"still running {(now_ms - app.finished_ms) / 1000:.1f} s after the "
                    "application ended; stopped")
        return ""
    if container.state == ContainerState.NEW:
        return ""
    if exit_code is not None:
        return f"its process exited with code {exit_code}"
    if container.state == ContainerState.ACTIVE:
        silent_ms = now_ms - app.container_stats[container.id].last_heartbeat_ms
        if silent_ms > timeout_ms:
            return (f"no heartbeat for {silent_ms} ms "
                    f"(HEARTBEAT_TIMEOUT_MILLIS={timeout_ms})")
    elif container.state == ContainerState.ALLOCATED:
        waited_ms = now_ms - container.allocated_ms
        if waited_ms > 2 * timeout_ms:
            return (f"never sent a heartbeat within {waited_ms} ms of its launch "
                    f"(2 x HEARTBEAT_TIMEOUT_MILLIS={timeout_ms})")
    return ""

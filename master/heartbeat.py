"""Apex's heartbeat rules as pure functions: state and a message in, a decision out.

No threads, sockets or clocks here: the caller passes the time and holds the lock, so
tests step the protocol with hand-built heartbeats and a manual clock. Liveness lives in
``liveness`` and the recovery cascade in ``recovery``.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging

from weir.master import savepoints, spares
from weir.master.application import Application, ApplicationState
from weir.master.checkpoints import is_operator_done, record_checkpoints, update_recovery
from weir.master.log_limits import LogLimiter
from weir.master.physical_plan import (
    ContainerState,
    LossRequest,
    OperatorState,
    PTContainer,
    PTOperator,
    StateSeed,
)
from weir.master.report_filter import bounded_text, read_windows
from weir.master.window_checks import check_window_ids
from weir.operators.windows import format_window_id
from weir.proto import plan_pb2, umbilical_pb2

__all__ = ["abort_response", "container_context", "deploy_info", "process_heartbeat"]

_LOGGER = logging.getLogger(__name__)

# Warnings about heartbeats that belong to no application: no application to hold a limiter.
_UNKNOWN_LIMITS = LogLimiter()

def abort_response() -> umbilical_pb2.ContainerHeartbeatResponse:
    """The answer to a container that must stop now."""
    return umbilical_pb2.ContainerHeartbeatResponse(
        shutdown=umbilical_pb2.SHUTDOWN_TYPE_ABORT, committed_window_id=-1)


def container_context(app: Application, container: PTContainer
                      ) -> umbilical_pb2.StreamingContainerContext:
    """What a container asks for first: the application's clock and settings; a spare
    is told to heartbeat often until it has operators, and to warm Spark now if the
    application uses it; a container given Spark operators, to start Spark now."""
    interval = int(app.attribute("HEARTBEAT_INTERVAL_MILLIS"))
    return umbilical_pb2.StreamingContainerContext(
        container_id=container.id, application_id=app.id,
        start_window_millis=app.start_window_millis,
        heartbeat_interval_millis=interval,
        streaming_window_size_millis=app.attribute("STREAMING_WINDOW_SIZE_MILLIS"),
        checkpoint_window_count=app.attribute("CHECKPOINT_WINDOW_COUNT"),
        deploy_buffer_server=True, attributes=app.plan.attribute_text(),
        spare=container.spare,
        spare_heartbeat_interval_millis=min(interval, spares.SPARE_HEARTBEAT_INTERVAL_MS)
        if container.spare else 0,
        warm_spark=container.spare and spares.uses_spark(app.dag),
        start_spark=not container.spare and spares.runs_spark(app, container))


def process_heartbeat(app: Application | None, heartbeat: umbilical_pb2.ContainerHeartbeat,
                      now_ms: int) -> umbilical_pb2.ContainerHeartbeatResponse:
    """Applies one container heartbeat to ``app`` and returns the container's orders.

    Rules (Apex's ``processHeartbeat``): an unknown or killed container gets ABORT; the
    first heartbeat records the buffer-server address and makes the container ACTIVE;
    reported operator states and checkpoints move the plan's operators, their recovery
    checkpoints and the committed window (in every answer), unless a report's window ids
    cannot be right (``check_window_ids``: then its windows and checkpoints are ignored,
    with a rate-limited warning); an operator reported FAILED, or a container asking to be
    restarted, costs the container: ABORT, and a ``LossRequest`` the master loop carries
    out (recovery, or the application fails at once if the error is fatal, i.e. cannot
    succeed on retry); operators pending undeploy are undeployed until no longer
    reported; deploy requests go out only when every live container is ACTIVE and no
    operator waits for its undeploy, and are repeated until the operator is reported; a
    terminal application answers ABORT.

    Args:
        app: the application owning ``heartbeat.container_id``, or None if unknown.
        heartbeat: the container's message.
        now_ms: the master's time (epoch ms).
    """
    cid = heartbeat.container_id
    container = app.plan.container(cid) if app is not None else None
    if app is None or container is None:
        # one key for all: a sender inventing container ids must not get a line per id
        _UNKNOWN_LIMITS.log(_LOGGER, logging.WARNING, "unknown container", now_ms,
                            "container=%s heartbeat from an unknown container; answering ABORT",
                            cid)
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
    if heartbeat.spark_warm != container.spark_warm:
        spares.record_warmth(app, container, heartbeat.spark_warm)
    if container.loss_request is not None:
        return abort_response()  # the master loop gives it up on its next pass
    if heartbeat.restart_requested and not app.terminal:
        container.loss_request = LossRequest(
            "it asked to be restarted (its buffer server failed)")
        return abort_response()
    held = app.plan.operators_in(container)  # a heartbeat that goes on does not move them
    states_before = [op.state for op in held]
    reports = _apply_operator_reports(app, container, heartbeat, now_ms)
    if reports.failed is not None and not app.terminal:
        failed, fatal = reports.failed
        container.loss_request = LossRequest(
            f"operator {failed.name!r} ({failed.id}) failed: {failed.error}", failed.id, fatal)
        return abort_response()
    _undeployed(app, container, held, reports.reported)
    changed = [op.state for op in held] != states_before
    if changed:  # recovery checkpoints: all of them, else only what new checkpoints move
        update_recovery(app)
    elif reports.checkpointed:
        update_recovery(app, reports.checkpointed)
    finished = _update_state(app, changed, now_ms)
    committed = savepoints.on_heartbeat(app, reports.savepoint_parts, finished)
    return _orders(app, container, held, reports, committed, now_ms)


@dataclasses.dataclass
class _Reports:
    """What a heartbeat's operator reports said: the ids reported, those to undeploy, one
    FAILED operator with whether its error is fatal, the ids with a new checkpoint, and
    the savepoint parts written (operator id -> savepoint path)."""

    reported: set[int] = dataclasses.field(default_factory=set)
    undeploy: list[int] = dataclasses.field(default_factory=list)
    failed: tuple[PTOperator, bool] | None = None
    checkpointed: set[int] = dataclasses.field(default_factory=set)
    savepoint_parts: dict[int, str] = dataclasses.field(default_factory=dict)


def _update_state(app: Application, changed: bool, now_ms: int) -> bool:
    """The application's own state: RUNNING once every container is active, FINISHED
    once every operator ended; True if it finished now."""
    if app.state == ApplicationState.ACCEPTED and app.all_containers_active():
        app.transition(ApplicationState.RUNNING, now_ms)
    if changed and not app.terminal and all(op.state == OperatorState.SHUTDOWN
                                            for op in app.plan.operators.values()):
        app.transition(ApplicationState.FINISHED, now_ms)
        return True
    return False


def _orders(app: Application, container: PTContainer, held: list[PTOperator],
            reports: _Reports, committed: int,
            now_ms: int) -> umbilical_pb2.ContainerHeartbeatResponse:
    """The container's orders: the committed window, undeploys, deploys (once it may),
    activations, a shutdown and the savepoint to write."""
    response = umbilical_pb2.ContainerHeartbeatResponse(
        committed_window_id=committed, undeploy_request=reports.undeploy)
    if app.terminal:
        response.shutdown = umbilical_pb2.SHUTDOWN_TYPE_ABORT
        return response
    pending = [op for op in held
               if op.state == OperatorState.PENDING_DEPLOY and op.id not in reports.reported]
    if pending and _may_deploy(app, container) and now_ms >= app.restart_at_ms:
        response.deploy_request.extend(deploy_info(app, op) for op in pending)
        _LOGGER.debug("app=%s container=%s deploy %s", app.id, container.id,
                      [op.name for op in pending])
    response.has_pending_requests = bool(pending or reports.undeploy)
    inputs = [op.id for op in held if op.is_input and op.state == OperatorState.ACTIVE]
    if inputs and _all_ready(app):  # only containers with sources need the app-wide look
        response.activate_request.extend(inputs)
    if app.shutdown_requested:
        response.shutdown = umbilical_pb2.SHUTDOWN_TYPE_WAIT_TERMINATE
    savepoint = app.savepoint
    if savepoint is not None and savepoint.state == savepoints.WRITING and (
            savepoint.stop or savepoint.window >= 0):
        response.savepoint_path = savepoint.path
        response.savepoint_window_id = -1 if savepoint.stop else savepoint.window
    return response


def _may_deploy(app: Application, container: PTContainer) -> bool:
    """Deploys wait for every live container (inputs need their upstream's address) and for
    every pending undeploy (an old instance must be gone before its successor starts)."""
    return (container.state == ContainerState.ACTIVE and app.all_containers_active()
            and not any(op.state == OperatorState.PENDING_UNDEPLOY for op in itertools.chain(
                app.plan.operators.values(), app.plan.retired.values())))


def _all_ready(app: Application) -> bool:
    """Every operator has finished setup (or already ended): inputs may start."""
    return all(op.ready or op.terminal for op in app.plan.operators.values())


def _activate(app: Application, container: PTContainer,
              heartbeat: umbilical_pb2.ContainerHeartbeat, now_ms: int) -> None:
    if not heartbeat.buffer_server_host or not heartbeat.buffer_server_port:
        app.log_limits.log(_LOGGER, logging.WARNING, ("no buffer server", container.id), now_ms,
                           "app=%s container=%s heartbeat without a buffer-server address; "
                           "the container stays %s until it sends one", app.id, container.id,
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
                            heartbeat: umbilical_pb2.ContainerHeartbeat,
                            now_ms: int) -> _Reports:
    """Moves operators to their reported states; says what the reports asked for.

    A report whose window ids cannot be right (``check_window_ids``) adds nothing to the
    operator's statistics and checkpoints; its state still counts.
    """
    out = _Reports()
    reported, checkpointed = out.reported, out.checkpointed
    for report in heartbeat.stats.operators:
        op = app.plan.operators.get(report.node_id)
        retired = app.plan.retired.get(report.node_id)
        if op is None and retired is not None and retired.container_id == container.id:
            reported.add(retired.id)  # removed by a repartition: it goes, quietly
            out.undeploy.append(retired.id)
            continue
        if op is None or op.container_id != container.id:
            app.log_limits.log(_LOGGER, logging.WARNING, ("not planned", container.id), now_ms,
                               "app=%s container=%s reports operator %d that is not planned "
                               "there; undeploying it", app.id, container.id, report.node_id)
            out.undeploy.append(report.node_id)
            continue
        if report.generation and report.generation < op.generation \
                and op.state != OperatorState.PENDING_UNDEPLOY:
            # a replaced deployment still running there: ignored, and the current one's
            # deploy goes on (the container replaces an older generation it runs)
            app.log_limits.log(_LOGGER, logging.WARNING, ("generation", container.id), now_ms,
                               "app=%s container=%s operator=%s (%d) reported by generation %d, "
                               "but generation %d is deployed; the report is ignored", app.id,
                               container.id, op.name, op.id, report.generation, op.generation)
            continue
        reported.add(op.id)
        if op.state == OperatorState.PENDING_UNDEPLOY:
            out.undeploy.append(op.id)  # its old instance: nothing it says counts
            continue
        if report.ready and not op.ready:  # a new instance's setup() returned
            op.ready, op.ready_ms = True, now_ms
            op.set_up_ms, op.activated_ms = now_ms, 0
        if op.activating and not report.activating:  # its windows may move from now on
            op.ready_ms = max(op.ready_ms, now_ms)
        op.activating = report.activating
        if op.ready and not op.activating and not op.activated_ms:
            op.activated_ms = now_ms
        if report.savepoint_written:
            out.savepoint_parts[op.id] = report.savepoint_written
        op.recovering = report.recovering
        tracker = app.operator_stats[op.id]
        windows, removed = read_windows(report, op.port_names)
        if removed:
            app.log_limits.log(_LOGGER, logging.WARNING, ("filtered", container.id, op.id),
                               now_ms, "app=%s container=%s operator=%s (%d) reported %s; "
                               "left out (the rest of its report counts)", app.id,
                               container.id, op.name, op.id, removed)
        problem = check_window_ids(app, op, tracker, windows, now_ms) if windows else None
        if problem is not None:
            tracker.last_heartbeat_ms = now_ms
            app.log_limits.log(
                _LOGGER, logging.WARNING, (problem.kind, container.id, op.id), now_ms,
                "app=%s container=%s operator=%s (%d) reported window %s (id %d): %s; its "
                "window stats and checkpoints in this heartbeat are ignored", app.id,
                container.id, op.name, op.id, format_window_id(problem.window_id),
                problem.window_id, problem.reason)
        else:
            if tracker.record(windows, now_ms) and _LOGGER.isEnabledFor(logging.DEBUG):
                _LOGGER.debug("app=%s operator=%s window %s", app.id, op.name,
                              format_window_id(tracker.current_window_id))
            if record_checkpoints(app, op, windows):
                checkpointed.add(op.id)
        if _apply_state(app, container, op, report, now_ms) and out.failed is None:
            out.failed = (op, report.fatal)
    return out


def _apply_state(app: Application, container: PTContainer, op: PTOperator,
                 report: umbilical_pb2.OperatorHeartbeat, now_ms: int) -> bool:
    """Moves ``op`` to its reported state; True if it has just FAILED."""
    if op.terminal:
        return False  # SHUTDOWN and FAILED stay until recovery redeploys the operator
    if report.state == umbilical_pb2.OPERATOR_STATE_ACTIVE:
        if op.transition(OperatorState.ACTIVE):
            op.deployed_ms = now_ms
            _LOGGER.info("app=%s container=%s operator=%s (%d) ACTIVE from checkpoint %s",
                         app.id, container.id, op.name, op.id,
                         format_window_id(op.deploy_window_id))
    elif report.state == umbilical_pb2.OPERATOR_STATE_SHUTDOWN:
        op.transition(OperatorState.SHUTDOWN)
        _LOGGER.info("app=%s container=%s operator=%s (%d) SHUTDOWN (its stream ended after "
                     "window %s)", app.id, container.id, op.name, op.id,
                     format_window_id(app.operator_stats[op.id].current_window_id))
    elif report.state == umbilical_pb2.OPERATOR_STATE_FAILED:
        op.transition(OperatorState.FAILED)  # the failure is charged by lose_container
        op.error = bounded_text(report.error) or "failed without an error message"
        op.error_ms = now_ms
        _LOGGER.warning("app=%s container=%s operator=%s (%d) FAILED at window %s: %s",
                        app.id, container.id, op.name, op.id,
                        format_window_id(app.operator_stats[op.id].last_window_id), op.error)
        return True
    return False


def _undeployed(app: Application, container: PTContainer, held: list[PTOperator],
                reported: set[int]) -> None:
    """Operators pending undeploy that the container no longer reports: gone, redeploy them
    (retired ones, removed by a repartition, are just gone)."""
    for op in app.plan.retired_in(container):
        if op.id not in reported:
            op.transition(OperatorState.SHUTDOWN)
            _LOGGER.info("app=%s container=%s operator=%s (%d) undeployed (retired by a "
                         "repartition)", app.id, container.id, op.name, op.id)
    for op in held:
        if op.state == OperatorState.PENDING_UNDEPLOY and op.id not in reported:
            op.transition(OperatorState.PENDING_DEPLOY)
            _LOGGER.info("app=%s container=%s operator=%s (%d) undeployed; pending deploy from "
                         "checkpoint %s", app.id, container.id, op.name, op.id,
                         format_window_id(op.deploy_window_id))


def deploy_info(app: Application, op: PTOperator) -> plan_pb2.OperatorDeployInfo:
    """What a container needs to run ``op``: payload, attributes and every port's stream.

    The checkpoint is the one ``op`` starts from (-1 = fresh; after a recovery, chosen by
    its PROCESSING_MODE). Inputs name the CURRENT buffer server of the upstream
    operator's container and the stream ``(source_node_id, source_port_name)``, and a
    partition's share of it (key column, mask and keys); outputs name the operator's own
    container's.
    """
    own = app.plan.containers[op.container_id]
    info = plan_pb2.OperatorDeployInfo(
        id=op.id, name=op.name, type=op.type, class_name=op.class_name, payload=op.payload,
        checkpoint=plan_pb2.Checkpoint(
            window_id=op.deploy_window_id,
            application_window_count=int(op.attributes.get("APPLICATION_WINDOW_COUNT", 1)),
            checkpoint_window_count=int(op.attributes.get("CHECKPOINT_WINDOW_COUNT", 1))),
        context_attributes=op.attribute_text(), partition_index=op.partition_index,
        partition_count=op.partition_count, generation=op.generation,
        first_generation=app.plan.first_generation)
    if op.seed is not None:
        info.seed.CopyFrom(_seed_info(op.seed))
    streamed = _stream_schemas(app, op)
    for link in op.inputs:
        upstream = app.plan.operators[link.source_operator_id]
        container = app.plan.containers[upstream.container_id]
        link_info = info.inputs.add(
            port_name=link.port_name, declared_stream_id=link.stream_name,
            source_node_id=link.source_operator_id, source_port_name=link.source_port_name,
            buffer_server_host=container.buffer_server_host,
            buffer_server_port=container.buffer_server_port,
            source_generation=upstream.generation,
            stream_schema=streamed.get(link.port_name, b""))
        if link.partition is not None:  # this partition's share: the buffer server filters
            link_info.partition_key_column = link.partition.column
            link_info.partition_mask = link.partition.mask
            link_info.partition_keys.extend(link.partition.keys)
        end = app.operator_stats[upstream.id].current_window_id
        if is_operator_done(app, upstream) and end <= op.deploy_window_id:
            # what the stream carried is all in the checkpoint: the input ends at once
            # (the upstream, done, is not redeployed and its buffer server may be gone)
            link_info.upstream_end_window = end
    for link in op.outputs:
        info.outputs.add(
            port_name=link.port_name, declared_stream_id=link.stream_name,
            buffer_server_host=own.buffer_server_host, buffer_server_port=own.buffer_server_port)
    return info


def _stream_schemas(app: Application, op: PTOperator) -> dict[str, bytes]:
    """What the streams into ``op``'s inputs are known to carry (the DAG's
    ``stream_schema``); nothing for a unifier, whose inputs are its operator's partitions."""
    described = app.described(op.logical_name or op.name)
    if described is None or described.class_name != op.class_name:
        return {}
    return {port.name: port.stream_schema for port in described.inputs if port.stream_schema}


def _seed_info(seed: StateSeed) -> plan_pb2.StateSeed:
    """How the container builds the first checkpoint of an operator made by a repartition."""
    info = plan_pb2.StateSeed(from_node_ids=seed.from_ids, retired_node_ids=seed.retired_ids,
                              window_id=seed.window_id, savepoint_path=seed.savepoint_path)
    if seed.share is not None:
        info.key_column = seed.share.column
        info.mask = seed.share.mask
        info.keys.extend(seed.share.keys)
    return info

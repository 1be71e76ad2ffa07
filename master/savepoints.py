"""The master's side of savepoints (``operators.savepoints``): taking one with a stop, and
starting a new run from one.

Taking: the sources end after their current window without END_OF_TIME, every operator
checkpoints the end of its stream, and each copies that checkpoint and its durable folder
under the savepoint path (containers do the copying: they own the state). Once every
operator of the DAG has written its part and the application finished, the master writes
the manifest, which makes the savepoint complete.

Starting from one: every physical operator of the new plan starts at the savepoint's window
from a seed (the repartition mechanism): the state of its partitions there (re-split when
the partition count changed), or its fresh payload for a new operator. Windows go on from
the savepoint's, so state that names windows (sinks' high watermarks, stores' undo logs)
stays comparable.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from master.checkpoints import CheckpointBook
from master.physical_plan import PhysicalPlan, StateSeed
from operators.savepoints import (
    Manifest,
    SavedPartition,
    SavepointError,
    check_unused,
    match,
    read_manifest,
    write_manifest,
)
from operators.windows import format_window_id, window_base_seconds
from proto import plan_pb2

if TYPE_CHECKING:
    from master.application import Application

__all__ = ["SavepointProgress", "adopt", "finish", "plan_from_savepoint", "record_written",
           "start"]

_LOGGER = logging.getLogger(__name__)

WRITING = "writing"
COMPLETE = "complete"


@dataclasses.dataclass
class SavepointProgress:
    """A savepoint an application is taking."""

    path: str
    written: set[int] = dataclasses.field(default_factory=set)  # operators that wrote theirs
    state: str = WRITING  # WRITING, COMPLETE, or why it failed


def adopt(app: Application, path: str, manifest: Manifest,
          books: dict[int, CheckpointBook]) -> None:
    """A new application seeded by ``plan_from_savepoint``: its operators' books hold the
    savepoint's window, and its window ids go on with the savepoint's epoch (base seconds),
    so that the master believes the windows its operators report."""
    app.checkpoints.update(books)
    app.from_savepoint = path
    app.start_window_millis = window_base_seconds(manifest.window) * 1000


def start(app: Application, path: str) -> None:
    """Starts a savepoint with a stop; raises ``SavepointError`` when it cannot be taken."""
    if not path:
        raise SavepointError("name the folder the savepoint goes to (a path or a URI)")
    if app.savepoint is not None:
        raise SavepointError(f"application {app.id} is already taking a savepoint at "
                             f"{app.savepoint.path!r}")
    if app.shutdown_requested:
        raise SavepointError(f"application {app.id} is already shutting down without a "
                             "savepoint")
    check_unused(path)
    app.savepoint = SavepointProgress(path)
    app.shutdown_requested = True
    _LOGGER.info("app=%s savepoint requested at %s: inputs end after their current window",
                 app.id, path)


def record_written(app: Application, operator_id: int) -> None:
    if app.savepoint is not None:
        app.savepoint.written.add(operator_id)


def finish(app: Application) -> None:
    """The application finished: writes the manifest if every operator wrote its part,
    else says which did not (the savepoint stays incomplete: no manifest)."""
    progress = app.savepoint
    if progress is None or progress.state != WRITING:
        return
    partitions: dict[str, list[SavedPartition]] = {}
    missing = []
    for op in app.dag.operators:
        for instance in app.plan.instances(op.name):
            if instance.id not in progress.written:
                missing.append(f"{op.name} ({instance.id})")
            book = app.checkpoints.get(instance.id)
            window = book.latest if book is not None else -1
            partitions.setdefault(op.name, []).append(SavedPartition(instance.id, window))
    if missing:
        progress.state = f"incomplete: operators {', '.join(missing)} wrote no part"
        _LOGGER.error("app=%s savepoint at %s is %s", app.id, progress.path, progress.state)
        return
    window = max((p.window for parts in partitions.values() for p in parts), default=-1)
    try:
        write_manifest(progress.path, Manifest.describe(app.dag, app.id, window, partitions))
    except OSError as exc:
        progress.state = f"failed: its manifest cannot be written: {exc}"
        _LOGGER.error("app=%s savepoint at %s %s", app.id, progress.path, progress.state)
        return
    progress.state = COMPLETE
    _LOGGER.info("app=%s savepoint complete at %s: window %s", app.id, progress.path,
                 format_window_id(window))


def plan_from_savepoint(dag: plan_pb2.DagDescriptor, plan: PhysicalPlan, path: str,
                        allow_dropped: bool) -> tuple[Manifest, dict[int, CheckpointBook]]:
    """Seeds every operator of ``plan`` at the savepoint's window; returns the manifest and
    the operators' checkpoint books (each holding that window).

    Raises:
        SavepointError: no complete savepoint there, or the DAG does not match it (the
            message lists each operator: kept, new, dropped, class changed).
    """
    manifest = read_manifest(path)
    counts = {op.name: len(plan.instances(op.name)) for op in dag.operators}
    matched = match(dag, manifest, counts)
    refusal = matched.refusal(allow_dropped)
    if refusal is not None:
        raise SavepointError(f"the DAG does not match the savepoint at {path!r}: {refusal}")
    window = manifest.window
    books: dict[int, CheckpointBook] = {}
    for op in plan.operators.values():
        saved = manifest.operator(op.logical_name or op.name)
        if (op.type == plan_pb2.OPERATOR_TYPE_INPUT and saved is not None
                and len(saved.partitions) != op.partition_count):
            raise SavepointError(
                f"source {op.logical_name!r} had {len(saved.partitions)} partitions in the "
                f"savepoint and has {op.partition_count} now: a source's position cannot be "
                f"split; keep PARTITIONS={len(saved.partitions)} for it")
        sources: tuple[int, ...] = ()
        share = None
        if saved is not None and op.type != plan_pb2.OPERATOR_TYPE_UNIFIER:
            if len(saved.partitions) == op.partition_count:  # partition i takes part i
                sources = (saved.partitions[op.partition_index].id,)
            else:  # re-split by key, as a repartition does
                sources = tuple(p.id for p in saved.partitions)
                share = op.share
        op.deploy_window_id = op.recovery_window_id = window
        op.seed = StateSeed(window, sources, share, (), savepoint_path=path)
        book = CheckpointBook()
        book.add(window)  # built by its container before it runs
        books[op.id] = book
    _LOGGER.info("plan %s starts from the savepoint at %s (window %s):\n%s", plan.name, path,
                 format_window_id(window), "\n".join(matched.lines()))
    return manifest, books

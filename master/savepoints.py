"""The master's side of savepoints (``storage.savepoints``): taking one with a stop, and
starting a new run from one.

Taking: the sources end after their current window without END_OF_TIME, every operator
checkpoints the end of its stream, and each copies that checkpoint and its durable folder
under the savepoint path (containers do the copying: they own the state). Once every
operator of the DAG has written its part and the application finished, the master writes
the manifest, which makes the savepoint complete.

Nothing here touches a store: the rules run under the master's lock, and a savepoint path
may be a remote store that never answers. The core checks a path before ``start`` and
reads a manifest before ``plan_from_savepoint``, outside its lock; a manifest due
(``manifest_due``) is written by the core outside its lock too, which then calls
``manifest_written``.

Starting from one: every physical operator of the new plan starts at the savepoint's window
from a seed (the repartition mechanism): the state of its partitions there (re-split when
the partition count changed), or its fresh payload for a new operator. Windows go on from
the savepoint's, so state that names windows (sinks' high watermarks, stores' undo logs)
stays comparable.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from weir.master.checkpoint_book import CheckpointBook
from weir.master.physical_plan import OperatorState, PhysicalPlan, PTOperator, StateSeed
from weir.master.savepoint_progress import (  # (journals name it here)
    COMPLETE,
    WRITING,
    SavepointProgress,
)
from weir.operators.windows import format_window_id, window_base_seconds
from weir.proto import plan_pb2
from weir.storage.locations import redact_location
from weir.storage.savepoints import Manifest, SavedPartition, SavepointError, match

if TYPE_CHECKING:
    from weir.master.application import Application

__all__ = ["SavepointProgress", "adopt", "manifest_due", "manifest_written", "on_heartbeat",
           "plan_from_savepoint", "start"]

_LOGGER = logging.getLogger(__name__)



def adopt(app: Application, path: str, manifest: Manifest,
          books: dict[int, CheckpointBook]) -> None:
    """A new application seeded by ``plan_from_savepoint``: its operators' books hold the
    savepoint's window, and its window ids go on with the savepoint's epoch (base seconds),
    so that the master believes the windows its operators report."""
    app.checkpoints.update(books)
    app.from_savepoint = path
    app.start_window_millis = window_base_seconds(manifest.window) * 1000


def start(app: Application, path: str, stop: bool) -> None:
    """Starts a savepoint; raises ``SavepointError`` when it cannot be taken. The caller
    checked the path (``storage.savepoints.check_unused``) without the lock."""
    if not path:
        raise SavepointError("name the folder the savepoint goes to (a path or a URI)")
    if app.savepoint is not None and app.savepoint.state == WRITING:
        raise SavepointError(f"application {app.id} is already taking a savepoint at "
                             f"{redact_location(app.savepoint.path)!r}")
    if app.shutdown_requested:
        raise SavepointError(f"application {app.id} is already shutting down")
    ended = [f"{op.logical_name or op.name} ({op.id})" for op in _instances(app)
             if op.state == OperatorState.SHUTDOWN]
    if ended:
        raise SavepointError(f"operators {', '.join(ended)} of application {app.id} already "
                             "ended their streams: their state can no longer be saved")
    app.savepoint = SavepointProgress(path, stop=stop)
    if stop:
        app.shutdown_requested = True
        _LOGGER.info("app=%s savepoint requested at %s: inputs end after their current "
                     "window", app.id, redact_location(path))
    else:
        _LOGGER.info("app=%s savepoint requested at %s, the application runs on", app.id,
                     redact_location(path))
        _advance(app)


def on_heartbeat(app: Application, parts: Mapping[int, str], finished: bool) -> int:
    """A heartbeat's share of the savepoint under way: the ``parts`` its operators wrote
    (operator id -> savepoint path) are recorded and the savepoint moves on; if the
    application ``finished`` with it, the savepoint ends. Returns the committed window
    the container hears (held while the savepoint copies it; read before an end lets it go).
    """
    progress = app.savepoint
    if progress is None:
        return app.committed_window_id
    progress.written.update(op_id for op_id, path in parts.items() if path == progress.path)
    _advance(app)
    committed = _committed_for_containers(app)
    if finished:
        _finish(app)
    return committed


def _advance(app: Application) -> None:
    """A savepoint without a stop moves on: it takes the newest window every operator of
    the DAG checkpointed (not before the committed window: those are being deleted), and
    is complete once each wrote its part."""
    progress = app.savepoint
    if progress is None or not progress.running:
        return
    if progress.window < 0:
        common: set[int] | None = None
        for op in _instances(app):
            book = app.checkpoints.get(op.id)
            windows = set(book.windows if book is not None else ())
            common = windows if common is None else common & windows
        usable = [w for w in common or () if w >= max(app.committed_window_id, 0)]
        if usable:
            progress.window = max(usable)
            _LOGGER.info("app=%s savepoint at %s takes window %s", app.id,
                         redact_location(progress.path), format_window_id(progress.window))
        return
    gone = [f"{op.logical_name or op.name} ({op.id})" for op in _instances(app)
            if op.id not in progress.written and op.state == OperatorState.SHUTDOWN]
    if gone:  # ended without writing its part: it never will (nothing waits for it)
        progress.state = f"incomplete: operators {', '.join(gone)} ended without their part"
        _LOGGER.error("app=%s savepoint at %s is %s", app.id, redact_location(progress.path),
                      progress.state)
    elif all(op.id in progress.written for op in _instances(app)):
        _complete(app, progress, {op.id: progress.window for op in _instances(app)})


def _committed_for_containers(app: Application) -> int:
    """The committed window containers hear: held at the window of a savepoint being
    written, so that nobody deletes the checkpoints it copies."""
    progress = app.savepoint
    if progress is not None and progress.running and progress.window >= 0:
        return min(app.committed_window_id, progress.window)
    return app.committed_window_id


def _instances(app: Application) -> list[PTOperator]:
    return [instance for op in app.dag.operators for instance in app.plan.instances(op.name)]


def _finish(app: Application) -> None:
    """The application finished: a savepoint with a stop gets its manifest if every
    operator wrote its part, else says which did not (no manifest: incomplete)."""
    progress = app.savepoint
    if progress is None or progress.state != WRITING or progress.manifest is not None:
        return
    if not progress.stop:
        progress.state = "incomplete: the application ended before every operator wrote its part"
        return
    missing = [f"{op.logical_name or op.name} ({op.id})" for op in _instances(app)
               if op.id not in progress.written]
    if missing:
        progress.state = f"incomplete: operators {', '.join(missing)} wrote no part"
        _LOGGER.error("app=%s savepoint at %s is %s", app.id, redact_location(progress.path),
                      progress.state)
        return
    _complete(app, progress, {op.id: _latest(app, op.id) for op in _instances(app)})


def _latest(app: Application, operator_id: int) -> int:
    book = app.checkpoints.get(operator_id)
    return book.latest if book is not None else -1


def _complete(app: Application, progress: SavepointProgress, windows: dict[int, int]) -> None:
    """Every part is written: the manifest is due (the core writes it, outside its lock)."""
    if progress.manifest is not None:
        return
    partitions = {op.name: [SavedPartition(i.id, windows[i.id])
                            for i in app.plan.instances(op.name)] for op in app.dag.operators}
    window = max(windows.values(), default=-1)
    progress.manifest = Manifest.describe(app.dag, app.id, window, partitions)


def manifest_due(app: Application) -> tuple[str, Manifest] | None:
    """The savepoint path and manifest the core must write now, if any."""
    progress = app.savepoint
    if progress is None or progress.state != WRITING or progress.manifest is None:
        return None
    return progress.path, progress.manifest


def manifest_written(app: Application, path: str, error: str) -> None:
    """The core wrote the manifest of the savepoint at ``path`` (``error`` empty), or could
    not: the savepoint is complete, or failed saying why (the committed window it held
    is let go either way)."""
    progress = app.savepoint
    if progress is None or progress.path != path or progress.state != WRITING:
        return
    where = redact_location(path)
    if error:
        progress.state = f"failed: its manifest cannot be written: {error}"
        _LOGGER.error("app=%s savepoint at %s %s", app.id, where, progress.state)
        return
    progress.state = COMPLETE
    assert progress.manifest is not None
    _LOGGER.info("app=%s savepoint complete at %s: window %s", app.id, where,
                 format_window_id(progress.manifest.window))


def plan_from_savepoint(dag: plan_pb2.DagDescriptor, plan: PhysicalPlan, path: str,
                        allow_dropped: bool, manifest: Manifest
                        ) -> tuple[Manifest, dict[int, CheckpointBook]]:
    """Seeds every operator of ``plan`` at the window of the savepoint at ``path``, whose
    ``manifest`` the caller read (outside the lock); returns the manifest and the
    operators' checkpoint books (each holding that window).

    Raises:
        SavepointError: no complete savepoint there, or the DAG does not match it (the
            message lists each operator: kept, new, dropped, class changed).
    """
    counts = {op.name: len(plan.instances(op.name)) for op in dag.operators}
    matched = match(dag, manifest, counts)
    refusal = matched.refusal(allow_dropped)
    if refusal is not None:
        raise SavepointError(f"the DAG does not match the savepoint at "
                             f"{redact_location(path)!r}: {refusal}")
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
    _LOGGER.info("plan %s starts from the savepoint at %s (window %s):\n%s", plan.name,
                 redact_location(path),
                 format_window_id(window), "\n".join(matched.lines()))
    return manifest, books

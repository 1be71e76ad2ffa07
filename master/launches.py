"""What the rules queued for the launcher (``LauncherAction``s), carried out after the
master released its lock: a launcher may block, and a launched container may call in at
once."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

from weir.master.app_registry import AppRegistry
from weir.master.application import Application, LauncherAction, LaunchKind
from weir.master.launcher import Launcher, Resources, UnplaceableRequest, check_memory_fits
from weir.master.physical_plan import ContainerState, PTContainer
from weir.master.spares import uses_spark
from weir.master.state_location import unshared_state_problem
from weir.proto import plan_pb2

__all__ = ["Launches", "Observed"]

_LOGGER = logging.getLogger("weir.master.core")

Actions = list[tuple[Application, LauncherAction]]


@dataclasses.dataclass(frozen=True)
class Observed:
    """What ``Launches.observe`` found (see ``liveness.check_liveness``)."""

    exit_codes: dict[str, int | None]
    waiting: dict[str, str]
    exit_reasons: dict[str, str]
    trouble: str = ""  # the launcher's (``Launcher.trouble``)


class Launches:
    """Takes an application's queued kills and launches (lock held) and carries them out
    (lock released): kills first; a launch that fails fails the application."""

    def __init__(self, launcher: Launcher, apps: AppRegistry, lock: threading.RLock,
                 changed: threading.Condition, clock: Callable[[], int]) -> None:
        self.launcher = launcher
        self.apps = apps
        self.lock = lock
        self.changed = changed
        self.clock = clock

    def take(self, app: Application | None) -> Actions:
        """The app's queued kills and launches; new containers become known (lock held)."""
        if app is None:
            return []
        actions = app.take_launcher_actions()
        for action in actions:
            if action.kind == LaunchKind.LAUNCH:
                self.apps.add_container(app, action.container_id)
        return [(app, action) for action in actions]

    def check_request(self, attributes: dict[str, Any], dag: plan_pb2.DagDescriptor) -> None:
        """Raises UnplaceableRequest for an application whose containers could never run:
        no node of the launcher's manager meets the request, its memory cannot hold
        Spark's driver or the buffer server, (containers here) there is no Java, or (on
        several nodes) its state would be on one node only."""
        self.launcher.check_request(Resources.of(attributes))
        if self.launcher.spans_hosts:
            problem = unshared_state_problem(
                attributes, type(self.launcher).__name__.removesuffix("Launcher"))
            if problem is not None:
                raise UnplaceableRequest(problem)
        spark = uses_spark(dag)
        check_memory_fits(attributes, spark)
        if spark:
            self.launcher.check_spark()

    def observe(self, containers: list[PTContainer]) -> Observed:
        """What the launcher knows of ``containers``: exit codes (None while running) with
        the manager's reason for an ended one, and, for those launched but not yet placed,
        why they wait."""
        exit_codes = {c.id: self.launcher.exit_code(c.id) for c in containers}
        waiting = {c.id: reason for c in containers if c.state == ContainerState.ALLOCATED
                   and (reason := self.launcher.waiting(c.id))}
        reasons = {cid: reason for cid, code in exit_codes.items()
                   if code is not None and (reason := self.launcher.exit_reason(cid))}
        return Observed(exit_codes, waiting, reasons, self.launcher.trouble())

    def carry_out(self, actions: Actions) -> None:
        """Kills, then launches, outside the lock."""
        for _app, action in actions:
            if action.kind == LaunchKind.KILL:
                self.launcher.kill(action.container_id, dump_threads=action.dump_threads)
        for app, action in actions:
            if action.kind == LaunchKind.LAUNCH:
                self.launch(app, [action.container_id])

    def launch(self, app: Application, container_ids: list[str]) -> None:
        """Launches containers outside the lock, until the application ended."""
        for cid in container_ids:
            with self.lock:
                if app.terminal:
                    break
            try:
                self.launcher.launch(cid, Resources.of(app.plan.attributes))
            except Exception as exc:  # noqa: BLE001 - any launch failure fails the app
                with self.lock:
                    app.fail(f"could not launch container {cid}: {type(exc).__name__}: {exc}",
                             self.clock())
                    self.changed.notify_all()
                break
            with self.lock:
                container = app.plan.containers[cid]
                if container.state == ContainerState.NEW:
                    container.transition(ContainerState.ALLOCATED)
                    container.allocated_ms = self.clock()
                    _LOGGER.info("app=%s container=%s launched", app.id, cid)
                self.changed.notify_all()

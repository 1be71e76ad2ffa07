"""The master's state behind one lock: applications, their containers, and the master loop.

The gRPC services call into ``MasterCore``; the rules live in ``physical_plan``,
``heartbeat``, ``liveness`` and ``recovery``. The master loop (a thread, every ~200 ms)
runs the liveness check, so lost containers are noticed without any request arriving.
The rules queue the containers to kill and launch; the core does it after its lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from weir.master import heartbeat as rules
from weir.master import liveness, persistence, progress, recovery, savepoints, views
from weir.master.app_registry import AppRegistry
from weir.master.application import Application, ApplicationState
from weir.master.errors import FailedPrecondition
from weir.master.launcher import Launcher
from weir.master.launches import Launches
from weir.master.listener_pass import ListenerPass
from weir.master.manifest_writer import ManifestWriter
from weir.master.master_loop import MasterLoop
from weir.master.persistence import ApplicationJournal, HaltingJournal
from weir.master.physical_plan import ContainerState
from weir.master.repartition import Repartition, repartition
from weir.master.report_filter import bounded_text
from weir.master.run_folders import RunFolders
from weir.master.run_store import RunStore
from weir.master.state_owner import new_run_id
from weir.master.stats_listeners import StatsListeners
from weir.master.submit_plan import checked_listeners, planned
from weir.proto import client_pb2, plan_pb2, umbilical_pb2
from weir.storage.locations import redact_location
from weir.storage.savepoints import SavepointError

__all__ = ["Clock", "MasterCore", "system_clock"]

_LOGGER = logging.getLogger(__name__)

Clock = Callable[[], int]
"""Returns the time in epoch milliseconds; injected so tests can step it."""


def system_clock() -> int:
    return time.time_ns() // 1_000_000


class MasterCore:
    """Every application the master knows, with thread-safe operations on them.

    Args:
        launcher: starts and stops the container processes.
        clock: epoch milliseconds.
        stop_grace_ms: how long containers of an ended application may take to exit
            before the master kills them.
        loop_interval_s: period of the master loop.
        journal: where every application is saved when it changes, to restart from
            (``restore``); None = the master forgets everything when it stops.
        ended_apps_kept, ended_app_ttl_ms: an ended application (its containers gone) is
            forgotten, in memory and journal, this long after it ended, and the oldest
            ones past this many: a long-lived master's memory follows what runs.
    """

    def __init__(self, launcher: Launcher, *, clock: Clock = system_clock,
                 stop_grace_ms: int = 10_000, loop_interval_s: float = 0.2,
                 journal: ApplicationJournal | None = None, ended_apps_kept: int = 100,
                 ended_app_ttl_ms: int = 3_600_000, only_application: str = "") -> None:
        self.launcher = launcher
        # an application master's one application (``master.dispatcher``): the only id it
        # takes, and only once; "" = a master of every application submitted to it
        self.only_application = only_application
        self.journal = journal
        self.clock = clock
        self.stop_grace_ms = stop_grace_ms
        self.loop_interval_s = loop_interval_s
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._apps = AppRegistry(ended_apps_kept, ended_app_ttl_ms)
        self._folders = RunFolders()  # each run's state folder: claimed, then released
        self.store = RunStore()  # every store call, made without the lock and bounded
        self._manifests = ManifestWriter(self.store, self._lock, self._manifest_written)
        self._listeners = StatsListeners()
        self._launches = Launches(launcher, self._apps, self._lock, self._changed, clock)
        # the loop's second pass: stats listeners, which may ask for a repartition
        self.consult_listeners = ListenerPass(self._listeners, self._apps, self._lock, clock,
                                              self.repartition)
        self._loop = MasterLoop([self.check_liveness, self.consult_listeners], loop_interval_s)
        # a container process ended: the loop's liveness pass runs at once, not at its tick
        launcher.on_exit = lambda _container_id: self._loop.wake()
        self.dashboard_url = ""  # the master's web dashboard (no secret), shown by `weir apps`
        self.on_halt: Callable[[str], None] | None = None  # told once, from a handler thread
        self._writer = HaltingJournal(journal, self._halting) if journal is not None else None

    # -- lookups (call with the lock held) ----------------------------------------------
    def _app(self, app_id: str) -> Application:
        return self._apps.get(app_id)

    def application(self, app_id: str) -> Application:
        """The live application object; hold ``lock`` while reading it."""
        with self._lock:
            return self._app(app_id)

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    # -- client API -----------------------------------------------------------------------
    def submit(self, dag: plan_pb2.DagDescriptor, overrides: Mapping[str, str], *,
               from_savepoint: str = "", allow_dropped: bool = False, app_id: str = "") -> str:
        """Validates and plans ``dag``, launches its containers; returns the application id.

        ``from_savepoint``: every operator starts from that savepoint's state, matched by
        name (``master.savepoints``); ``allow_dropped`` accepts savepoint operators the DAG
        lacks. ``app_id``: the id an application master was started for (any other master
        refuses one).

        Raises:
            InvalidArgument: the DAG or the overrides are malformed, or the DAG does not
                match the savepoint (the message lists each operator).
        """
        listeners = checked_listeners(dag)
        manifest = self.store.read_savepoint(from_savepoint) if from_savepoint else None
        self.release_ended_runs(all_stopped=False)  # one that ended a moment ago is free now
        with self._lock:
            app_id, run_id = self._apps.take_id(app_id, self.only_application), new_run_id()
        # planned without the lock: heartbeats and other applications' calls go on while
        # a large DAG is planned (it touches nothing shared until it is added below)
        plan, seeded = planned(dag, overrides, app_id, run_id, self._launches, from_savepoint,
                               allow_dropped, manifest)
        state_dir = plan.attributes["STATE_DIR"]
        with self._lock:
            self._folders.reserve(state_dir, app_id)
        claim = None
        try:
            claim = self.store.claim(state_dir, app_id, run_id)
            plan.start_generations(self.store.first_generation(state_dir))
        except BaseException:
            if claim is not None:
                self._folders.release([claim], [])
            with self._lock:
                self._folders.unreserve(app_id)
            raise
        app = Application(app_id, dag, plan, self.clock())
        if seeded is not None:
            savepoints.adopt(app, from_savepoint, *seeded)
        # pickled without the lock too: no other thread sees the application yet
        prepared = self._writer.prepare(app, claim) if self._writer is not None else None
        with self._lock:
            self._folders.hold(claim)
            self._apps.add(app)
            self._listeners.add(app_id, listeners)
            if self._writer is not None:
                self._writer.save(app, claim, prepared)
            _LOGGER.info("app=%s submitted: %r, %d operators in %d containers, state in %s",
                         app_id, app.name, len(plan.operators), len(plan.containers),
                         redact_location(state_dir))
        self._launches.launch(app, list(plan.containers))
        return app_id

    def list_applications(self) -> list[client_pb2.ApplicationInfo]:
        with self._lock:
            now_ms = self.clock()
            return [views.application_info(app, self.dashboard_url, now_ms)
                    for app in self._apps.all()]

    def application_info(self, app_id: str, *, brief: bool = False) -> client_pb2.ApplicationInfo:
        with self._lock:
            return views.application_info(self._app(app_id), self.dashboard_url,
                                          self.clock(), brief=brief)

    def application_plan(self, app_id: str) -> client_pb2.ApplicationPlan:
        """The application's DAG as deployed, with each operator's figures."""
        with self._lock:
            return views.application_plan(self._app(app_id), self.clock())

    def list_containers(self, app_id: str = "") -> list[client_pb2.ContainerInfo]:
        with self._lock:
            apps = [self._app(app_id)] if app_id else self._apps.all()
            return [views.container_info(app, c) for app in apps
                    for c in app.plan.containers.values()]

    def list_operators(self, app_id: str) -> list[client_pb2.OperatorInfo]:
        with self._lock:
            app = self._app(app_id)
            return views.operator_infos(app, self.clock())

    def operator_info(self, app_id: str, operator: str) -> client_pb2.OperatorInfo:
        """One operator by name or physical id, with its recent windows."""
        with self._lock:
            app = self._app(app_id)
            op = views.find_operator(app, operator)
            return views.operator_info(app, op, with_windows=True, now_ms=self.clock())

    def kill_container(self, container_id: str) -> str:
        """Kills the container's process; returns the new container replacing it, if any."""
        with self._lock:
            app, container = self._apps.container(container_id)
            if container.state == ContainerState.KILLED:
                raise FailedPrecondition(f"container {container_id} is already KILLED "
                                         f"({container.diagnostics})")
            loss = recovery.lose_container(app, container, "killed by the user", self.clock())
            actions = self._launches.take(app)
            self._persist(app)
            self._changed.notify_all()
        self._launches.carry_out(actions)
        return loss.replacement_id

    def repartition(self, app_id: str, operator: str, count: int,
                    cause: str = "asked by hand") -> Repartition:
        """Gives DAG operator ``operator`` ``count`` partitions while the application runs.

        Raises:
            NotFound, InvalidArgument, FailedPrecondition: see ``repartition.repartition``.
        """
        with self._lock:
            app = self._app(app_id)
            result = repartition(app, operator, count, self.clock(), cause)
            self._persist(app)
            self._changed.notify_all()
        return result

    def shutdown_application(self, app_id: str) -> None:
        """Asks the containers to end their input streams; the app then finishes."""
        with self._lock:
            app = self._app(app_id)
            if app.terminal:
                raise FailedPrecondition(f"application {app_id} is already {app.state.value}")
            if not app.shutdown_requested:
                app.shutdown_requested = True
                _LOGGER.info("app=%s shutdown requested: inputs end after their current "
                             "window", app_id)
                self._persist(app)
            self._changed.notify_all()

    def take_savepoint(self, app_id: str, path: str, stop: bool) -> None:
        """Takes a savepoint of the application at ``path``: while it runs on, or with
        ``stop``, finishing it (``master.savepoints``). The path is checked (unused, a
        folder of this user's) before the lock is taken: it may be a store that never
        answers."""
        with self._lock:
            self._app(app_id)  # an unknown application is told before any store is asked
        self.store.check_unused(path)
        with self._lock:
            app = self._app(app_id)
            if app.terminal:
                raise FailedPrecondition(f"application {app_id} is already {app.state.value}")
            try:
                savepoints.start(app, path, stop)
            except SavepointError as exc:
                raise FailedPrecondition(str(exc)) from None
            self._persist(app)
            self._changed.notify_all()

    def kill_application(self, app_id: str, reason: str = "") -> None:
        """KILLED now; containers get ABORT and are stopped if they linger."""
        with self._lock:
            app = self._app(app_id)
            if app.terminal:
                raise FailedPrecondition(f"application {app_id} is already {app.state.value}")
            app.transition(ApplicationState.KILLED, self.clock(),
                           reason or "killed by the user")
            self._persist(app)
            self._changed.notify_all()

    def wait_for_application(self, app_id: str, timeout_s: float) -> client_pb2.ApplicationInfo:
        """Blocks until the application is FINISHED, FAILED or KILLED.

        Raises:
            NotFound: unknown application.
            TimeoutError: still running after ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        with self._lock:
            app = self._app(app_id)
            while not app.terminal:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"application {app_id} is still {app.state.value} "
                                       f"after {timeout_s:.1f} s")
                self._changed.wait(min(left, 1.0))
            return views.application_info(app, now_ms=self.clock())

    # -- umbilical ------------------------------------------------------------------------
    def init_context(self, container_id: str) -> umbilical_pb2.StreamingContainerContext:
        """The global configuration a container asks for first."""
        with self._lock:
            app, container = self._apps.container(container_id)
            if container.state == ContainerState.KILLED:
                raise FailedPrecondition(f"container {container_id} was killed: "
                                         f"{container.diagnostics}")
            return rules.container_context(app, container)

    def heartbeat(self, heartbeat: umbilical_pb2.ContainerHeartbeat
                  ) -> umbilical_pb2.ContainerHeartbeatResponse:
        with self._lock:
            app = self._apps.of_container(heartbeat.container_id)
            response = rules.process_heartbeat(app, heartbeat, self.clock())
            actions = self._launches.take(app)
            manifest = self._manifests.take_due(app) if app is not None else None
            container = app.plan.container(heartbeat.container_id) if app is not None else None
            if app is not None:  # before the container hears of what changed: what the
                # heartbeat could change (its container's operators, those it touched)
                self._persist(app, persistence.heartbeat_changes(app, container))
            self._changed.notify_all()
        if container is not None and container.loss_request is not None:
            self._loop.wake()  # the loss the heartbeat recorded: the loop carries it out now
        self._launches.carry_out(actions)
        if manifest is not None:
            self._manifests.write_later(app, *manifest)  # type: ignore[arg-type]
        return response

    def _manifest_written(self, app: Application) -> None:
        """A savepoint's manifest was written, or failed (lock held)."""
        if self._apps.is_current(app):
            self._persist(app)
        self._changed.notify_all()

    def log(self, container_id: str, msg: str) -> None:
        with self._lock:
            app, _ = self._apps.container(container_id)
        _LOGGER.info("app=%s container=%s says: %s", app.id, container_id, bounded_text(msg))

    def report_error(self, container_id: str, operator_ids: list[int], msg: str,
                     generation: int = 0) -> None:
        """Records an error event; a failed deploy counts as a failure of its operator
        (of that ``generation`` of its deployment, if given)."""
        with self._lock:
            app, container = self._apps.container(container_id)
            names = [app.plan.operators[i].name if i in app.plan.operators else str(i)
                     for i in operator_ids]
            msg = bounded_text(msg)  # kept, journaled and logged: a container sets its size
            app.report_error(container_id, f"operators {names}: {msg}" if names else msg,
                             self.clock())
            _LOGGER.warning("app=%s container=%s reports an error in %s: %s", app.id,
                            container_id, names, msg)
            recovery.deploy_failed(app, container, operator_ids, msg, self.clock(),
                                   generation)
            actions = self._launches.take(app)
            self._persist(app)
            self._changed.notify_all()
        self._launches.carry_out(actions)

    # -- liveness -------------------------------------------------------------------------
    def check_liveness(self) -> list[str]:
        """One pass of the master loop; returns the containers given up on.

        The lock is taken once per application, not for the whole pass: with a hundred
        applications a pass is milliseconds of work, and every heartbeat waiting for the
        lock would wait for all of it.
        """
        losses: list[recovery.ContainerLoss] = []
        with self._lock:
            self._apps.forget_ended(self.clock(), self._folders.holds, self._forget)
            apps = self._apps.all()
        for app in apps:
            with self._lock:
                live = app.plan.live_containers()
                if not live or not self._apps.is_current(app):
                    continue
                seen = self._launches.observe(live)
                lost = liveness.check_liveness(
                    app, self.clock(), seen.exit_codes, self.stop_grace_ms, seen.waiting,
                    seen.exit_reasons, trouble=seen.trouble)
                progress.check_progress(app, self.clock())
                actions = self._launches.take(app)
                self._persist(app, persistence.loop_changes(app, bool(lost)))
                if lost:
                    self._changed.notify_all()
            losses += lost
            self._launches.carry_out(actions)
        self.release_ended_runs(all_stopped=False)
        return [loss.container_id for loss in losses]

    def _forget(self, app: Application) -> None:
        """An ended application is forgotten: out of the journal and the listeners."""
        if self._writer is not None:
            self._writer.forget(app)
        self._listeners.forget(app.id)

    def release_ended_runs(self, *, all_stopped: bool = True) -> None:
        """Releases the state folders of ended runs and deletes their default ones (the
        loop does it at every tick). A master that stops calls it once it stopped every
        container (``all_stopped``); without a journal nothing can take a run back then,
        so every run has ended."""
        with self._lock:
            ended, discard = self._folders.ended(
                self._apps.all(), all_stopped=all_stopped,
                forever=all_stopped and self.journal is None)
        self._folders.release(ended, discard)

    # -- the journal ----------------------------------------------------------------------
    @property
    def halted(self) -> str:
        """Why the master stopped serving: its journal failed ("" = it serves)."""
        return self._writer.halted if self._writer is not None else ""

    def _persist(self, app: Application, only: set[int] | None = None) -> None:
        """Journals ``app`` if what recovery needs of it changed (lock held); a journal
        that fails halts the master (``HaltingJournal``): the change is not answered
        (UNAVAILABLE, which containers retry)."""
        if only is None:
            app.take_touched()  # every operator is looked at
        if self._writer is not None:
            self._writer.save(app, self._folders.get(app.id), only=only)

    def _halting(self, reason: str) -> None:
        """The journal failed: nothing more is decided here, and the server stops."""
        self._loop.halt()
        if self.on_halt is not None:
            self.on_halt(reason)

    def restore(self) -> int:
        """Takes back every application of the journal; returns how many.

        Running containers keep running while the master is away and re-register with
        their heartbeats: the restored plan already knows them and their operators, so
        nothing that still runs is redeployed. Each of them gets a fresh heartbeat
        timeout from now; one that does not come back within it is recovered as usual.
        """
        if self.journal is None:
            return 0
        loaded = self.journal.load()
        claims = {app.id: self.store.claim(claim.state_dir, app.id, claim.run_id)
                  for app, claim in loaded if claim is not None and not app.terminal}
        now_ms = self.clock()
        manifests = []
        with self._lock:
            for app, _ in loaded:
                self._apps.add(app)
                if app.terminal:
                    continue
                if app.id in claims:
                    self._folders.hold(claims[app.id])
                manifest = self._manifests.take_due(app)  # due when the last master stopped
                if manifest is not None:
                    manifests.append((app, *manifest))
                for container_id, pid, host in recovery.resume(app, now_ms):
                    self.launcher.adopt(container_id, pid, host)
                self._listeners.restore(app, self.clock())
                _LOGGER.info("app=%s restored from the journal: %s, committed window %s",
                             app.id, app.state.value, app.committed_window_id)
            self._changed.notify_all()
        for app, path, manifest in manifests:
            self._manifests.write_later(app, path, manifest)
        return len(loaded)

    def start(self) -> None:
        """Starts the master loop thread (``master.master_loop``)."""
        self._loop.start()

    def stop(self) -> None:
        """Stops the master loop thread (containers are the server's to stop)."""
        self._loop.stop()

"""Deploying and undeploying operators from the master's deploy requests."""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterable

import cloudpickle
import pyarrow as pa

from weir.container.buffer_server import BufferServer
from weir.container.checkpoint_store import CheckpointStore, StoreCheckpointer
from weir.container.durable_folders import DurableFolders, redeployed
from weir.container.input_subscriptions import stream_id, subscriber
from weir.container.lease import Lease
from weir.container.memory_shares import input_queue_bytes
from weir.container.port_input import PortInput
from weir.container.savepoint_parts import SavedParts, write_part
from weir.container.window_loop import OperatorRunner
from weir.operators.attributes import ATTRIBUTES, ProcessingMode
from weir.operators.keyed_state import RepartitionError
from weir.operators.operator import Operator, OperatorContext
from weir.operators.partitioning import PartitionFilter
from weir.operators.windows import format_window_id
from weir.proto import plan_pb2, umbilical_pb2
from weir.runtime.machine_load import stretched_ms
from weir.runtime.operator_state import OperatorStateError, new_partition, restore
from weir.runtime.spark.bridge import SparkSessionBridge
from weir.storage import Fence, Fenced

__all__ = ["DeployError", "Deployment"]

_LOGGER = logging.getLogger(__name__)

UNDEPLOY_WAIT_S = 5.0
"""How long an undeploy waits for the operator's thread to exit (by default)."""
REDEPLOY_WAIT_S = 10.0
"""How much longer a new deployment of it waits, before the container must restart."""


class DeployError(RuntimeError):
    """A deploy request could not be carried out (bad payload, unknown port).

    ``fatal``: a new container would fail the same way (the payload cannot be unpickled
    in this environment, or is no operator), so the master should fail the application
    rather than restart it; a checkpoint that cannot be read is not fatal (storage may
    come back).
    """

    def __init__(self, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


def partition_filter(info: plan_pb2.InputDeployInfo) -> PartitionFilter | None:
    """The input's share of its stream (one partition's hash buckets), or None for all.

    Raises:
        DeployError: the master sent buckets that do not fit the mask (fatal: it would
            send the same again).
    """
    if not info.partition_key_column:
        return None
    try:
        return PartitionFilter(info.partition_key_column, info.partition_mask,
                               frozenset(info.partition_keys))
    except ValueError as exc:
        raise DeployError(f"input {info.port_name!r}: {exc}", fatal=True) from None


def _typed_attributes(text: dict[str, str]) -> dict[str, object]:
    typed: dict[str, object] = {}
    for name, value in text.items():
        attribute = ATTRIBUTES.get(name)
        typed[name] = attribute.parse(value) if attribute else value
    return typed


def default_state_dir(application_id: str) -> str:
    """Where checkpoints go when STATE_DIR is not set (the master resolves the same)."""
    return os.path.join(tempfile.gettempdir(), "weir-state", application_id)


class Deployment:
    """The operators running in this container, keyed by physical id.

    Args:
        application_id: the application the container belongs to.
        container_id: this container.
        buffer_server: where output ports publish.
        spark: the container's Spark bridge (its session starts on first use).
        start_window_millis: the application's first window time.
        base_attributes: the application's resolved attributes (from the init context).
        on_change: called when any operator changes state.
        secret: the master's secret, which other containers' buffer servers want.
        tls_root_certs: subscribe over TLS trusting these PEM certificates.
        lease: the container's lease, which every operator holds to act.
        advertised: where the master was told ``buffer_server`` serves (default: where
            it listens): an input whose upstream publishes there reads it directly.
        undeploy_wait_s, redeploy_wait_s: how long an undeploy waits for an operator's
            thread to exit, and how much longer a new deployment of it then waits.
        setup_wait_s: how long instead when the earlier deployment is still in ``setup``;
            None = the application's SETUP_TIMEOUT_MILLIS, stretched by the machine's load
            (there it may start Spark, and will come out: restarting the container would
            only start another cold JVM).
    """

    def __init__(self, application_id: str, container_id: str, buffer_server: BufferServer,
                 spark: SparkSessionBridge, start_window_millis: int,
                 base_attributes: dict[str, str], on_change: Callable[[], None], *,
                 secret: str | None = None, tls_root_certs: bytes | None = None,
                 lease: Lease | None = None, undeploy_wait_s: float = UNDEPLOY_WAIT_S,
                 redeploy_wait_s: float = REDEPLOY_WAIT_S,
                 setup_wait_s: float | None = None,
                 advertised: tuple[str, int] | None = None) -> None:
        self.container_id = container_id
        self.advertised = advertised
        self.undeploy_wait_s = undeploy_wait_s
        self.redeploy_wait_s = redeploy_wait_s
        self.setup_wait_s = setup_wait_s
        self.lease = lease
        self.secret = secret
        self.tls_root_certs = tls_root_certs
        self.buffer_server = buffer_server
        self.spark = spark
        self.start_window_millis = start_window_millis
        self.base_attributes = base_attributes
        self.on_change = on_change
        self.runners: dict[int, OperatorRunner] = {}
        self.stopping: dict[int, OperatorRunner] = {}  # undeployed, thread not yet exited
        # operator id -> its FAILED report, for deploys that failed in a way no retry fixes
        self.failed_deploys: dict[int, umbilical_pb2.OperatorHeartbeat] = {}
        self._lock = threading.Lock()
        self.state_dir = base_attributes.get("STATE_DIR") or default_state_dir(application_id)
        self.store = CheckpointStore(self.state_dir)
        # the savepoint asked for: (path, window; -1 = at the end of the stream, a stop)
        self.savepoint: tuple[str, int] | None = None
        self.folders = DurableFolders(self.state_dir)  # this run's durable folders
        # (seed window, operators a repartition retired): checkpoints to delete after commit
        self._retired: list[tuple[int, list[int]]] = []

    def deploy(self, info: plan_pb2.OperatorDeployInfo) -> None:
        """Claims the operator's fence, builds it, connects its ports, starts its thread.

        A deployment of an older generation still running here is stopped first; a
        repeated deploy request (same generation) is ignored.
        """
        with self._lock:
            running = self.runners.get(info.id)
        if running is not None:
            if running.generation >= info.generation:
                return  # a repeated deploy request: already running
            _LOGGER.warning("container %s: operator %s (%d) generation %d replaces generation "
                            "%d still running here", self.container_id, info.name, info.id,
                            info.generation, running.generation)
            self.undeploy([info.id])
        self.folders.enter_run(info.first_generation)
        fence = self._claim(info)  # first: a previous deployment still stopping is fenced
        self._await_stopped(info)
        with self._lock:
            resume = info.checkpoint.window_id if info.HasField("checkpoint") else -1
            checkpointer = StoreCheckpointer(self.store, fence)
            operator = self._build(info, resume, checkpointer)
            attributes = _typed_attributes({**self.base_attributes,
                                            **dict(info.context_attributes)})
            context = OperatorContext(name=info.name, operator_id=info.id,
                                      container_id=self.container_id,
                                      attributes=attributes, spark=self.spark,
                                      state_dir=self.folders.operator_dir(info.id),
                                      recovered_window=resume,
                                      partition_index=info.partition_index,
                                      partition_count=max(1, info.partition_count),
                                      generation=info.generation,
                                      redeployed=redeployed(info.first_generation,
                                                            info.generation),
                                      fence_check=fence.check,
                                      input_schemas={  # known at submit (the DAG's)
                                          i.port_name: pa.ipc.read_schema(pa.py_buffer(
                                              i.stream_schema))
                                          for i in info.inputs if i.stream_schema})
            stopped = threading.Event()
            capacity = int(attributes.get("QUEUE_CAPACITY", 64))
            # AT_MOST_ONCE skips what it missed (and never takes a window twice); otherwise
            # every window after the checkpoint is replayed
            at_most_once = attributes.get("PROCESSING_MODE") == ProcessingMode.AT_MOST_ONCE
            inputs = {
                i.port_name: PortInput(
                    i.port_name, subscriber(i, partition_filter(i), self.buffer_server,
                                           self.advertised or self.buffer_server.address,
                                           secret=self.secret,
                                           tls_root_certs=self.tls_root_certs),
                    capacity, stopped, from_window=resume, skip_to_latest=at_most_once,
                    max_bytes=input_queue_bytes(attributes))
                for i in info.inputs
            }
            publishers = {  # windows after the checkpoint are published again
                o.port_name: self.buffer_server.publisher(stream_id(info.id, o.port_name),
                                                          from_window=resume, stop=stopped,
                                                          generation=info.generation)
                for o in info.outputs
            }
            runner = OperatorRunner(info.id, operator, context, publishers, inputs,
                                    self.start_window_millis, self.on_change,
                                    wait_for_activation=True, checkpointer=checkpointer,
                                    resume_window=resume, skip_missed_windows=at_most_once,
                                    stopped=stopped, lease=self.lease)
            self.runners[info.id] = runner
            self._arm_savepoint(runner)  # redeployed while the application stops for one
            self.failed_deploys.pop(info.id, None)
        _LOGGER.info("container %s deploys operator %s (%d, %s) from %s", self.container_id,
                     info.name, info.id, info.class_name,
                     f"checkpoint {format_window_id(resume)}" if resume >= 0 else "scratch")
        runner.start()

    def _claim(self, info: plan_pb2.OperatorDeployInfo) -> Fence:
        """This deployment's fence, claimed: from now on, older ones cannot write.

        Raises:
            DeployError: a newer generation claimed it already (a stale deploy request),
                or the state folder cannot be written.
        """
        fence = self.store.fence(info.id, info.generation, f"operator {info.name} ({info.id})")
        try:
            fence.claim()
            self.store.delete_temporaries(info.id)  # saves a kill or the fence cut short
        except Fenced as exc:
            raise DeployError(f"operator {info.name} ({info.id}) is not deployed: {exc}") \
                from None
        except OSError as exc:
            raise DeployError(f"operator {info.name} ({info.id}) cannot claim its fence in "
                              f"{self.state_dir}: {exc}") from None
        return fence

    def _build(self, info: plan_pb2.OperatorDeployInfo, resume: int,
               checkpointer: StoreCheckpointer | None = None) -> Operator:
        checkpointer = checkpointer or StoreCheckpointer(self.store)
        operator = self._unpickle(info)
        if info.HasField("seed"):
            seed = info.seed.window_id
            self._retired.append((seed, list(info.seed.retired_node_ids)))
            if resume == seed >= 0 and resume not in self.store.windows(info.id):
                return self._seed(info, operator, resume, checkpointer)
        if resume >= 0:
            try:
                operator = restore(operator, self.store.load(info.id, resume))
            except Exception as exc:  # noqa: BLE001 - a corrupt or missing checkpoint
                raise DeployError(f"operator {info.name} ({info.id}) cannot be restored from "
                                  f"checkpoint {format_window_id(resume)} in {self.state_dir}: "
                                  f"{exc}") from None
        return operator

    def _unpickle(self, info: plan_pb2.OperatorDeployInfo) -> Operator:
        try:
            operator = cloudpickle.loads(info.payload)
        except Exception as exc:  # noqa: BLE001 - any unpickling error is a deploy error
            raise DeployError(f"operator {info.name} ({info.class_name}) cannot be rebuilt in "
                              f"container {self.container_id}: {type(exc).__name__}: {exc}; "
                              "its class must be importable here or defined in the app file",
                              fatal=True) from None
        if not isinstance(operator, Operator):
            raise DeployError(f"operator {info.name}: payload is a {type(operator).__name__}",
                              fatal=True)
        return operator

    def _seed(self, info: plan_pb2.OperatorDeployInfo, fresh: Operator, window_id: int,
              checkpointer: StoreCheckpointer) -> Operator:
        """A partition made by a repartition: its state at ``window_id`` from the old
        partitions' checkpoints there (or the payload), saved as its own first checkpoint."""
        seed = info.seed
        share = (PartitionFilter(seed.key_column, seed.mask, frozenset(seed.keys))
                 if seed.key_column else None)
        where = f"checkpoint {format_window_id(window_id)} in {self.state_dir}"
        if seed.savepoint_path:
            where = f"the savepoint at {seed.savepoint_path}"
        try:
            operator = fresh
            if seed.savepoint_path and seed.from_node_ids:
                operator = SavedParts(seed.savepoint_path).operator(
                    list(seed.from_node_ids), lambda: self._unpickle(info), info.name,
                    share, self.folders.operator_dir(info.id))
            elif seed.from_node_ids:
                old = [restore(self._unpickle(info), self.store.load(old_id, window_id),
                               info.name)
                       for old_id in seed.from_node_ids]
                operator = new_partition(old, share)
            checkpointer.checkpoint(info.id, window_id, operator)
        except RepartitionError as exc:
            raise DeployError(f"operator {info.name} ({info.id}): the state of partitions "
                              f"{list(seed.from_node_ids)} at {where} cannot be split: {exc}",
                              fatal=True) from None
        except OperatorStateError as exc:
            raise DeployError(f"operator {info.name} ({info.id}): the state of partitions "
                              f"{list(seed.from_node_ids)} at {where} cannot be restored or "
                              f"saved: {exc}", fatal=True) from None
        except Exception as exc:  # noqa: BLE001 - a missing or corrupt checkpoint, storage
            raise DeployError(f"operator {info.name} ({info.id}) cannot take the state of "
                              f"partitions {list(seed.from_node_ids)} at {where}: "
                              f"{type(exc).__name__}: {exc}") from None
        _LOGGER.info("container %s made operator %s (%d) from partitions %s at %s",
                     self.container_id, info.name, info.id, list(seed.from_node_ids),
                     format_window_id(window_id))
        return operator

    def _forget_retired(self, committed: int) -> None:
        """Deletes the checkpoints of operators a repartition removed, once every operator
        recovers from after the new partitions' first checkpoint (no seed is built again)."""
        due = [ids for window, ids in self._retired if committed > window]
        self._retired = [(w, ids) for w, ids in self._retired if committed <= w]
        for operator_id in {i for ids in due for i in ids}:
            try:
                self.store.delete(operator_id)
            except OSError as exc:  # another container deleted it meanwhile, or storage
                _LOGGER.debug("checkpoints of retired operator %d: %s", operator_id, exc)

    def deploy_failed(self, info: plan_pb2.OperatorDeployInfo, error: DeployError) -> None:
        """Reports ``info``'s operator FAILED and fatal in the heartbeats from now on.

        The way a fatal deploy error reaches the master: the heartbeat carries the flag (a
        ReportError would make the master restart the container for another try).
        """
        with self._lock:
            self.failed_deploys[info.id] = umbilical_pb2.OperatorHeartbeat(
                node_id=info.id, state=umbilical_pb2.OPERATOR_STATE_FAILED, error=str(error),
                fatal=True)

    def undeploy(self, operator_ids: Iterable[int]) -> None:
        """Stops these operators: their inputs close, their publishers refuse anything more.

        An operator whose thread has not exited within the stop timeout (stuck in user
        code or a Spark job) is kept in ``stopping``: it is not undeployed until it
        exits, and no new deployment of it starts here meanwhile (``deploy`` waits, then
        fails so the master restarts the container: a process exit stops any thread).
        """
        for operator_id in operator_ids:
            with self._lock:
                self.failed_deploys.pop(operator_id, None)
                runner = self.runners.pop(operator_id, None)
            if runner is not None:
                _LOGGER.info("container %s undeploys operator %d", self.container_id,
                             operator_id)
                for port in runner.publishers:
                    self.buffer_server.suspend(stream_id(operator_id, port))
                runner.stop(timeout_s=self.undeploy_wait_s)
                if runner.alive:
                    _LOGGER.warning("container %s: operator %d has not stopped within %.0f s; "
                                    "it counts as deployed until its thread exits; it is "
                                    "in:\n%s", self.container_id, operator_id,
                                    self.undeploy_wait_s, runner.where())
                    with self._lock:
                        self.stopping[operator_id] = runner

    def _await_stopped(self, info: plan_pb2.OperatorDeployInfo) -> None:
        """Waits for an earlier deployment of the operator that is still stopping here.

        Raises:
            DeployError: it is still running after ``redeploy_wait_s`` (``setup_wait_s``
                while it is still in ``setup``) (not fatal: the master restarts the
                container, and the process exit ends that thread).
        """
        with self._lock:
            previous = self.stopping.get(info.id)
        if previous is None:
            return
        wait_s = self.redeploy_wait_s if previous.ready else self._setup_wait_s()
        if previous.join(wait_s):
            with self._lock:
                self.stopping.pop(info.id, None)
            return
        raise DeployError(f"operator {info.name} ({info.id}) is not deployed: its previous "
                          f"deployment in container {self.container_id} has not stopped "
                          f"within {wait_s + self.undeploy_wait_s:.0f} s (stuck in "
                          f"{'process() or a Spark job' if previous.ready else 'setup'}?); the "
                          f"container must be restarted; it is in:\n{previous.where()}")

    def _setup_wait_s(self) -> float:
        if self.setup_wait_s is not None:
            return self.setup_wait_s
        bound_ms = int(self.base_attributes.get("SETUP_TIMEOUT_MILLIS")
                       or ATTRIBUTES["SETUP_TIMEOUT_MILLIS"].default)
        return stretched_ms(bound_ms) / 1000

    def activate(self, operator_ids: Iterable[int]) -> None:
        """Lets these input operators start their windows."""
        for operator_id in operator_ids:
            runner = self.runners.get(operator_id)
            if runner is not None:
                runner.activate()

    def committed(self, window_id: int) -> None:
        """The master's committed window: operators hear of it, the buffer server forgets it.

        Subscribers restart after their recovery checkpoint, never at or before the
        committed window, so the windows up to it are never replayed again.
        """
        for runner in list(self.runners.values()):
            runner.notify_committed(window_id)
        self.buffer_server.purge_all(window_id)
        if self._retired:
            self._forget_retired(window_id)

    def end_inputs(self, savepoint_path: str = "") -> None:
        """Asks every input operator to end its stream after the current window; with a
        ``savepoint_path``, for that savepoint: every operator writes its part there."""
        if savepoint_path:
            self.savepoint = (savepoint_path, -1)
        for runner in list(self.runners.values()):
            self._arm_savepoint(runner)
            runner.request_end(suspend=bool(savepoint_path))

    def take_savepoint(self, path: str, window_id: int) -> None:
        """A savepoint while the application runs: every operator writes its checkpoint of
        ``window_id`` (and its durable folder) under ``path``, between two windows."""
        self.savepoint = (path, window_id)
        for runner in list(self.runners.values()):
            self._arm_savepoint(runner)

    def _arm_savepoint(self, runner: OperatorRunner) -> None:
        if self.savepoint is not None:
            path, window_id = self.savepoint
            runner.savepoint.ask(path, window_id, self._write_savepoint_part)

    def _write_savepoint_part(self, operator_id: int, window_id: int, path: str) -> None:
        write_part(self.store, operator_id, window_id, self.folders.operator_dir(operator_id),
                   path)

    def heartbeats(self, interval_ms: int) -> list[umbilical_pb2.OperatorHeartbeat]:
        with self._lock:
            failed = list(self.failed_deploys.values())
        return [r.heartbeat(interval_ms) for r in list(self.runners.values())] + failed


    def stop_all(self) -> None:
        with self._lock:
            runners = list(self.runners.values())
            self.runners.clear()
        for runner in runners:
            runner.stop(timeout_s=2.0)

"""Containers played from one process: each speaks the umbilical protocol as a real
container does (init, heartbeats with window stats and checkpoints, deploys), without
running anything, so one machine can put thousands of them in front of a master."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import random
import socket
import time
from collections.abc import Iterable
from typing import Any

import grpc

from bench.master_process import HOST
from weir.master import auth
from weir.master.rpc import GRPC_OPTIONS
from weir.operators import Dag, InputOperator, InputPort, Operator, OutputPort
from weir.operators.windows import make_window_id
from weir.proto import plan_pb2, umbilical_pb2, umbilical_pb2_grpc
from weir.proto.contract import bearer_metadata, grpc_tls_options, pinned_server_name

__all__ = ["WINDOW_MS", "BenchRelay", "BenchSource", "LoadGenerator", "PlayedContainer",
           "Tally", "chain_dag"]

_LOGGER = logging.getLogger(__name__)

WINDOW_MS = 500  # STREAMING_WINDOW_SIZE_MILLIS of the benchmark's applications
_ROWS_PER_WINDOW = 1_000
_EARLY_HEARTBEAT_S = 0.05  # what a real container waits when the master has more to say
_HAS_READY = "ready" in umbilical_pb2.OperatorHeartbeat.DESCRIPTOR.fields_by_name
_ABORT = umbilical_pb2.SHUTDOWN_TYPE_ABORT


class BenchSource(InputOperator):
    """A source that is never run: the benchmark's containers only pretend to run it."""

    output = OutputPort()

    def emit_tuples(self) -> bool:
        return True


class BenchRelay(Operator):
    """A pass-through operator, never run either."""

    input = InputPort()
    output = OutputPort()


def chain_dag(name: str, containers: int, operators_per_container: int, interval_ms: int,
         timeout_ms: int) -> plan_pb2.DagDescriptor:
    """A chain of ``containers * operators_per_container`` operators over ``containers``."""
    dag = Dag(name, CONTAINERS=containers, HEARTBEAT_INTERVAL_MILLIS=interval_ms,
              HEARTBEAT_TIMEOUT_MILLIS=timeout_ms, STREAMING_WINDOW_SIZE_MILLIS=WINDOW_MS)
    previous = dag.add_operator("op0000", BenchSource())
    for number in range(1, containers * operators_per_container):
        current = dag.add_operator(f"op{number:04d}", BenchRelay())
        dag.add_stream(f"s{number:04d}", previous.output, current.input)
        previous = current
    return dag.to_descriptor()



class PlayedContainer:
    """One played container: what it tells the master and the operators it was given."""

    def __init__(self, container_id: str, index: int, windows_per_heartbeat: int,
                 memory_mb_free: int) -> None:
        self.id = container_id
        self.index = index
        self.windows_per_heartbeat = windows_per_heartbeat
        self.port = 20_000 + index % 40_000
        self.process_name = f"{100_000 + index}@{socket.gethostname()}"
        self.rng = random.Random(index)
        self.memory_mb_free = memory_mb_free
        self.gc_count = 0
        self.gc_time_ms = 0
        self.interval_ms = 0
        self.start_window_millis = 0
        self.base_seconds = 0
        self.checkpoint_window_count = 20
        self.next_window = 0
        # (node id, is input, has an output), deployed
        self.operators: list[tuple[int, bool, bool]] = []
        self.deployed_at = 0.0
        self._message: umbilical_pb2.ContainerHeartbeat | None = None
        self._slots: list[_Slot] = []
        self.last_sent = 0.0
        self.max_gap_s = 0.0

    def init(self, context: umbilical_pb2.StreamingContainerContext) -> None:
        self.interval_ms = context.heartbeat_interval_millis
        self.start_window_millis = context.start_window_millis
        self.base_seconds = context.start_window_millis // 1000
        self.checkpoint_window_count = max(1, context.checkpoint_window_count)

    def deploy(self, infos: Iterable[plan_pb2.OperatorDeployInfo], now_ms: int,
               at: float) -> None:
        """Takes the deploy requests: from the next heartbeat on, they are reported ACTIVE."""
        known = {node_id for node_id, *_ in self.operators}
        for info in infos:
            if info.id not in known:
                self.operators.append((info.id, info.type == plan_pb2.OPERATOR_TYPE_INPUT,
                                       bool(info.outputs)))
        self.operators.sort()
        self._message = None  # reshaped for the operators at the next heartbeat
        if not self.next_window:
            self.next_window = max(1, (now_ms - self.start_window_millis) // WINDOW_MS)
        self.deployed_at = self.deployed_at or at

    def undeploy(self, node_ids: Iterable[int]) -> None:
        """Stops reporting ``node_ids``."""
        gone = set(node_ids)
        self.operators = [op for op in self.operators if op[0] not in gone]
        self._message = None

    def heartbeat(self, now_ms: int) -> umbilical_pb2.ContainerHeartbeat:
        """The next heartbeat: process figures and, per operator, the windows since the last
        (with a checkpoint every CHECKPOINT_WINDOW_COUNT windows, as a real container).

        One message per container, its numbers updated in place: building ~60 messages
        afresh took ~160 us, on the event loop that also times every round trip, so the
        generator's own cost showed up in the master's figures. The message is sent (and
        serialized) before the next heartbeat of the same container changes it.
        """
        rng = self.rng
        self.gc_count += rng.randint(0, 3)
        self.gc_time_ms += rng.randint(0, 2)
        if self._message is None:
            self._message, self._slots = self._new_message()
        message = self._message
        message.memory_mb_free = self.memory_mb_free - rng.randint(0, 64)
        message.gc_collection_time_ms = self.gc_time_ms
        message.gc_collection_count = self.gc_count
        message.sent_tms = now_ms
        message.cpu_percent = round(rng.uniform(5.0, 40.0), 1)
        message.memory_rss_mb = 180 + rng.randint(0, 40)
        if not self.operators:
            return message
        first = self.next_window
        self.next_window += self.windows_per_heartbeat
        start_ms, every = self.start_window_millis, self.checkpoint_window_count
        for position, (report, windows) in enumerate(self._slots):
            report.generated_tms = now_ms
            for counter, (window, inputs, outputs) in enumerate(windows, first):
                end_ms = start_ms + (counter + 1) * WINDOW_MS + position
                rows = _ROWS_PER_WINDOW + (counter * 7 + position * 13) % 101 - 50
                window_id = make_window_id(self.base_seconds, counter)
                window.window_id = window_id
                window.cpu_time_used_ns = 200_000 + (counter * 7_919 + position) % 1_800_000
                if inputs is not None:
                    inputs.tuple_count, inputs.end_window_timestamp = rows, end_ms
                    inputs.buffer_server_bytes, inputs.queue_size = rows * 24, counter % 4
                if outputs is not None:
                    outputs.tuple_count, outputs.end_window_timestamp = rows, end_ms
                    outputs.buffer_server_bytes = rows * 24
                if (counter + 1) % every == 0:
                    window.checkpoint.window_id = window_id
                    window.checkpoint.application_window_count = 1
                    window.checkpoint.checkpoint_window_count = every
                    window.checkpoint_stats.checkpoint_start_time = end_ms
                    window.checkpoint_stats.checkpoint_time_ms = 1 + counter % 20
                elif window.HasField("checkpoint"):  # this slot's previous window had one
                    window.ClearField("checkpoint")
                    window.ClearField("checkpoint_stats")
        return message

    def _new_message(self) -> tuple[umbilical_pb2.ContainerHeartbeat, list[_Slot]]:
        """The container's message, shaped for its operators, and where each operator's
        and window's numbers go (kept: walking a message's repeated fields costs more
        than setting its numbers)."""
        message = umbilical_pb2.ContainerHeartbeat(
            container_id=self.id, buffer_server_host=HOST, buffer_server_port=self.port,
            jvm_name=self.process_name, pid=100_000 + self.index, host=socket.gethostname())
        message.stats.id = self.id
        extra = {"ready": True} if _HAS_READY else {}
        slots: list[_Slot] = []
        for node_id, is_input, has_output in self.operators:
            report = message.stats.operators.add(
                node_id=node_id, interval_ms=self.interval_ms,
                state=umbilical_pb2.OPERATOR_STATE_ACTIVE, **extra)
            windows = []
            for _ in range(self.windows_per_heartbeat):
                window = report.window_stats.add()
                windows.append((window,
                                None if is_input else window.input_ports.add(id="input"),
                                window.output_ports.add(id="output") if has_output else None))
            slots.append((report, windows))
        return message, slots


_Slot = tuple[umbilical_pb2.OperatorHeartbeat,
              list[tuple[umbilical_pb2.OperatorStats, umbilical_pb2.PortStats | None,
                         umbilical_pb2.PortStats | None]]]
"""One operator's report in a played container's message, and its windows' ports."""


@dataclasses.dataclass
class Tally:
    """What the load generator saw, for heartbeats sent in the measured period."""

    measure_from: float = math.inf
    measure_to: float = math.inf
    sent: int = 0
    answered: int = 0
    measured: int = 0
    rtts_s: list[float] = dataclasses.field(default_factory=list)
    lags_s: list[float] = dataclasses.field(default_factory=list)
    errors: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    measured_errors: int = 0
    aborts: int = 0

    def in_period(self, at: float) -> bool:
        return self.measure_from <= at < self.measure_to


class LoadGenerator:
    """Plays every container from this process's event loop over a few channels."""

    def __init__(self, address: str, containers: list[PlayedContainer], interval_s: float,
                 channels: int, rpc_timeout_s: float,
                 masters: dict[str, tuple[str, bytes, str]] | None = None) -> None:
        """``masters``: per application id, its own master's address, certificate and
        secret (a dispatcher's application masters); None: every container's master is
        the one at ``address``, whose secret file this bench's master wrote."""
        self.address = address
        self.containers = containers
        self.interval_s = interval_s
        self.rpc_timeout_s = rpc_timeout_s
        self.channels: list[grpc.aio.Channel] = []
        self._routes: dict[str, list[tuple[Any, tuple[tuple[str, str], ...]]]] = {}
        self._channels_each = max(1, channels)
        if masters is None:
            credentials = auth.client_credentials(address)
            masters = {"": (address, credentials.require_roots(address), credentials.secret)}
        for app_id, (target, roots, secret) in masters.items():
            self.add_master(app_id, target, roots, secret)
        self.tally = Tally()
        self.started = 0.0

    def add_master(self, app_id: str, address: str, roots: bytes, secret: str) -> None:
        """Where ``app_id``'s containers heartbeat ("": every application's): its own
        master, with its certificate and secret; channels of their own to it."""
        options = [*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1),
                   *grpc_tls_options(pinned_server_name(roots))]
        opened = [grpc.aio.secure_channel(
            address, grpc.ssl_channel_credentials(root_certificates=roots), options=options)
            for _ in range(self._channels_each if app_id == "" else 1)]
        self.channels += opened
        metadata = bearer_metadata(secret)
        self._routes[app_id] = [(umbilical_pb2_grpc.StreamingContainerUmbilicalStub(c),
                                 metadata) for c in opened]

    def _route(self, container: PlayedContainer) -> tuple[Any, Any]:
        """The stub and call metadata of the container's master."""
        routes = self._routes.get(container.id.rsplit("-c", 1)[0]) or self._routes[""]
        return routes[container.index % len(routes)]

    def _stub(self, container: PlayedContainer
              ) -> umbilical_pb2_grpc.StreamingContainerUmbilicalStub:
        return self._route(container)[0]

    async def init_all(self, concurrency: int = 64) -> None:
        """GetInitContext for every container (raises on the first failure)."""
        await self.init(self.containers, concurrency)

    async def init(self, containers: list[PlayedContainer], concurrency: int = 64) -> None:
        """GetInitContext for ``containers`` (raises on the first failure)."""
        gate = asyncio.Semaphore(concurrency)

        async def one(container: PlayedContainer) -> None:
            async with gate:
                stub, metadata = self._route(container)
                context = await stub.GetInitContext(
                    umbilical_pb2.GetInitContextRequest(container_id=container.id),
                    timeout=self.rpc_timeout_s, metadata=metadata)
            container.init(context)

        await asyncio.gather(*(one(c) for c in containers))

    async def play(self, container: PlayedContainer, first_at: float) -> None:
        """Heartbeats every interval from ``first_at`` until cancelled or told ABORT."""
        loop = asyncio.get_running_loop()
        (stub, metadata), tally, interval = self._route(container), self.tally, self.interval_s
        due = first_at
        while True:
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = loop.time()
            if container.last_sent and tally.in_period(sent):
                container.max_gap_s = max(container.max_gap_s, sent - container.last_sent)
            container.last_sent = sent
            request = container.heartbeat(time.time_ns() // 1_000_000)
            tally.sent += 1
            start = time.perf_counter()
            try:
                response = await stub.ProcessHeartbeat(request, timeout=self.rpc_timeout_s,
                                                       metadata=metadata)
            except grpc.aio.AioRpcError as exc:
                tally.errors[exc.code().name] += 1
                tally.measured_errors += tally.in_period(sent)
                due = max(due + interval, loop.time())
                continue
            rtt = time.perf_counter() - start
            tally.answered += 1
            if tally.in_period(sent):
                tally.measured += 1
                tally.rtts_s.append(rtt)
                tally.lags_s.append(sent - due)
            if response.shutdown == _ABORT:
                tally.aborts += 1
                if tally.aborts <= 3:
                    _LOGGER.warning("container %s: the master answered ABORT", container.id)
                return  # a real container exits
            if response.undeploy_request:
                container.undeploy(response.undeploy_request)
            if response.deploy_request:
                container.deploy(response.deploy_request, time.time_ns() // 1_000_000,
                                 loop.time() - self.started)
            if response.deploy_request or response.has_pending_requests:  # as a real one
                due = loop.time() + _EARLY_HEARTBEAT_S
            else:
                due = max(due + interval, loop.time())

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close(grace=None)

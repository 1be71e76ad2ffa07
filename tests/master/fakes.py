"""Test doubles for the master: a manual clock, tiny operators, DAGs and hand-built heartbeats."""

from __future__ import annotations

from collections.abc import Iterable

from weir.master.report_filter import ReportedWindow, read_windows
from weir.operators import Dag, InputOperator, InputPort, Operator, OutputPort
from weir.operators.watermarks import NO_WATERMARK
from weir.proto import plan_pb2, umbilical_pb2

__all__ = [
    "Endless",
    "ManualClock",
    "Relay",
    "Sink",
    "Source",
    "chain_dag",
    "chain_descriptor",
    "container_heartbeat",
    "operator_report",
    "window",
]

T0_MS = 1_700_000_000_000


class ManualClock:
    """Epoch milliseconds that move only when a test says so."""

    def __init__(self, start_ms: int = T0_MS) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> int:
        self.now_ms += ms
        return self.now_ms


class Source(InputOperator):
    output = OutputPort()

    def emit_tuples(self) -> bool:
        return False


class Endless(InputOperator):
    """A source that never ends and never emits: its windows and checkpoints go on."""

    output = OutputPort()

    def emit_tuples(self) -> bool:
        return True


class Relay(Operator):
    input = InputPort()
    output = OutputPort()


class Sink(Operator):
    input = InputPort()


def chain_dag(n: int = 3, name: str = "chain", **attributes: object) -> Dag:
    """source -> relay1 -> ... -> sink, ``n`` operators in all."""
    dag = Dag(name, **attributes)
    previous = dag.add_operator("source", Source())
    for i in range(1, n - 1):
        relay = dag.add_operator(f"relay{i}", Relay())
        dag.add_stream(f"s{i}", previous.output, relay.input)
        previous = relay
    sink = dag.add_operator("sink", Sink())
    dag.add_stream("to_sink", previous.output, sink.input)
    return dag


def chain_descriptor(n: int = 3, **attributes: object) -> plan_pb2.DagDescriptor:
    return chain_dag(n, **attributes).to_descriptor()


def partitioned_dag(name: str = "partitioned") -> Dag:
    """source -> relay (two partitions, then their unifier) -> sink, in one container."""
    dag = Dag(name, CONTAINERS=1)
    source = dag.add_operator("source", Source())
    relay = dag.add_operator("relay", Relay(), PARTITIONS=2, PARTITION_KEY="k")
    sink = dag.add_operator("sink", Sink())
    dag.add_stream("in", source.output, relay.input)
    dag.add_stream("out", relay.output, sink.input)
    return dag


def window(window_id: int, tuples_in: int = 0, tuples_out: int = 0, end_ms: int = 0,
           cpu_ns: int = 0, in_port: str | None = "input", out_port: str | None = "output",
           checkpoint: int | None = None, checkpoint_ms: int = 0,
           watermark: int = NO_WATERMARK, checkpoint_bytes: int = 0
           ) -> umbilical_pb2.OperatorStats:
    """One window's stats with one input and one output port (either may be None).

    ``checkpoint``: the window of a checkpoint completed in this window, if any;
    ``watermark``: the operator's as of the window's end (a container always sets it).
    """
    stats = umbilical_pb2.OperatorStats(window_id=window_id, cpu_time_used_ns=cpu_ns,
                                        watermark_ms=watermark)
    if checkpoint is not None:
        stats.checkpoint.window_id = checkpoint
        stats.checkpoint_stats.checkpoint_start_time = end_ms
        stats.checkpoint_stats.checkpoint_time_ms = checkpoint_ms
        stats.checkpoint_stats.checkpoint_bytes = checkpoint_bytes
    if in_port:
        stats.input_ports.add(id=in_port, tuple_count=tuples_in, end_window_timestamp=end_ms)
    if out_port:
        stats.output_ports.add(id=out_port, tuple_count=tuples_out, end_window_timestamp=end_ms,
                               buffer_server_bytes=tuples_out * 8)
    return stats


def reported(report: umbilical_pb2.OperatorHeartbeat) -> list[ReportedWindow]:
    """``report``'s windows as the master reads them for an operator with ports "input"
    and "output" (what ``window`` reports)."""
    windows, _ = read_windows(report, (frozenset({"input"}), frozenset({"output"})))
    return windows


def operator_report(node_id: int, state: int = umbilical_pb2.OPERATOR_STATE_ACTIVE,
                    windows: Iterable[umbilical_pb2.OperatorStats] = (), error: str = "",
                    ready: bool = True) -> umbilical_pb2.OperatorHeartbeat:
    return umbilical_pb2.OperatorHeartbeat(node_id=node_id, state=state,
                                           window_stats=list(windows), error=error,
                                           ready=ready)


def container_heartbeat(container_id: str, port: int = 7000,
                        operators: Iterable[umbilical_pb2.OperatorHeartbeat] = (),
                        host: str = "127.0.0.1", **fields: object
                        ) -> umbilical_pb2.ContainerHeartbeat:
    """A heartbeat as a container sends it; ``port`` is its buffer server's."""
    heartbeat = umbilical_pb2.ContainerHeartbeat(
        container_id=container_id, buffer_server_host=host, buffer_server_port=port,
        jvm_name=f"{port}@testhost", pid=port, host="testhost", memory_mb_free=2048,
        memory_rss_mb=123,
        cpu_percent=12.5, gc_collection_count=3, gc_collection_time_ms=4, **fields)
    heartbeat.stats.id = container_id
    heartbeat.stats.operators.extend(operators)
    return heartbeat

"""Runs a whole DAG in this process, for tests: ``run_local(dag)`` returns what each sink got.

    >>> from weir.operators import Dag
    >>> from weir.operators.testing import CollectSink, ListSource, run_local
    >>> dag = Dag("demo")
    >>> src = dag.add_operator("src", ListSource([[{"x": 1}], [{"x": 2}, {"x": 3}]]))
    >>> sink = dag.add_operator("sink", CollectSink())
    >>> _ = dag.add_stream("numbers", src.output, sink.input)
    >>> run = run_local(dag)
    >>> run.rows("sink")
    [{'x': 1}, {'x': 2}, {'x': 3}]
    >>> [len(rows) for rows in run.windows("sink").values()]
    [1, 2]

The operators are the DAG's own, serialised and loaded as the master ships them to
containers, and each runs in the same window engine as in a container
(``runtime.window_engine``; the container's runner is its other driver): the same hook
order, window ids, application windows, input alignment, checkpoints at the same windows
with the same rule for what is state, ``checkpointed`` then ``committed``, the final
checkpoint and commit before ``teardown``, input batches cast to the declared port schema,
dead letters, and watermarks. ``tests/drivers.py`` runs the same DAG tests through both.

What differs, and why:

- **One thread, topological order.** Each streaming window runs every operator in turn, a
  source first, each taking the whole window its upstream produced. A container's threads
  would interleave the same windows in the same order per operator; a single thread makes a
  test deterministic and its failures plain tracebacks.
- **A fast clock.** A source's window ends as soon as ``emit_tuples`` emits nothing (or
  returns False: exhausted, then the stream ends), never on wall-clock time; at most
  ``MAX_EMIT_CALLS`` calls per window, so a source that always has data (an unbounded
  ``EventGenerator``) still moves on. ``max_windows`` ends the stream after that many
  windows as ``weir shutdown`` would.
- **One partition.** ``PARTITIONS`` is ignored: each operator runs as one unpartitioned
  instance (the result of a partitioned operator followed by its unifier is the same).
- **Spark**, when an operator has ``USES_SPARK``, is the container's bridge over one local
  session shared by every run in the process (``runtime.spark.shared``: ``local[1]``, one
  shuffle partition, warmed up once); the DAG's ``SPARK_MASTER``,
  ``SPARK_SHUFFLE_PARTITIONS`` and ``SPARK_WARMUP_ROWS`` set a container's session, not
  this one. A DAG without Spark never imports pyspark.
- ``ON_ERROR='DEAD_LETTER'`` works as in a container (``runtime.process_calls``): the
  rows an operator fails on leave on its ``errors`` port.
- ``CRASH_AT`` is ignored (it would kill the test's process); ``stop_after_window`` is the
  local crash: the run stops after that many windows, without END_STREAM, ``teardown`` or
  any further checkpoint. Run again with the same ``checkpoint_dir`` to recover.
"""

from __future__ import annotations

import logging
import tempfile
import time
from typing import Any

import cloudpickle
import pyarrow as pa

from weir.operators.attributes import ATTRIBUTES, resolve
from weir.operators.dag import Dag, DagError, topological_order, validate_descriptor
from weir.operators.operator import Operator, OperatorContext, SparkBridge
from weir.operators.windows import make_window_id, window_base_seconds, window_counter
from weir.proto import plan_pb2
from weir.runtime.committed import committed_window
from weir.runtime.local.checkpoints import LocalCheckpoints
from weir.runtime.local.node import MAX_EMIT_CALLS, LocalNode, LocalRunError
from weir.runtime.operator_state import capture, restore
from weir.runtime.spark.shared import shared_bridge

__all__ = ["MAX_EMIT_CALLS", "LocalRun", "LocalRunError", "run_local"]

_LOGGER = logging.getLogger(__name__)

class LocalRun:
    """What a local run produced: each sink's input, per window, and the operators.

    A sink is an operator none of whose output ports feeds a stream.

    Attributes:
        window_ids: the streaming windows this run went through, in order.
        resumed_from: the checkpoint window the run resumed from (-1: a fresh start).
        finished: the stream ended (False: ``stop_after_window`` aborted it).
        sinks: the names of the sinks.
    """

    def __init__(self, nodes: dict[str, LocalNode], window_ids: list[int],
                 resumed_from: int, finished: bool) -> None:
        self._nodes = nodes
        self.window_ids = window_ids
        self.resumed_from = resumed_from
        self.finished = finished
        self.sinks = tuple(name for name, node in nodes.items() if node.is_sink)

    def operator(self, name: str) -> Operator:
        """The operator instance ``name`` as the run left it (after ``teardown``)."""
        return self._node(name).operator

    def windows(self, name: str, port: str | None = None) -> dict[int, list[dict[str, Any]]]:
        """Sink ``name``'s rows per streaming window it processed (empty ones included)."""
        return {w: [row for b in batches for row in b.to_pylist()]
                for w, batches in self._batches(name, port).items()}

    def rows(self, name: str, port: str | None = None) -> list[dict[str, Any]]:
        """Every row sink ``name`` received, in window order."""
        return [row for rows in self.windows(name, port).values() for row in rows]

    def table(self, name: str, port: str | None = None) -> pa.Table | None:
        """Every batch sink ``name`` received as one table (None: no batch at all)."""
        batches = [b for bs in self._batches(name, port).values() for b in bs]
        if not batches:
            return None
        return pa.concat_tables([pa.Table.from_batches([b]) for b in batches],
                                promote_options="permissive")

    def _batches(self, name: str, port: str | None) -> dict[int, list[pa.RecordBatch]]:
        node = self._node(name)
        if not node.is_sink:
            raise KeyError(f"operator {name!r} is not a sink (its outputs feed streams); "
                           f"the sinks are {list(self.sinks)}")
        return {w: [b for p, b in got if port is None or p == port]
                for w, got in node.received.items()}

    def _node(self, name: str) -> LocalNode:
        if name not in self._nodes:
            raise KeyError(f"no operator {name!r}; the operators are {list(self._nodes)}")
        return self._nodes[name]


def run_local(dag: Dag, *, max_windows: int | None = None,
              stop_after_window: int | None = None, checkpoint_dir: str | None = None,
              spark_master: str = "local[1]") -> LocalRun:
    """Runs ``dag`` in this process until its sources end; returns what the sinks got.

    Args:
        dag: the application's DAG (its operators are copied, never changed).
        max_windows: end the stream after this many windows of this run (unbounded
            sources), as a shutdown would: sinks flush, last checkpoint, commit, teardown.
        stop_after_window: abort after this many windows of this run, as a crash would.
        checkpoint_dir: where checkpoints and the operators' state folders go; a run
            resumes from the newest checkpoint every operator has there. None: a
            temporary folder, deleted after the run.
        spark_master: the shared local SparkSession's master, when an operator uses Spark.

    Raises:
        DagError: the DAG is malformed.
        LocalRunError: an operator raised; the message names it and the window.
    """
    descriptor = dag.to_descriptor()
    validate_descriptor(descriptor)
    if max_windows is not None and max_windows < 1:
        raise DagError(f"max_windows must be at least 1, not {max_windows}")
    if checkpoint_dir is not None:
        return _LocalRunner(descriptor, checkpoint_dir, spark_master).run(
            max_windows, stop_after_window)
    with tempfile.TemporaryDirectory(prefix="weir-local-") as folder:
        return _LocalRunner(descriptor, folder, spark_master).run(max_windows, stop_after_window)


class _LocalRunner:
    """Builds the nodes from a DAG descriptor and drives their windows."""

    def __init__(self, descriptor: plan_pb2.DagDescriptor, folder: str,
                 spark_master: str) -> None:
        self.folder = folder
        self.store = LocalCheckpoints(f"{folder}/checkpoints")
        self.order = topological_order(descriptor)
        self.resume = self.store.common_window(self.order)
        spark = shared_bridge(spark_master) if any(
            op.uses_spark for op in descriptor.operators) else None
        by_name = {op.name: op for op in descriptor.operators}
        self.nodes = {name: self._node(index, by_name[name], descriptor, spark)
                      for index, name in enumerate(self.order)}

    def _node(self, index: int, op: plan_pb2.OperatorDescriptor,
              descriptor: plan_pb2.DagDescriptor, spark: SparkBridge | None) -> LocalNode:
        """The operator as the master ships it (its payload), restored when resuming, with
        its attributes resolved operator over DAG over defaults."""
        name = op.name
        attributes = {a: resolve(a, dict(op.attributes), dict(descriptor.attributes))
                      for a in ATTRIBUTES}
        attributes["CRASH_AT"] = ""  # it would kill the test's process
        attributes["STATE_DIR"] = attributes["STATE_DIR"] or self.folder
        operator = cloudpickle.loads(op.payload)
        if self.resume >= 0:
            restore(operator, self.store.load(name, self.resume), name)
        context = OperatorContext(
            name=name, operator_id=index, container_id="local", attributes=attributes,
            spark=spark, state_dir=f"{self.folder}/operators/{index}-{name}",
            recovered_window=self.resume)
        inputs = [(sink.port, stream.source_operator, stream.source_port)
                  for stream in descriptor.streams for sink in stream.sinks
                  if sink.operator == name]
        outputs = {s.source_port for s in descriptor.streams if s.source_operator == name}
        return LocalNode(name, operator, context, inputs, outputs, self.resume)

    def run(self, max_windows: int | None, stop_after: int | None) -> LocalRun:
        for node in self.nodes.values():
            node.call("setup", node.engine.setup)
        for node in self.nodes.values():
            node.call("activate", node.engine.activate)
        base, counter = self._first_window()
        window_ids: list[int] = []
        while not all(node.ended for node in self.nodes.values()):
            if stop_after is not None and len(window_ids) >= stop_after:
                return LocalRun(self.nodes, window_ids, self.resume, finished=False)
            window_id = make_window_id(base, counter)
            last = max_windows is not None and len(window_ids) + 1 >= max_windows
            for name in self.order:
                node = self.nodes[name]
                node.call(window_id, node.step, window_id, self.nodes, last, self._checkpoint)
            if any(node.processed for node in self.nodes.values()):
                window_ids.append(window_id)  # (not a pass in which streams only ended)
            self._commit()
            counter += 1
        return LocalRun(self.nodes, window_ids, self.resume, finished=True)

    def _first_window(self) -> tuple[int, int]:
        """Base seconds and counter of the first window, by the first source's rule
        (``WindowEngine.first_window``: after the checkpoint resumed from, or the windows
        it logged to replay, or now)."""
        for node in self.nodes.values():
            if node.engine.is_source:
                first = node.call("setup", node.engine.first_window, int(time.time()), 0)
                return window_base_seconds(first), window_counter(first)
        return int(time.time()), 0

    def _checkpoint(self, node: LocalNode, window_id: int) -> None:
        self.store.save(node.name, window_id, capture(node.operator, node.name))
        node.engine.checkpointed(window_id)

    def _commit(self) -> None:
        """The committed window, by the master's rule (``runtime.committed``: operators
        that ended are done and hold nothing back), goes to every operator not torn down;
        an operator that ended tears down once its last window is committed."""
        nodes = self.nodes.values()
        committed = committed_window({n.name: n.last_checkpoint for n in nodes},
                                     {n.name: n.last_window for n in nodes if n.ended})
        if committed < 0:
            for node in nodes:
                if node.ended and node.last_window < 0 and not node.torn_down:
                    node.call("teardown", node.teardown)
            return
        for node in nodes:
            if not node.torn_down:
                node.call(committed, node.engine.commit, committed)
        self.store.purge(self.order)
        for node in nodes:
            if node.ended and not node.torn_down and node.committed >= node.last_window:
                node.call("teardown", node.teardown)

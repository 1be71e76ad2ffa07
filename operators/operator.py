"""The operator contract: window lifecycle hooks, called by a container's runtime.

Call order, per operator instance (one thread per operator):

1. ``setup(context)`` once, after deploy (and after the state is restored on recovery).
   Keep it quick: the application's sources start only when every operator's ``setup``
   returned.
2. ``activate(context)`` once, right after ``setup``, while the sources may already run
   (Apex's ``ActivationListener``): slow preparation that need not hold the whole
   application back (starting and warming Spark) goes here; the operator's input waits
   in the buffer servers meanwhile.
3. Per application window (``APPLICATION_WINDOW_COUNT`` streaming windows):
   ``begin_window(window_id)``, then ``process(port, batch)`` for every batch of every
   input port of those windows, then ``end_window()``. Batches emitted from any of these
   hooks belong to the streaming window being processed.
4. ``checkpointed(window_id)`` after the state was saved; ``committed(window_id)`` when
   the master says every operator has checkpointed past that window: the only place to
   act on the outside world for good (acknowledge, commit offsets, publish).
5. ``teardown()`` once, when the stream ended or the operator is undeployed.

An ``InputOperator`` has no inputs: instead of ``process`` the runtime calls
``emit_tuples()`` repeatedly within each streaming window.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import pyarrow as pa

from weir.operators.dead_letters import DeadLetterPort
from weir.operators.faults import CrashPoints
from weir.operators.keyed_state import merge_keyed_state
from weir.operators.ports import InputPort, OutputPort
from weir.operators.watermarks import NO_WATERMARK, WATERMARKS_ATTRIBUTE

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from weir.operators.partitioning import PartitionFilter

__all__ = ["InputOperator", "Operator", "OperatorContext", "SparkBridge", "TransientNonState",
           "UnreachableAtStart", "without_default_port"]

_LOGGER = logging.getLogger(__name__)


class PermanentError(Exception):
    """An error the same input raises again on every replay (a record that cannot be
    decoded, a value no code path accepts). Raised from an operator, it fails the
    application at once: a restart would replay the same windows into the same error."""


class UnreachableAtStart(PermanentError):
    """A system a connector needs (a Kafka broker, a PostgreSQL server) cannot be reached,
    or lacks what it names, at the operator's first deployment (no checkpoint yet): a
    wrong address or name, almost surely, which no restart fixes, so the application fails
    at once. After a checkpoint the same failure is waited out by restarts."""


class SparkWindowInput(Protocol):
    """A window's input to one port, written for Spark as it arrives."""

    num_rows: int

    def append(self, batch: pa.RecordBatch) -> None: ...

    def dataframe(self, session: SparkSession | None = None) -> DataFrame:
        """The window's rows as a DataFrame (of ``session``, default the bridge's)."""
        ...

    def discard(self) -> None:
        """Drops what was written (a window cut short, or handed over already)."""
        ...


class SparkBridge(Protocol):
    """What the runtime offers operators to run window logic in Spark (a container and
    the local runner offer the same one, ``runtime.spark.bridge``)."""

    @property
    def session(self) -> SparkSession: ...

    def to_dataframe(self, batches: list[pa.RecordBatch], schema: pa.Schema,
                     session: SparkSession | None = None) -> DataFrame:
        """A DataFrame over the batches (the fastest correct path for this Spark)."""
        ...

    def to_arrow(self, df: DataFrame) -> pa.Table:
        """Runs the job and brings the result back as Arrow."""
        ...

    def warm_up(self) -> None:
        """Starts Spark and runs a first tiny job, so no window pays the cold start."""
        ...

    def window_input(self, schema: pa.Schema) -> SparkWindowInput:
        """A window's input of ``schema``, written for Spark as its batches arrive."""
        ...

    def job(self) -> contextlib.AbstractContextManager[None]:
        """Keeps the files handed to Spark until the block ends (several jobs over them)."""
        ...


@dataclasses.dataclass
class OperatorContext:
    """What the runtime tells an operator in ``setup``.

    Attributes:
        name: logical operator name.
        operator_id: physical id, unique in the application.
        container_id: the container running it.
        attributes: resolved attributes (operator over DAG over defaults), typed.
        spark: the container's Spark bridge, created on first use; None where Spark is off.
        state_dir: this operator's own durable folder (local path, under ``STATE_DIR``),
            the same for every instance of the physical operator: logs and stores that
            must survive a crash live here (``storage``). Empty in unit tests
            that give none; ``durable_dir()`` then raises.
        recovered_window: the checkpoint this instance was restored from; -1 = fresh.
        partition_index: which partition of its operator this instance is (from 0).
        partition_count: how many partitions its operator has (1: not partitioned).
        generation: this deployment's number (the run's first, then one more at every
            redeploy; 0 in unit tests).
        redeployed: an earlier deployment of this operator ran in this run (a recovery).
        fence_check: raises ``storage.Fenced`` once a newer deployment of the
            operator took over; ``check_fence`` calls it (None: never fenced).
        input_schemas: the schema of the stream into each input port, where it was known
            before anything ran (a source's files): for preparing before the first batch.
    """

    name: str
    operator_id: int
    container_id: str
    attributes: Mapping[str, Any]
    spark: SparkBridge | None = None
    state_dir: str = ""
    recovered_window: int = -1
    partition_index: int = 0
    partition_count: int = 1
    generation: int = 0
    redeployed: bool = False
    fence_check: Callable[[], None] | None = dataclasses.field(default=None, repr=False)
    input_schemas: Mapping[str, pa.Schema] = dataclasses.field(default_factory=dict)
    _crash_points: CrashPoints | None = dataclasses.field(default=None, repr=False)

    @property
    def window_size_millis(self) -> int:
        return int(self.attributes.get("STREAMING_WINDOW_SIZE_MILLIS", 500))

    @property
    def application_window_count(self) -> int:
        return int(self.attributes.get("APPLICATION_WINDOW_COUNT", 1))

    def durable_dir(self, *parts: str) -> str:
        """A folder under ``state_dir`` (created), for what must survive a crash."""
        if not self.state_dir:
            raise RuntimeError(
                f"operator {self.name!r} needs a local state folder (for its logs and commit "
                "steps) but the runtime gave none; set STATE_DIR to a local path")
        path = os.path.join(self.state_dir, *parts)
        os.makedirs(path, mode=0o700, exist_ok=True)  # state is private to its owner
        return path

    def check_fence(self) -> None:
        """Raises ``Fenced`` if this deployment was replaced: call it right before a write
        that must not come from a replaced deployment (the durable stores take it as
        their ``guard``)."""
        if self.fence_check is not None:
            self.fence_check()

    def crash_point(self, name: str) -> None:
        """Dies like ``kill -9`` here if ``CRASH_AT`` arms point ``name`` (``operators.faults``)."""
        if self._crash_points is None:
            self._crash_points = CrashPoints(self.attributes, self.state_dir or None)
        self._crash_points.reach(name)


Emit = Callable[[str, pa.RecordBatch], None]
"""Publishes a batch on an output port (by name) in the current window."""

_EMITTER = "_emitter"
RUNTIME_ATTRIBUTES = (_EMITTER,)
"""Instance attributes the runtime sets on an operator: never state."""


class Operator:
    """Base class of every operator; override the hooks you need (see the module docs).

    Ports are class attributes (``InputPort`` / ``OutputPort``). Every attribute of the
    instance is state and is checkpointed, except those named in ``NON_STATE`` and the one
    the runtime sets (``connect_outputs``).
    """

    #: instance attributes that are not state (connections, caches): not checkpointed.
    NON_STATE: ClassVar[tuple[str, ...]] = ()
    #: instance attributes reported as user metrics after every window (``operators.metrics``;
    #: methods marked ``@metric`` are too).
    METRICS: ClassVar[tuple[str, ...]] = ()
    #: instance attributes naming input columns (a name, a list of names, or Spark SQL
    #: aggregations by output name): checked at submit against what a source feeding it
    #: emits, when that is known (``operators.column_checks``).
    COLUMNS_READ: ClassVar[tuple[str, ...]] = ()
    #: the same for columns read on one input port only: port name -> attribute names.
    COLUMNS_READ_BY_PORT: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: instance attributes holding keyed state: a mapping from a value of the partition key
    #: (``PARTITION_KEY``) to that key's state, or an Arrow table with a ``PARTITION_KEY``
    #: column. When the operator is repartitioned at run time each new partition gets the
    #: entries (rows) of its keys from every old partition (``repartitioned``).
    KEYED_STATE: ClassVar[tuple[str, ...]] = ()
    #: its window logic runs in Spark (``SparkOperator``, or one using ``context.spark``):
    #: the master's spare containers then keep a warm SparkSession ready for it.
    USES_SPARK: ClassVar[bool] = False

    #: where the rows ``process`` (or a Spark job) fails on go with ``ON_ERROR="DEAD_LETTER"``
    #: (``operators.dead_letters``); not one of ``output_ports()``.
    errors = DeadLetterPort()

    def connect_outputs(self, emit: Emit | None) -> None:
        """Where the output ports publish: ``emit(port name, batch)``; set by the runtime
        (or a test driver) before ``setup``; None disconnects them. Not state."""
        self.__dict__[_EMITTER] = emit

    @property
    def emitter(self) -> Emit | None:
        """What ``connect_outputs`` set (None: the outputs are not connected)."""
        return self.__dict__.get(_EMITTER)

    @property
    def watermark(self) -> int:
        """Event time (epoch ms) up to which this operator's input is complete, as of the
        window ending now (``operators.watermarks``): set by the runtime before
        ``end_window``; ``NO_WATERMARK`` before any, ``END_OF_TIME`` once every input
        ended."""
        marks = self.__dict__.get(WATERMARKS_ATTRIBUTE)
        return NO_WATERMARK if marks is None else marks.current

    def setup(self, context: OperatorContext) -> None:
        """Called once before the first window; the sources wait for every operator's."""

    def activate(self, context: OperatorContext) -> None:
        """Called once after ``setup``, before the first window, while the sources may
        already run: preparation that may take seconds (a JVM, a warm-up) without holding
        the other operators back; this operator's input waits upstream meanwhile."""

    def begin_window(self, window_id: int) -> None:
        """Called at the start of each application window."""

    def process(self, port: str, batch: pa.RecordBatch) -> None:
        """Called for each batch arriving on input ``port``."""

    def end_window(self) -> None:
        """Called at the end of each application window."""

    def checkpointed(self, window_id: int) -> None:
        """Called after the state as of ``window_id`` was saved."""

    def committed(self, window_id: int) -> None:
        """Called when ``window_id`` is committed: it will never be replayed."""

    def teardown(self) -> None:
        """Called once when the operator stops."""

    def unifier(self) -> Operator | None:
        """The operator that merges this operator's partitions' outputs, or None for the
        default (``operators.unifiers.ConcatUnifier``: each window's batches, as they are).

        Called when the DAG is serialised (on the client), never at run time. When the
        operator runs as several partitions (``PARTITIONS``), the master puts a unifier
        in front of every unpartitioned operator it feeds. A unifier receives each
        partition's stream on its own input port (``input-0`` ... ``input-<N-1>``, not
        declared: ``process`` sees those names) and emits on ``output``. Override this
        when concatenating is not the answer, e.g. partial aggregates to combine.
        """
        return None

    def repartitioned(self, partitions: Sequence[Operator],
                      share: PartitionFilter | None) -> Operator:
        """This operator as a new partition, built from the old partitions' states at one
        checkpoint (``self`` is a copy of the first of them); returns the new state.

        Called in the container that first deploys the new partition (again only if that
        container failed before it saved the result as the partition's first checkpoint).
        The default merges every ``KEYED_STATE`` attribute over the old partitions and
        keeps the keys this partition owns; every other attribute is the first old
        partition's (configuration, or state that is the same everywhere). Override it for
        state the default cannot split, e.g. a total over all keys.

        Args:
            partitions: the old partitions, restored from their checkpoints.
            share: the keys this partition takes (``share.owns(values)``, a bool per key
                value; ``share.column``, the key column), or None when the new operator
                is not partitioned (it takes every key).
        """
        for name in type(self).KEYED_STATE:
            setattr(self, name, merge_keyed_state(
                [getattr(p, name, None) for p in partitions], share,
                f"{type(self).__name__}.{name}"))
        return self

    def repartition_refusal(self) -> str | None:
        """Why this operator cannot be repartitioned while it runs, or None when it can.

        Called when the DAG is serialised (on the client). Operators whose state lives
        outside their checkpoints under their own physical id (commit steps of
        exactly-once sinks, write-ahead logs) cannot move it to new partitions.
        """
        return None

    def __getattr__(self, name: str) -> Any:
        """Reached only for a name nothing defines: a mistyped port (``op.outptu``) or
        attribute gets an error listing the ports and the nearest name."""
        __tracebackhide__ = True  # errors point at the caller's line
        if any(name in vars(c) for c in type(self).__mro__):  # a property that failed:
            return object.__getattribute__(self, name)  # its own error, not this one
        if name.startswith("_"):  # private and special names: probed often, no help needed
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}",
                                 name=name, obj=self)
        raise AttributeError(_no_such_port_or_attribute(type(self), name), name=name, obj=self)

    @classmethod
    def input_ports(cls) -> dict[str, InputPort]:
        return {n: p for n, p in _class_ports(cls).items() if isinstance(p, InputPort)}

    @classmethod
    def output_ports(cls) -> dict[str, OutputPort]:
        return {n: p for n, p in _class_ports(cls).items() if isinstance(p, OutputPort)}


class InputOperator(Operator):
    """A source: it drives windows and has no input ports.

    A source that can run as several partitions (``PARTITIONS``) reads only its share of
    the input, by ``context.partition_index`` of ``context.partition_count``, and says so
    with ``SPLITS_INPUT = True``; the master refuses to partition any other source (each
    partition would emit everything).
    """

    #: it reads only its partition's share of the input when partitioned.
    SPLITS_INPUT: ClassVar[bool] = False
    #: columns naming the split each row comes from, when the input is made of splits
    #: that each deliver in order but not in step (Kafka's topic partitions): with
    #: ``EVENT_TIME_COLUMN`` its watermark is then the lowest over its splits
    #: (``operators.watermarks``), so a lagging split's rows are not made late.
    WATERMARK_SPLITS: ClassVar[tuple[str, ...]] = ()
    #: with ``ON_ERROR="DEAD_LETTER"`` it sets aside the records it cannot read (decode) on
    #: its ``errors`` port instead of failing; other sources refuse the attribute.
    DEAD_LETTERS: ClassVar[bool] = False

    def emitted_schema(self) -> pa.Schema | None:
        """What it emits, when known before it runs (its one output port's declared
        schema): the columns its readers name are checked against it at submit."""
        ports = list(type(self).output_ports().values())
        return ports[0].schema if len(ports) == 1 else None

    def emit_tuples(self) -> bool:
        """Emits what is available now, within the current streaming window.

        Called repeatedly until the window's time is up. Emit nothing when nothing is
        ready (the runtime then waits a moment before calling again).

        Returns:
            False once the source is exhausted (a bounded source): the runtime ends the
            window and sends END_STREAM downstream. True otherwise.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement emit_tuples()")

    def watermark_splits(self) -> Sequence[Any]:
        """With ``WATERMARK_SPLITS``: the splits this partition reads now, each named as
        its split columns' values joined with "/" (``"orders/3"``), so that one that has
        not delivered yet holds the watermark back. Asked at every window's end."""
        return ()

    def first_window(self) -> int | None:
        """The window to start at when there is no checkpoint, or None to start at the
        current window. A source that logged its windows before it was lost, before
        any checkpoint, returns the first logged one so they replay (after ``setup``)."""
        return None


class TransientNonState:
    """Mixin for operators whose ``NON_STATE`` attributes cannot travel in a pickle (open
    files, sockets, connections): they are left out of deploy payloads and checkpoints,
    and ``reset_non_state()`` gives them their fresh values after unpickling (``setup``
    then opens what they need). ``SETTINGS`` are the exception: ``NON_STATE`` attributes
    that are the deployment's own settings (credentials, addresses): they travel in deploy
    payloads but never in checkpoints, so a restore keeps the new deployment's values."""

    NON_STATE: ClassVar[tuple[str, ...]] = ()
    SETTINGS: ClassVar[tuple[str, ...]] = ()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()
                if k not in self.NON_STATE or k in self.SETTINGS}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.reset_non_state()

    def reset_non_state(self) -> None:
        """Sets the ``NON_STATE`` attributes to their values before ``setup``."""


def _no_such_port_or_attribute(cls: type, name: str) -> str:
    """What an operator without port or attribute ``name`` says: its ports and the
    nearest name."""
    import difflib

    ports = _class_ports(cls)
    inputs = [n for n, p in ports.items() if isinstance(p, InputPort)]
    outputs = [n for n, p in ports.items() if isinstance(p, OutputPort)]
    public = [n for n in dir(cls) if not n.startswith("_")]
    near = difflib.get_close_matches(name, [*ports, *public], n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return (f"{cls.__name__} has no port or attribute {name!r}: its input ports are "
            f"{inputs or 'none'}, its output ports {outputs or 'none'}{hint}")


def without_default_port(ports: dict[str, Any], name: str, default: Any) -> dict[str, Any]:
    """Drops a base class's default port once a subclass declares a port of its own."""
    if ports.get(name) is default and len(ports) > 1:
        return {n: p for n, p in ports.items() if n != name}
    return ports


def _class_ports(cls: type) -> dict[str, InputPort | OutputPort]:
    ports: dict[str, InputPort | OutputPort] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, InputPort | OutputPort):
                ports[name] = value
    return ports

"""One DAG, both drivers of the window engine: the local runner in this process, or a real
master with real container processes. Fixture ``run_dag`` (``tests/conftest.py``) runs a
test once per driver, so a difference between them is a failing test (as bytewax runs its
tests over ``run_main`` and ``cluster_main``).

Both results are read the same way: each operator as the run left it. The local runner
hands its instances back; in containers, an operator's last checkpoint is what the run
left (the stream's end is checkpointed before ``teardown``), loaded from ``STATE_DIR``
into a copy of the DAG's operator. A ``CollectSink``'s windows are keyed by their window
counter counted from the run's first window (containers start counting from the
application's start time, the local runner from 0).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import cloudpickle
import pyarrow as pa

from weir.container.checkpoint_store import CheckpointStore
from weir.operators import Dag
from weir.operators.operator import Operator
from weir.operators.testing import CollectSink, run_local
from weir.operators.windows import window_counter
from weir.proto import plan_pb2
from weir.runtime.operator_state import restore

__all__ = ["DRIVERS", "DagRun", "RunFailed", "started_cluster"]

DRIVERS = ("local", "containers")

# What a test DAG leaves unset, the container driver sets for speed: small windows and
# heartbeats, one container, Spark small, and a failure that fails the run (the local
# runner does not retry either).
_CONTAINER_DEFAULTS = {
    "STREAMING_WINDOW_SIZE_MILLIS": "100",
    "HEARTBEAT_INTERVAL_MILLIS": "100",
    "CONTAINERS": "1",
    "SPARK_MASTER": "local[1]",
    "SPARK_SHUFFLE_PARTITIONS": "1",
    "SPARK_WARMUP_ROWS": "0",
    "MAX_RESTARTS": "1",
    "RESTART_BACKOFF_MILLIS": "0",
}
_RUN_TIMEOUT_S = 180


class RunFailed(RuntimeError):
    """The run failed; the message has what the driver said (its error, or the master's
    diagnostics and the containers' logs). In containers, ``master`` and ``app_id`` say
    where to ask for more (what only a master knows: attempts, replacements)."""

    def __init__(self, message: str, master: Any = None, app_id: str = "") -> None:
        super().__init__(message)
        self.master = master
        self.app_id = app_id


class DagRun(Protocol):
    """What either driver's run left."""

    driver: str
    first_counter: int  # the window counter of the run's first window
    master: Any  # the master that ran it (containers), else None
    app_id: str  # its application there (containers), else ""

    def operator(self, name: str) -> Operator:
        """Operator ``name`` as the run left it."""

    def windows(self, sink: str) -> dict[int, list[dict[str, Any]]]:
        """A ``CollectSink``'s rows per window it began, by window counter counted from
        the run's first window."""

    def rows(self, sink: str) -> list[dict[str, Any]]:
        """Every row the ``CollectSink`` got, in window order."""

    def table(self, sink: str) -> pa.Table | None:
        """Every row the ``CollectSink`` got, as one table (None: nothing)."""


class _Result:
    """A run's operators by name; the sinks read from them. In containers, ``master`` and
    ``app_id`` say where to ask what only a master knows (its figures, its API)."""

    def __init__(self, driver: str, operators: dict[str, Operator], first_window: int,
                 master: Any = None, app_id: str = "") -> None:
        self.driver = driver
        self._operators = operators
        self.first_counter = window_counter(first_window)
        self.master = master
        self.app_id = app_id

    def operator(self, name: str) -> Operator:
        return self._operators[name]

    def windows(self, sink: str) -> dict[int, list[dict[str, Any]]]:
        collect = self._operators[sink]
        assert isinstance(collect, CollectSink), f"{sink} is not a CollectSink"
        return {window_counter(w) - self.first_counter: collect.rows(w) for w in collect.windows}

    def rows(self, sink: str) -> list[dict[str, Any]]:
        return [row for rows in self.windows(sink).values() for row in rows]

    def table(self, sink: str) -> pa.Table | None:
        collect = self._operators[sink]
        assert isinstance(collect, CollectSink), f"{sink} is not a CollectSink"
        return collect.table()


def run_here(dag: Dag) -> _Result:
    """The local runner's run of ``dag``."""
    try:
        run = run_local(dag)
    except Exception as exc:  # noqa: BLE001 - either driver's failure is a RunFailed
        raise RunFailed(str(exc)) from exc
    names = [op.name for op in dag.to_descriptor().operators]
    return _Result("local", {name: run.operator(name) for name in names}, run.window_ids[0])


def run_in_containers(master: Any, dag: Dag, state_dir: Path,
                      during: Callable[[Any, str], None] | None = None) -> _Result:
    """``dag`` submitted to ``master`` (real container processes), to the end of its
    stream; each operator loaded from its last checkpoint. ``during(client, app_id)`` is
    called every 50 ms while the application runs (what a test samples from the master)."""
    from tests.e2e.conftest import container_logs
    from weir.master.client import WeirClient, WeirClientError

    descriptor = dag.to_descriptor()
    _set_defaults(descriptor, state_dir)
    with WeirClient(master.address) as client:
        try:
            app_id = client.submit(descriptor)
        except WeirClientError as exc:  # refused: a malformed DAG, as the local runner's
            raise RunFailed(str(exc)) from exc
        if during is None:
            info = client.wait(app_id, _RUN_TIMEOUT_S)
        else:
            deadline = time.monotonic() + _RUN_TIMEOUT_S
            while (info := client.application(app_id)).state in ("ACCEPTED", "RUNNING") \
                    and time.monotonic() < deadline:
                during(client, app_id)
                time.sleep(0.05)
        if info.state != "FINISHED":
            raise RunFailed(f"{info.state}: {info.diagnostics}\n{container_logs(master)}",
                            master, app_id)
        physical = [(op.name, op.logical_name or op.name, op.id)
                    for op in client.operators(app_id) if "#unifier" not in op.name]
    store = CheckpointStore(descriptor.attributes["STATE_DIR"])  # (the DAG may name one)
    payloads = {op.name: op.payload for op in descriptor.operators}
    operators, first = {}, None
    for name, logical, op_id in physical:  # a partitioned operator's by ``name#i``
        window = store.latest(op_id)
        assert window is not None, f"operator {name} left no checkpoint"
        operators[name] = restore(cloudpickle.loads(payloads[logical]),
                                  store.load(op_id, window), name)
        collected = getattr(operators[name], "windows", None)
        if isinstance(operators[name], CollectSink) and collected:
            first = collected[0] if first is None else min(first, collected[0])
    return _Result("containers", operators, first if first is not None else 0, master, app_id)


def _set_defaults(descriptor: plan_pb2.DagDescriptor, state_dir: Path) -> None:
    for name, value in {**_CONTAINER_DEFAULTS, "STATE_DIR": str(state_dir)}.items():
        if name not in descriptor.attributes:
            descriptor.attributes[name] = value


@contextlib.contextmanager
def started_cluster(folder: Path) -> Iterator[Any]:
    """A master in this process whose containers are tagged local processes (none left
    after it stopped), for a module's tests (``tests.e2e.conftest.started_master``)."""
    from tests.e2e.conftest import started_master

    with started_master(folder) as master:
        yield master

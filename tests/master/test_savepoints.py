"""A new plan seeded from a savepoint: every operator starts at the savepoint's window,
from its own partition's state, re-split by key when its count changed, fresh when new;
a source's partition count cannot change."""

from __future__ import annotations

import pytest

from tests.master.test_partitions import plan_of, wordcount
from weir.master.planner import build_physical_plan
from weir.master.savepoints import (
    manifest_due,
    manifest_written,
    on_heartbeat,
    plan_from_savepoint,
    start,
)
from weir.proto import plan_pb2
from weir.storage.savepoints import (
    Manifest,
    SavedOperator,
    SavedPartition,
    SavepointError,
    read_manifest,
    write_manifest,
)

WINDOW = (1_700_000_000 << 32) + 99


def savepoint(tmp_path, count_partitions: int = 1, source_partitions: int = 1) -> str:
    names = {"source": "weir.operators.library.sources.TextFileSource",
             "tokenize": "weir.operators.library.transforms.Tokenize",
             "count": "weir.operators.library.transforms.WindowedCount",
             "files": "weir.operators.library.sinks.FileSink"}
    counts = {"source": source_partitions, "count": count_partitions}
    next_id = iter(range(100, 200))
    operators = [SavedOperator(name, cls, [SavedPartition(next(next_id), WINDOW - 1)
                                           for _ in range(counts.get(name, 1))])
                 for name, cls in names.items()]
    path = tmp_path / "sp"
    path.mkdir()
    write_manifest(str(path), Manifest(WINDOW, "wc", "app-0007", operators))
    return str(path)


def test_every_operator_starts_at_the_savepoints_window_from_its_own_state(tmp_path):
    dag = wordcount()
    plan = plan_of(dag)
    path = savepoint(tmp_path)
    manifest, books = plan_from_savepoint(dag.to_descriptor(), plan, path, False,
                                          read_manifest(path))
    assert manifest.window == WINDOW
    seeds = {op.name: op.seed for op in plan.operators.values()}
    assert {name: seed.from_ids for name, seed in seeds.items()} == {
        "source": (100,), "tokenize": (101,), "count": (102,), "files": (103,)}
    assert {seed.window_id for seed in seeds.values()} == {WINDOW}
    assert {seed.savepoint_path for seed in seeds.values()} == {path}
    assert all(op.deploy_window_id == op.recovery_window_id == WINDOW
               for op in plan.operators.values())
    assert {book.latest for book in books.values()} == {WINDOW}


def test_a_new_partition_count_re_splits_the_keyed_state_of_every_old_partition(tmp_path):
    dag = wordcount(PARTITIONS=3, PARTITION_KEY="word")
    plan = plan_of(dag)
    path = savepoint(tmp_path, count_partitions=2)
    plan_from_savepoint(dag.to_descriptor(), plan, path, False, read_manifest(path))
    for op in plan.instances("count"):
        assert op.seed.from_ids == (102, 103) and op.seed.share == op.share
    [unifier] = [op for op in plan.operators.values()
                 if op.type == plan_pb2.OPERATOR_TYPE_UNIFIER]
    assert unifier.seed.from_ids == () and unifier.seed.window_id == WINDOW  # fresh


def test_a_source_cannot_change_its_partition_count(tmp_path):
    dag = wordcount()
    path = savepoint(tmp_path, source_partitions=2)
    with pytest.raises(SavepointError, match="source 'source' had 2 partitions in the "
                                             "savepoint and has 1 now"):
        plan_from_savepoint(dag.to_descriptor(), plan_of(dag), path, False,
                            read_manifest(path))


def running_app(tmp_path):
    from weir.master.application import Application

    dag = wordcount().to_descriptor()
    app = Application("app-0001", dag, build_physical_plan(dag, {}, "app-0001"), 0)
    return app, str(tmp_path / "sp")


def test_a_savepoint_while_running_takes_the_newest_window_every_operator_checkpointed(
        tmp_path):
    app, path = running_app(tmp_path)
    ids = list(app.plan.operators)
    for op_id in ids:
        for window in (10, 20):
            app.checkpoints[op_id].add(window)
    app.checkpoints[ids[-1]].add(30)  # only the last one is there yet
    app.committed_window_id = 10
    start(app, path, stop=False)
    assert app.savepoint.window == 20 and not app.shutdown_requested
    app.committed_window_id = 30
    # nobody deletes what it copies meanwhile
    assert on_heartbeat(app, {}, finished=False) == 20
    parts = {op_id: path for op_id in ids[:-1]}
    parts[ids[-1]] = str(tmp_path / "another")  # not this savepoint's part
    assert on_heartbeat(app, parts, finished=False) == 20
    assert app.savepoint.state == "writing" and manifest_due(app) is None
    # every part is written: the manifest is due, written by the core outside its lock;
    # the window stays held until it is
    assert on_heartbeat(app, {ids[-1]: path}, finished=False) == 20
    due_path, manifest = manifest_due(app)
    assert due_path == path and app.savepoint.state == "writing"
    manifest_written(app, path, "")
    assert app.savepoint.state == "complete" and on_heartbeat(app, {}, finished=False) == 30
    assert manifest_due(app) is None
    assert manifest.window == 20
    assert {p.window for op in manifest.operators for p in op.partitions} == {20}


def test_a_savepoint_waits_for_a_window_every_operator_checkpointed(tmp_path):
    app, path = running_app(tmp_path)
    ids = list(app.plan.operators)
    app.checkpoints[ids[0]].add(10)
    start(app, path, stop=False)
    assert app.savepoint.window == -1 and on_heartbeat(app, {}, finished=False) == -1
    for op_id in ids:
        app.checkpoints[op_id].add(14)
    on_heartbeat(app, {}, finished=False)
    assert app.savepoint.window == 14


def test_a_savepoint_is_refused_once_an_operator_ended_and_given_up_if_one_ends_unsaved(
        tmp_path):
    from weir.master.physical_plan import OperatorState

    app, path = running_app(tmp_path)
    ops = list(app.plan.operators.values())
    ops[0].state = OperatorState.SHUTDOWN
    with pytest.raises(SavepointError, match=r"operators source \(1\) of application "
                                             "app-0001 already ended their streams"):
        start(app, path, stop=False)
    ops[0].state = OperatorState.ACTIVE
    for op in ops:
        app.checkpoints[op.id].add(8)
    start(app, path, stop=False)
    ops[0].state = OperatorState.SHUTDOWN  # it ended before it wrote its part
    assert on_heartbeat(app, {}, finished=False) == app.committed_window_id  # nothing held
    assert app.savepoint.state.startswith("incomplete: operators source (1) ended")


def test_savepoint_stop_waits_for_the_manifest_written_after_the_application_ended():
    """The master writes the manifest in a thread of its own, which may finish after the
    application is FINISHED: `weir savepoint --stop` waits for it (it exited 1 saying the
    savepoint was still "writing")."""
    from weir.master.cli_savepoints import _wait_written
    from weir.proto import client_pb2

    polls = iter([("RUNNING", "writing"), ("FINISHED", "writing"), ("FINISHED", "complete")])

    class Client:
        def application(self, app_id):
            state, savepoint = next(polls)
            return client_pb2.ApplicationInfo(id=app_id, state=state, savepoint_state=savepoint,
                                              savepoint_path="/sp")

    info = _wait_written(Client(), "app-0001", 30, stop=True)  # type: ignore[arg-type]
    assert (info.state, info.savepoint_state) == ("FINISHED", "complete")
    failed = iter([("RUNNING", "operators 'x' wrote no part")])

    class Failing:
        def application(self, app_id):
            state, savepoint = next(failed)
            return client_pb2.ApplicationInfo(id=app_id, state=state, savepoint_state=savepoint)

    assert _wait_written(Failing(), "app-0001", 30, stop=True).state == "RUNNING"  # type: ignore[arg-type]

"""Recovery checkpoints and the committed window on hand-made plans (pure rules, no master)."""

from __future__ import annotations

import doctest

import pytest

from weir.master import checkpoints
from weir.master.checkpoints import (
    CheckpointBook,
    RecoveryNode,
    committed_window,
    is_done,
    recovery_checkpoints,
)

pytestmark = pytest.mark.timeout(30)


def node(*downstream: int, cps: tuple[int, ...] = (), previous: int = -1, frozen: bool = False,
         ended: int | None = None) -> RecoveryNode:
    return RecoveryNode(downstream=downstream, checkpoints=cps, previous=previous,
                        frozen=frozen, ended_window=ended)


def test_docstring_examples():
    assert doctest.testmod(checkpoints).failed == 0


def test_book_keeps_checkpoints_sorted_and_unique_whatever_the_report_order():
    book = CheckpointBook()
    assert [book.add(w, time_ms=t) for w, t in ((60, 6), (20, 2), (40, 4), (20, 9), (-1, 1))] == [
        True, True, True, False, False]
    assert book.windows == [20, 40, 60] and book.latest == 60 and book.high_water == 60
    assert (book.count, book.last_time_ms, book.average_time_ms) == (3, 4, 4.0)
    assert (book.floor(59), book.floor(60), book.floor(19)) == (40, 60, -1)
    book.prune_before(40)
    assert book.windows == [40, 60]
    assert book.forget_after(40) == [60] and book.windows == [40]
    assert book.high_water == 60  # progress is measured against what was ever saved
    assert CheckpointBook().latest == -1 and CheckpointBook().average_time_ms == 0.0


def test_nothing_checkpointed_everything_at_minus_one():
    recovery = recovery_checkpoints({1: node(2), 2: node(3), 3: node()})
    assert recovery == {1: -1, 2: -1, 3: -1}
    assert committed_window(recovery) == -1
    assert committed_window({}) == -1


def test_linear_each_operator_waits_for_the_one_after_it():
    # source(1) -> relay(2) -> sink(3); the sink is behind
    recovery = recovery_checkpoints({
        1: node(2, cps=(20, 40, 60)),
        2: node(3, cps=(20, 40, 60)),
        3: node(cps=(20, 40)),
    })
    assert recovery == {1: 40, 2: 40, 3: 40}
    assert committed_window(recovery) == 40


def test_linear_with_checkpoints_at_different_windows():
    recovery = recovery_checkpoints({
        1: node(2, cps=(10, 30, 50)),
        2: node(3, cps=(20, 40)),
        3: node(cps=(45,)),
    })
    # the relay may go back to 40 (<= 45); the source to its newest <= 40, i.e. 30
    assert recovery == {1: 30, 2: 40, 3: 45}
    assert committed_window(recovery) == 30


def test_fan_out_the_slowest_branch_decides():
    # 1 -> 2, 1 -> 3
    recovery = recovery_checkpoints({
        1: node(2, 3, cps=(20, 40, 60)),
        2: node(cps=(20, 40, 60)),
        3: node(cps=(20,)),
    })
    assert recovery == {1: 20, 2: 60, 3: 20}
    assert committed_window(recovery) == 20


def test_fan_in_each_upstream_bounded_by_the_merge():
    # 1 -> 3, 2 -> 3, 3 -> 4
    recovery = recovery_checkpoints({
        1: node(3, cps=(20, 40, 60)),
        2: node(3, cps=(40,)),
        3: node(4, cps=(20, 40, 60)),
        4: node(cps=(40, 60)),
    })
    assert recovery == {1: 60, 2: 40, 3: 60, 4: 60}
    recovery = recovery_checkpoints({
        1: node(3, cps=(20, 40, 60)),
        2: node(3, cps=(40,)),
        3: node(4, cps=(20, 40, 60)),
        4: node(cps=(40,)),
    })
    assert recovery == {1: 40, 2: 40, 3: 40, 4: 40}


def test_diamond_the_source_waits_for_both_paths():
    # 1 -> 2 -> 4, 1 -> 3 -> 4
    nodes = {
        1: node(2, 3, cps=(20, 40, 60, 80)),
        2: node(4, cps=(20, 40, 60, 80)),
        3: node(4, cps=(20, 40)),
        4: node(cps=(20, 40, 60, 80)),
    }
    recovery = recovery_checkpoints(nodes)
    assert recovery == {1: 40, 2: 80, 3: 40, 4: 80}
    assert committed_window(recovery) == 40


def test_out_of_order_reports_give_the_same_answer():
    late, sorted_ = CheckpointBook(), CheckpointBook()
    for w in (80, 20, 60, 40, 60):
        late.add(w)
    for w in (20, 40, 60, 80):
        sorted_.add(w)
    assert late.windows == sorted_.windows
    nodes = {1: node(2, cps=tuple(late.windows)), 2: node(cps=(50,))}
    assert recovery_checkpoints(nodes) == {1: 40, 2: 50}


def test_recovery_never_moves_backwards():
    # the relay's checkpoints after 40 were forgotten, but its recovery stays at 40
    recovery = recovery_checkpoints({1: node(2, cps=(20,), previous=40), 2: node(previous=40)})
    assert recovery == {1: 40, 2: 40}


def test_pending_deploy_freezes_the_recovery_checkpoint():
    # the relay is being redeployed from 20: newer checkpoints (60 reported late by its old
    # instance) must not move it, and its upstream stays bounded by it
    recovery = recovery_checkpoints({
        1: node(2, cps=(20, 40, 60)),
        2: node(3, cps=(20, 60), previous=20, frozen=True),
        3: node(cps=(60,), previous=60),
    })
    assert recovery == {1: 20, 2: 20, 3: 60}
    assert committed_window(recovery) == 20
    # a leaf pending its first deploy stays at -1 even with a checkpoint on record
    assert recovery_checkpoints({1: node(cps=(20,), frozen=True)}) == {1: -1}


def test_an_ended_operator_counts_as_checkpointed_at_its_last_window():
    # source ended at 55 (last checkpoint 40); relay and sink ended at 55 too
    nodes = {1: node(2, cps=(20, 40), ended=55), 2: node(3, cps=(40,), ended=55),
             3: node(cps=(40,), ended=55)}
    recovery = recovery_checkpoints(nodes)
    assert recovery == {1: 55, 2: 55, 3: 55} and committed_window(recovery) == 55
    assert all(is_done(nodes[i], recovery[i]) for i in nodes)
    # the sink still runs, checkpointed at 50: the ended source may still be asked to
    # rerun from 40, so it is not done
    nodes = {1: node(2, cps=(20, 40), ended=55), 2: node(cps=(50,))}
    recovery = recovery_checkpoints(nodes)
    assert recovery == {1: 40, 2: 50}
    assert not is_done(nodes[1], recovery[1])


def test_a_done_reader_holds_back_no_window_of_an_operator_restarted_after_its_end():
    # the sink ended at 825 and is done; source and relay, lost before their own teardown,
    # restarted from 825 and run on to their end at 830: their windows get committed
    nodes = {1: node(2, cps=(825, 830), ended=830), 2: node(3, cps=(825, 830), ended=830),
             3: node(cps=(825,), ended=825)}
    recovery = recovery_checkpoints(nodes)
    assert recovery == {1: 830, 2: 830, 3: 825}
    assert committed_window(recovery, {1: 830, 2: 830, 3: 825}) == 830
    # a reader that ended but is not done (its recovery checkpoint short of its end) may
    # rerun, so it still bounds what feeds it
    nodes = {1: node(2, cps=(815, 825, 830)), 2: node(3, cps=(815, 825, 830)),
             3: node(cps=(820,), ended=825, previous=820, frozen=True)}
    assert recovery_checkpoints(nodes) == {1: 815, 2: 815, 3: 820}


def test_the_heartbeat_path_lets_a_done_reader_go_too():
    """``update_recovery`` on an application, from a state change and from new checkpoints
    alone: a SHUTDOWN sink checkpointed at its end bounds nothing upstream."""
    from tests.master.fakes import chain_descriptor
    from weir.master.application import Application
    from weir.master.checkpoints import update_recovery
    from weir.master.physical_plan import OperatorState
    from weir.master.planner import build_physical_plan

    dag = chain_descriptor(3)
    app = Application("app-0001", dag, build_physical_plan(dag, {}, "app-0001"), 0)
    source, relay, sink = (app.plan.operators[i] for i in sorted(app.plan.operators))
    for op in (source, relay, sink):
        op.state = OperatorState.ACTIVE
        app.checkpoints[op.id].add(825)
    update_recovery(app)
    assert app.committed_window_id == 825
    sink.state = OperatorState.SHUTDOWN
    app.operator_stats[sink.id].current_window_id = 825
    update_recovery(app)
    for op in (source, relay):  # restarted after the commit of 825, they checkpoint on
        app.checkpoints[op.id].add(830)
        update_recovery(app, [op.id])
    assert (source.recovery_window_id, relay.recovery_window_id) == (830, 830)
    assert app.committed_window_id == 830


def test_cycles_and_unknown_operators_are_errors():
    with pytest.raises(ValueError, match="cycle"):
        recovery_checkpoints({1: node(2), 2: node(1)})
    with pytest.raises(ValueError, match="unknown downstream operator 9"):
        recovery_checkpoints({1: node(9)})


def test_a_very_long_chain_does_not_exhaust_the_stack():
    n = 3_000  # deeper than Python's recursion limit
    nodes = {i: RecoveryNode(downstream=(i + 1,) if i < n - 1 else (), checkpoints=(5, 10))
             for i in range(n)}
    assert set(recovery_checkpoints(nodes).values()) == {10}


@pytest.mark.parametrize("shape", ["chain", "partitioned"])
@pytest.mark.parametrize("seed", range(6))
def test_recomputing_from_the_new_checkpoints_gives_what_recomputing_all_gives(shape, seed):
    """The heartbeat recomputes only what new checkpoints move (``update_recovery(app,
    checkpointed)``); after every step it equals a whole recomputation, books included."""
    import random

    from tests.master.fakes import chain_descriptor, partitioned_dag
    from weir.master.application import Application
    from weir.master.checkpoints import update_recovery
    from weir.master.physical_plan import OperatorState
    from weir.master.planner import build_physical_plan

    def app() -> Application:
        dag = (chain_descriptor(6) if shape == "chain"
               else partitioned_dag().to_descriptor())
        made = Application("app-0001", dag, build_physical_plan(dag, {}, "app-0001"), 0)
        for op in made.plan.operators.values():
            op.state = OperatorState.ACTIVE
        return made

    rng = random.Random(seed)
    partial, whole = app(), app()
    ids = sorted(partial.plan.operators)
    newest = {op_id: 0 for op_id in ids}
    reached = -1
    for step in range(300):
        op_id = rng.choice(ids)
        if rng.random() < 0.05:  # a state change: both recompute everything
            state = rng.choice([OperatorState.PENDING_DEPLOY, OperatorState.ACTIVE,
                                OperatorState.ACTIVE])
            for a in (partial, whole):
                a.plan.operators[op_id].state = state
                update_recovery(a)
            continue
        if partial.plan.operators[op_id].state != OperatorState.ACTIVE:
            for a in (partial, whole):  # deployed again: it reports checkpoints once active
                a.plan.operators[op_id].state = OperatorState.ACTIVE
                update_recovery(a)
        newest[op_id] += rng.choice([10, 10, 20, 30])
        for a in (partial, whole):
            a.checkpoints[op_id].add(newest[op_id])
        update_recovery(partial, [op_id])
        update_recovery(whole)
        got = {i: (op.recovery_window_id, partial.checkpoints[i].windows)
               for i, op in partial.plan.operators.items()}
        want = {i: (op.recovery_window_id, whole.checkpoints[i].windows)
                for i, op in whole.plan.operators.items()}
        assert got == want, f"step {step}"
        assert partial.committed_window_id == whole.committed_window_id, f"step {step}"
        reached = max(reached, whole.committed_window_id)
    assert reached > 0  # the windows got committed along the way

"""Checkpoints, the committed window and recovery, stepped by hand: heartbeats and a manual clock.

The plans are chains (source -> relay1 -> sink) and a fan-in, one operator per container,
so each test plays every container itself.
"""

from __future__ import annotations

import pytest

from tests.master.cluster import (
    ABORT,
    C0,
    C1,
    C2,
    C3,
    FAILED,
    RELAY,
    SHUTDOWN,
    SINK,
    SOURCE,
    Cluster,
    Merge,
    chain,
    checkpointed,
)
from tests.master.fakes import (
    Sink,
    Source,
    chain_descriptor,
    container_heartbeat,
    operator_report,
    window,
)
from weir.master import liveness, recovery
from weir.master.application import ApplicationState
from weir.master.heartbeat import process_heartbeat
from weir.master.physical_plan import ContainerState, OperatorState
from weir.master.recovery import ReplayInvariantBroken, check_replay_invariant, deploy_failed
from weir.master.views import application_info, operator_info
from weir.operators import Dag
from weir.operators.watermarks import END_OF_TIME
from weir.proto import umbilical_pb2

pytestmark = pytest.mark.timeout(30)

def test_checkpoints_move_recovery_and_committed_window_in_every_response():
    cluster = chain()
    checkpointed(cluster, SOURCE, 20, 40, 60)
    checkpointed(cluster, RELAY, 20, 40)
    response = cluster.report(SINK)
    assert response.committed_window_id == -1  # the sink has no checkpoint yet
    response = checkpointed(cluster, SINK, 20)
    assert [cluster.ops[i].recovery_window_id for i in (1, 2, 3)] == [20, 20, 20]
    assert response.committed_window_id == 20 and cluster.app.committed_window_id == 20
    checkpointed(cluster, SINK, 40)
    for cid in (C0, C1, C2):  # every container hears of it, even without reporting anything
        assert cluster.beat(cid).committed_window_id == 40
    book = cluster.app.checkpoints[SOURCE]
    assert book.windows == [40, 60]  # older than its recovery checkpoint: of no more use
    assert (book.count, book.last_time_ms, book.average_time_ms) == (3, 6, 4.0)
    # out of order and repeated reports change nothing
    checkpointed(cluster, SINK, 20, 40)
    assert cluster.beat(C0).committed_window_id == 40


def test_recovery_order_when_one_container_dies():
    cluster = chain()
    checkpointed(cluster, SOURCE, 20, 40, 60)
    checkpointed(cluster, RELAY, 20, 40, 60)
    checkpointed(cluster, SINK, 20, 40)
    assert cluster.app.committed_window_id == 40

    [loss] = cluster.liveness({C1: -9})  # the relay's process is gone
    assert (loss.container_id, loss.replacement_id) == (C1, C3)
    assert (cluster.killed, cluster.launched) == ([C1], [C3])  # one new container
    relay, sink, source = cluster.ops[RELAY], cluster.ops[SINK], cluster.ops[SOURCE]
    assert (relay.state, relay.container_id, relay.deploy_window_id) == (
        OperatorState.PENDING_DEPLOY, C3, 40)
    assert (sink.state, sink.container_id, sink.deploy_window_id) == (
        OperatorState.PENDING_UNDEPLOY, C2, 40)
    assert source.state == OperatorState.ACTIVE and source.failure_count == 0
    assert (relay.failure_count, sink.failure_count) == (1, 0)
    assert cluster.app.checkpoints[RELAY].windows == [40]  # 60 is not trusted any more
    assert cluster.app.state == ApplicationState.RUNNING and cluster.app.recoveries == 1

    # the sink's old instance is undeployed first; what it still reports does not count
    response = cluster.beat(C2, operator_report(SINK, windows=[window(60, checkpoint=60)]))
    assert list(response.undeploy_request) == [SINK] and not response.deploy_request
    assert response.committed_window_id == 40 and sink.recovery_window_id == 40
    assert cluster.app.checkpoints[SINK].windows == [40]
    # the source is not touched
    response = cluster.beat(C0, operator_report(SOURCE, windows=[window(61)]))
    assert not response.undeploy_request and not response.deploy_request
    # undeployed; deploys wait for the new container
    response = cluster.beat(C2)
    assert sink.state == OperatorState.PENDING_DEPLOY
    assert not response.deploy_request and response.has_pending_requests
    # the new container joins: the relay restarts from 40, fed by the source's buffer server
    [info] = cluster.beat(C3).deploy_request
    assert (info.id, info.checkpoint.window_id) == (RELAY, 40)
    assert (info.inputs[0].buffer_server_port, info.outputs[0].buffer_server_port) == (
        7000, 7003)
    # the sink restarts from 40, fed by the NEW container's buffer server
    [info] = cluster.beat(C2).deploy_request
    assert (info.id, info.checkpoint.window_id) == (SINK, 40)
    assert info.inputs[0].buffer_server_port == 7003
    assert info.context_attributes["STATE_DIR"] == cluster.app.attribute("STATE_DIR")
    assert not cluster.beat(C0).deploy_request
    # both report again: ACTIVE, recovery moves on from there
    checkpointed(cluster, RELAY, 60)
    checkpointed(cluster, SINK, 60)
    assert (relay.state, sink.state) == (OperatorState.ACTIVE, OperatorState.ACTIVE)
    assert cluster.beat(C0).committed_window_id == 60
    assert cluster.launched == [C3] and cluster.killed == [C1]


def test_inputs_of_a_redeployed_operator_wait_for_every_undeploy():
    cluster = chain()
    checkpointed(cluster, SOURCE, 20)
    checkpointed(cluster, RELAY, 20)
    checkpointed(cluster, SINK, 20)
    cluster.liveness({C0: 1})  # the source's container: everything restarts
    assert [cluster.ops[i].state for i in (1, 2, 3)] == [
        OperatorState.PENDING_DEPLOY, OperatorState.PENDING_UNDEPLOY,
        OperatorState.PENDING_UNDEPLOY]
    assert not cluster.beat(C3).deploy_request  # relay and sink still undeploying
    assert list(cluster.beat(C1, operator_report(RELAY)).undeploy_request) == [RELAY]
    cluster.beat(C1)
    assert not cluster.beat(C3).deploy_request  # the sink still runs
    cluster.beat(C2)
    [source] = cluster.beat(C3).deploy_request
    assert (source.checkpoint.window_id, source.outputs[0].buffer_server_port) == (20, 7003)
    [relay] = cluster.beat(C1).deploy_request
    assert relay.inputs[0].buffer_server_port == 7003


def test_committed_window_never_moves_backwards_through_a_recovery():
    cluster = chain()
    for op_id in (SOURCE, RELAY, SINK):
        checkpointed(cluster, op_id, 20, 40)
    cluster.liveness({C2: 1})
    assert cluster.beat(C0).committed_window_id == 40
    [info] = cluster.beat(C3).deploy_request
    assert info.checkpoint.window_id == 40


def test_restart_limit_fails_the_application_with_the_reason():
    cluster = chain()
    for attempt in range(1, 7):
        response = cluster.report(SINK, state=FAILED, error=f"KeyError: {attempt}")
        assert response.shutdown == ABORT
        if attempt <= 5:
            assert cluster.app.state == ApplicationState.RUNNING
            assert cluster.ops[SINK].state == OperatorState.PENDING_DEPLOY
    sink = cluster.ops[SINK]
    assert (sink.failure_count, sink.failures_in_a_row, sink.state) == (
        6, 6, OperatorState.FAILED)
    assert cluster.app.state == ApplicationState.FAILED
    assert cluster.app.diagnostics == (
        "operator 'sink' (3) failed 6 times in a row without a new checkpoint "
        "(MAX_RESTARTS=5); last error: KeyError: 6")
    assert len(cluster.launched) == 5  # five replacements, none for the last failure
    assert cluster.killed[-1] == sink.container_id


def test_a_new_checkpoint_forgives_earlier_failures_and_the_limit_is_per_operator():
    cluster = chain(sink__MAX_RESTARTS="1")
    cluster.report(SINK, state=FAILED, error="first")
    cluster.beat(cluster.ops[SINK].container_id)
    checkpointed(cluster, SINK, 20)
    assert (cluster.ops[SINK].failure_count, cluster.ops[SINK].failures_in_a_row) == (1, 0)
    cluster.report(SINK, state=FAILED, error="second")
    assert cluster.app.state == ApplicationState.RUNNING
    cluster.report(SINK, state=FAILED, error="third")
    assert cluster.app.state == ApplicationState.FAILED
    assert "'sink' (3) failed 2 times" in cluster.app.diagnostics
    assert "(MAX_RESTARTS=1); last error: third" in cluster.app.diagnostics


def test_a_lost_container_counts_a_failure_for_each_of_its_operators():
    cluster = Cluster(chain_descriptor(3), 1)
    cluster.deploy_all()
    [loss] = cluster.liveness({"app-0001-c0": 137})
    assert loss.replacement_id == "app-0001-c1"
    for op in cluster.ops.values():
        assert (op.failure_count, op.state, op.container_id) == (
            1, OperatorState.PENDING_DEPLOY, "app-0001-c1")
        assert op.error == "container app-0001-c0 lost: its process exited with code 137"


def test_a_container_that_asks_to_be_restarted_is_replaced_by_the_loop_not_its_heartbeat():
    cluster = chain()
    cluster.clock.advance(100)
    response = process_heartbeat(cluster.app, container_heartbeat(
        C1, port=cluster.port(C1), restart_requested=True), cluster.clock())
    assert response.shutdown == ABORT
    lost = cluster.app.plan.containers[C1]
    assert lost.state == ContainerState.ACTIVE and not cluster.app.launcher_actions
    # its process exits before the loop's pass: the cause stays the one it asked for
    [loss] = cluster.liveness({C1: 0})
    assert (loss.container_id, loss.replacement_id) == (C1, "app-0001-c3")
    assert lost.diagnostics == "it asked to be restarted (its buffer server failed)"
    assert cluster.ops[RELAY].failure_count == 1


def test_liveness_by_window_timeout_blames_the_stuck_operator():
    cluster = chain(relay1__TIMEOUT_WINDOW_COUNT="10")  # 10 x 500 ms
    cluster.report(SOURCE, *(window(w) for w in range(1, 11)))
    cluster.report(RELAY, *(window(w) for w in range(1, 11)))
    cluster.report(SINK, *(window(w) for w in range(1, 11)))
    cluster.clock.advance(6000)
    assert cluster.liveness() == []  # nothing waits for the relay: it is not blocked
    cluster.report(SOURCE, *(window(w) for w in range(11, 21)))  # now data waits for it
    assert cluster.liveness() == []  # blocked operators are looked for once a second
    cluster.clock.advance(1000)
    [loss] = cluster.liveness()
    assert loss.container_id == C1 and loss.replacement_id == C3
    assert "operator 'relay1' (2) is blocked: its window 0:10 has not moved" in loss.cause
    assert "TIMEOUT_WINDOW_COUNT=10" in loss.cause and "'source' upstream" in loss.cause
    relay = cluster.ops[RELAY]
    assert relay.failure_count == 1 and "is blocked" in relay.error
    assert cluster.ops[SOURCE].failure_count == 0 and cluster.ops[SINK].failure_count == 0
    assert cluster.app.plan.containers[C0].state == ContainerState.ACTIVE


def test_the_default_window_timeout_is_120_windows_but_at_least_a_minute():
    """Unset (0), 120 windows of 200 ms would be 24 s: less than a cold first Spark job
    takes on a loaded machine; the default waits a minute."""
    cluster = chain(STREAMING_WINDOW_SIZE_MILLIS="200", HEARTBEAT_TIMEOUT_MILLIS="600000")
    cluster.report(SOURCE, *(window(w) for w in range(1, 11)))
    cluster.report(RELAY, window(1))
    cluster.report(SINK, window(1))
    cluster.report(SOURCE, *(window(w) for w in range(11, 21)))  # data waits for the relay
    cluster.clock.advance(59_000)
    assert cluster.liveness() == []  # 295 windows still: not yet
    cluster.clock.advance(2_000)
    [loss] = cluster.liveness()
    assert "operator 'relay1' (2) is blocked" in loss.cause
    assert "TIMEOUT_WINDOW_COUNT=300 windows of 200 ms" in loss.cause


def test_an_operator_held_back_by_a_slower_downstream_is_not_blamed():
    cluster = chain(relay1__TIMEOUT_WINDOW_COUNT="10")
    cluster.report(SOURCE, *(window(w) for w in range(1, 31)))
    cluster.report(RELAY, *(window(w) for w in range(1, 21)))
    cluster.report(SINK, *(window(w) for w in range(1, 16)))  # the sink is behind the relay
    cluster.clock.advance(6000)
    cluster.report(SINK, window(16))
    assert cluster.liveness() == []


def test_a_stuck_input_operator_is_blamed_once_activated():
    cluster = chain(source__TIMEOUT_WINDOW_COUNT="10")
    for op_id in (SOURCE, RELAY, SINK):
        cluster.report(op_id, window(5))
    cluster.clock.advance(5001)
    [loss] = cluster.liveness()
    assert loss.container_id == C0 and "'source' (1) is blocked" in loss.cause


def heartbeats_for(cluster: Cluster, ms: int) -> None:
    """``ms`` pass with every container beating each second (none is lost meanwhile)."""
    for _ in range(ms // 1000):
        cluster.clock.advance(1000)
        for cid in list(cluster.app.plan.containers):
            cluster.beat(cid)


def test_the_window_clock_starts_when_the_last_operator_is_ready():
    """No data moves before every operator is ready (the sources wait for it): a relay
    ready early is not blamed for the 20 s the sink took to warm Spark."""
    cluster = Cluster(chain_descriptor(3), 3, **{"relay1.TIMEOUT_WINDOW_COUNT": "10"})
    cluster.deploy_all(in_setup=(SINK,))  # 10 windows x 500 ms
    heartbeats_for(cluster, 20_000)
    cluster.report(SINK)  # ready: the sources are activated now
    cluster.report(SOURCE, *(window(w) for w in range(1, 11)))
    heartbeats_for(cluster, 1000)
    assert cluster.liveness() == []
    heartbeats_for(cluster, 5000)
    [loss] = cluster.liveness()
    assert loss.container_id == C1 and "'relay1' (2) is blocked" in loss.cause


def test_sources_start_while_an_operator_activates_which_is_not_blamed_until_it_has():
    """``activate`` (Spark starting and warming up) does not hold the sources back; the
    operator's window clock starts when it has activated, and the views say when."""
    cluster = Cluster(chain_descriptor(3), 3, **{"relay1.TIMEOUT_WINDOW_COUNT": "10"})
    cluster.deploy_all(in_setup=(RELAY,))
    ready_ms = cluster.clock()
    response = cluster.report(RELAY, activating=True)  # setup() returned; activate() runs
    assert list(cluster.beat(C0).activate_request) == [SOURCE]
    assert list(response.activate_request) == []  # (c1 holds no source)
    cluster.report(SOURCE, *(window(w) for w in range(1, 11)))  # data waits for the relay
    heartbeats_for(cluster, 30_000)
    assert cluster.liveness() == []
    relay = operator_info(cluster.app, cluster.ops[RELAY])
    assert (relay.set_up_ms, relay.activated_ms) == (ready_ms, 0)
    cluster.report(RELAY)  # activated
    activated_ms = cluster.clock()
    assert operator_info(cluster.app, cluster.ops[RELAY]).activated_ms == activated_ms
    heartbeats_for(cluster, 1000)
    assert cluster.liveness() == []
    heartbeats_for(cluster, 5000)
    [loss] = cluster.liveness()
    assert loss.container_id == C1 and "'relay1' (2) is blocked" in loss.cause


def test_an_operator_activating_for_longer_than_any_jvm_takes_is_blocked_and_recovered():
    """A JVM that never starts does not hang the application: past its window timeout
    (at least ACTIVATION_FLOOR_MS) the activating operator's container is given up on."""
    cluster = Cluster(chain_descriptor(3), 3, **{"relay1.TIMEOUT_WINDOW_COUNT": "10"})
    cluster.deploy_all(in_setup=(RELAY,))
    cluster.report(RELAY, activating=True)
    heartbeats_for(cluster, liveness.ACTIVATION_FLOOR_MS - 1000)  # 10 windows: 5 s only
    assert cluster.liveness() == []
    heartbeats_for(cluster, 2000)
    [loss] = cluster.liveness()
    assert loss.container_id == C1 and loss.replacement_id == C3
    assert "'relay1' (2) is blocked: it has been activating" in loss.cause
    assert cluster.ops[RELAY].failure_count == 1


@pytest.mark.parametrize("load_stretch", [1.0, 3.0])
def test_an_operator_in_setup_past_its_bound_is_blocked_and_recovered(monkeypatch,
                                                                      load_stretch):
    """A setup() that never returns (a stuck restore, a connection that never opens) does
    not hang the application: past SETUP_TIMEOUT_MILLIS, stretched by the machine's load,
    its container is given up on with the reason; before that it is waited for."""
    monkeypatch.setattr(liveness, "load_stretch", lambda: load_stretch)
    cluster = Cluster(chain_descriptor(3), 3, SETUP_TIMEOUT_MILLIS="5000")
    cluster.deploy_all(in_setup=(RELAY,))
    heartbeats_for(cluster, int(5000 * load_stretch) - 1000)
    assert cluster.liveness() == []
    assert cluster.ops[RELAY].state == OperatorState.ACTIVE and not cluster.ops[RELAY].ready
    heartbeats_for(cluster, 2000)
    [loss] = cluster.liveness()
    assert loss.container_id == C1 and loss.replacement_id == C3
    assert "'relay1' (2) is blocked: it has been in setup() for" in loss.cause
    assert "over SETUP_TIMEOUT_MILLIS=5000 ms" in loss.cause
    assert ("stretched 3.0x by the machine's load" in loss.cause) == (load_stretch > 1)
    assert cluster.ops[RELAY].failure_count == 1


def test_an_operator_waiting_for_an_upstream_still_in_setup_is_not_blamed():
    """A fan-in whose left input runs while its right one warms Spark is held back by
    the right one, not stuck."""
    cluster = fan_in(**{"merge.TIMEOUT_WINDOW_COUNT": "10"}, in_setup=(2,))
    left, right, merge = (cluster.app.plan.operator_by_name(n) for n in ("a", "b", "merge"))
    assert not right.ready
    cluster.report(left.id, *(window(w) for w in range(1, 11)))
    heartbeats_for(cluster, 30_000)
    assert cluster.liveness() == []
    cluster.report(right.id)
    heartbeats_for(cluster, 6000)
    merge_container = merge.container_id
    [loss] = cluster.liveness()
    assert "'merge'" in loss.cause and loss.container_id == merge_container


def test_a_source_whose_stream_ended_waits_for_its_commit_unblamed():
    """A source at the end of its input reports END_OF_TIME and moves no more: it waits
    for the commit of its last window, which a recovery downstream may hold up."""
    cluster = chain(source__TIMEOUT_WINDOW_COUNT="10")
    cluster.report(SOURCE, window(4), window(5, watermark=END_OF_TIME))
    cluster.report(RELAY, window(5))
    cluster.report(SINK, window(5))
    heartbeats_for(cluster, 8000)
    assert cluster.liveness() == []


def test_at_most_once_restarts_from_the_newest_checkpoint():
    cluster = chain(PROCESSING_MODE="AT_MOST_ONCE")
    checkpointed(cluster, SOURCE, 20, 40, 60)
    checkpointed(cluster, RELAY, 20, 40, 60)
    checkpointed(cluster, SINK, 20)
    assert cluster.ops[RELAY].recovery_window_id == 20
    cluster.liveness({C1: 1})
    assert cluster.ops[RELAY].deploy_window_id == 60  # newest, not the recovery checkpoint
    assert cluster.ops[SINK].deploy_window_id == 20
    cluster.beat(C2)
    [info] = cluster.beat(C3).deploy_request
    assert info.checkpoint.window_id == 60
    assert info.context_attributes["PROCESSING_MODE"] == "AT_MOST_ONCE"


def exactly_once_chain() -> Cluster:
    """The chain in EXACTLY_ONCE: the relay's container is lost first; the source has
    checkpoints well past what the relay and the sink restart from."""
    cluster = chain(PROCESSING_MODE="EXACTLY_ONCE", CHECKPOINT_WINDOW_COUNT="1")
    checkpointed(cluster, SOURCE, 20, 40, 48, 63)
    checkpointed(cluster, RELAY, 20, 40, 48)
    checkpointed(cluster, SINK, 20, 46)
    cluster.liveness({C1: -9})
    return cluster


def test_exactly_once_restarts_each_operator_no_later_than_its_readers_need():
    cluster = exactly_once_chain()
    relay, sink, source = cluster.ops[RELAY], cluster.ops[SINK], cluster.ops[SOURCE]
    assert sink.deploy_window_id == 46  # its newest checkpoint: only the window in flight
    # the relay's newest (48) would skip windows 47 and 48 that the sink needs
    assert relay.deploy_window_id == 40
    assert source.state == OperatorState.ACTIVE  # its buffer server replays after 40


def test_the_upstream_lost_while_its_reader_recovers_replays_what_the_reader_needs():
    """The issue's case: the counter's container dies, then the source's, before the
    counter made a new checkpoint; the source restarted from its newest checkpoint (63)
    and the counter, restarting after 40, silently lost windows 41 to 63."""
    cluster = exactly_once_chain()
    cluster.clock.advance(5000)
    cluster.liveness({C0: -9})
    relay, sink, source = cluster.ops[RELAY], cluster.ops[SINK], cluster.ops[SOURCE]
    assert (sink.deploy_window_id, relay.deploy_window_id) == (46, 40)
    assert source.deploy_window_id == 40  # not 63
    assert cluster.app.checkpoints[SOURCE].windows[-1] == 40  # 48 and 63 are not trusted
    assert cluster.app.state == ApplicationState.RUNNING


def test_a_recovery_that_would_lose_windows_fails_the_application(monkeypatch):
    # the rule this project had: EXACTLY_ONCE restarts from the newest checkpoint, always
    monkeypatch.setattr(recovery, "deploy_checkpoint",
                        lambda op, book, need=None: max(book.latest, op.recovery_window_id))
    cluster = exactly_once_chain()
    assert cluster.app.state == ApplicationState.FAILED
    assert "recovery refused, it would lose windows: operator 'relay1' (2) would restart " \
           "after window 0:48, but its reader 'sink' (3) restarts after 0:46" in \
           cluster.app.diagnostics


def test_the_replay_invariant_names_what_would_be_lost():
    cluster = chain()
    ops = list(cluster.ops.values())
    check_replay_invariant(cluster.app, ops, {SOURCE: 20, RELAY: 20, SINK: 40})
    with pytest.raises(ReplayInvariantBroken, match=r"'source' \(1\) would restart after "
                                                    r"window 0:63, but its reader 'relay1'"):
        check_replay_invariant(cluster.app, ops, {SOURCE: 63, RELAY: 40, SINK: 40})
    with pytest.raises(ReplayInvariantBroken, match="while its reader 'relay1' .* keeps running"):
        check_replay_invariant(cluster.app, [cluster.ops[SOURCE]], {SOURCE: 20})
    checkpointed(cluster, SOURCE, 20, 40)
    checkpointed(cluster, RELAY, 20, 40)
    checkpointed(cluster, SINK, 20, 40)
    assert cluster.app.committed_window_id == 40
    with pytest.raises(ReplayInvariantBroken, match="'source' .* keeps only the windows after "
                                                    "the committed window"):
        check_replay_invariant(cluster.app, [cluster.ops[RELAY], cluster.ops[SINK]],
                               {RELAY: 20, SINK: 40})


def test_ended_operators_count_as_checkpointed_at_their_last_window():
    cluster = chain()
    checkpointed(cluster, SOURCE, 20)
    cluster.report(SOURCE, window(25), state=SHUTDOWN)
    checkpointed(cluster, RELAY, 20)
    cluster.report(RELAY, window(25), state=SHUTDOWN)
    checkpointed(cluster, SINK, 20)
    assert cluster.beat(C0).committed_window_id == 20
    response = cluster.report(SINK, window(25), state=SHUTDOWN)
    assert response.committed_window_id == 25
    assert cluster.app.state == ApplicationState.FINISHED


def fan_in(in_setup: tuple[int, ...] = (), **overrides: str) -> Cluster:
    """a (c0) and b (c1) -> merge (c2) -> sink (c3); ``overrides`` as -D gives them,
    ``in_setup``: operators not ready yet."""
    dag = Dag("fanin")
    a = dag.add_operator("a", Source(), CONTAINER=0)
    b = dag.add_operator("b", Source(), CONTAINER=1)
    merge = dag.add_operator("merge", Merge(), CONTAINER=2)
    sink = dag.add_operator("sink", Sink(), CONTAINER=3)
    dag.add_stream("left", a.output, merge.left)
    dag.add_stream("right", b.output, merge.right)
    dag.add_stream("out", merge.output, sink.input)
    cluster = Cluster(dag.to_descriptor(), 4, **overrides)
    cluster.deploy_all(in_setup=in_setup)
    return cluster


def test_a_done_upstream_is_not_rerun_and_its_subscribers_are_told_it_ended():
    cluster = fan_in()
    a, b, merge, sink = (cluster.app.plan.operator_by_name(n) for n in ("a", "b", "merge", "sink"))
    checkpointed(cluster, a.id, 20)
    cluster.report(a.id, window(30), state=SHUTDOWN)  # a ended after window 30
    for op in (b, merge, sink):
        checkpointed(cluster, op.id, 20, 40)
    assert a.recovery_window_id == 30  # its end: nothing downstream needs it again
    # losing a's container: nothing to recover, no new container
    [loss] = cluster.liveness({"app-0001-c0": 0})
    assert loss.replacement_id == "" and cluster.launched == []
    assert a.state == OperatorState.SHUTDOWN and a.failure_count == 0
    # losing merge's container: merge and sink restart from 40; a is told to be over
    [loss] = cluster.liveness({"app-0001-c2": 1})
    assert loss.replacement_id == "app-0001-c4"
    assert (merge.state, sink.state, b.state) == (
        OperatorState.PENDING_DEPLOY, OperatorState.PENDING_UNDEPLOY, OperatorState.ACTIVE)
    cluster.beat("app-0001-c3")
    [info] = cluster.beat("app-0001-c4").deploy_request
    left, right = info.inputs
    assert (left.port_name, left.upstream_end_window) == ("left", 30)
    assert right.port_name == "right" and not right.HasField("upstream_end_window")
    assert (right.buffer_server_port, info.checkpoint.window_id) == (7001, 40)


def test_a_terminal_application_recovers_nothing():
    cluster = chain()
    cluster.app.transition(ApplicationState.KILLED, cluster.clock(), "enough")
    losses = cluster.liveness({C1: 0})
    assert [(x.container_id, x.replacement_id) for x in losses] == [(C1, "")]
    assert cluster.launched == [] and cluster.killed == [C1]
    assert cluster.ops[RELAY].failure_count == 0


def test_a_failed_deploy_counts_as_a_failure_of_its_operator():
    cluster = chain(relay1__MAX_RESTARTS="1")
    for op_id in (SOURCE, RELAY, SINK):
        checkpointed(cluster, op_id, 20)
    cluster.liveness({C1: 1})
    cluster.beat(C2)  # the sink is undeployed
    [info] = cluster.beat(C3).deploy_request
    assert info.checkpoint.window_id == 20
    relay = cluster.ops[RELAY]
    c3 = cluster.app.plan.containers[C3]
    assert deploy_failed(cluster.app, c3, [RELAY], "no checkpoint 0:20", cluster.clock()) \
        is not None
    assert c3.state == ContainerState.KILLED and relay.state == OperatorState.FAILED
    assert cluster.app.state == ApplicationState.FAILED  # 2 failures in a row, limit 1
    assert cluster.app.diagnostics.endswith("last error: no checkpoint 0:20")
    # an error about an operator that runs is only recorded
    cluster = chain()
    c1 = cluster.app.plan.containers[C1]
    assert deploy_failed(cluster.app, c1, [RELAY], "boom", cluster.clock()) is None
    assert c1.state == ContainerState.ACTIVE


def test_a_failed_deploy_is_acted_on_though_a_heartbeat_showed_the_operator_active():
    """The disk-full case: the container showed the operator ACTIVE while its setup ran,
    then reported that the deployment failed; the master restarts its container, or the
    operator would stay ACTIVE on the master's books, absent from the container, for ever."""
    cluster = Cluster(chain_descriptor(3), 3)
    cluster.deploy_all(in_setup=(RELAY,))
    relay = cluster.ops[RELAY]
    c1 = cluster.app.plan.containers[C1]
    assert relay.state == OperatorState.ACTIVE and not relay.ready
    stale = relay.generation + 1  # a report about another deployment of it blames nothing
    assert deploy_failed(cluster.app, c1, [RELAY], "cannot claim its fence: [Errno 28] No "
                         "space left on device", cluster.clock(), stale) is None
    assert c1.state == ContainerState.ACTIVE
    loss = deploy_failed(cluster.app, c1, [RELAY], "cannot claim its fence: [Errno 28] No "
                         "space left on device", cluster.clock(), relay.generation)
    assert loss is not None and c1.state == ContainerState.KILLED
    assert relay.failure_count == 1 and "No space left" in relay.error


def test_a_deployment_stuck_behind_its_previous_one_is_acted_on_whatever_was_reported():
    """The double failure: the new deployment waits for the previous one, stuck in its
    setup or a job, and gives up; the old one had shown the operator ready, but the
    failed deployment is the current generation: the container is restarted."""
    cluster = chain()
    relay, c1 = cluster.ops[RELAY], cluster.app.plan.containers[C1]
    assert relay.state == OperatorState.ACTIVE and relay.ready
    message = ("operator relay1 (2) is not deployed: its previous deployment in container "
               f"{C1} has not stopped within 125 s (stuck in setup?)")
    assert deploy_failed(cluster.app, c1, [RELAY], message, cluster.clock()) is None  # no
    assert deploy_failed(cluster.app, c1, [RELAY], message, cluster.clock(),  # generation
                         relay.generation) is not None
    assert c1.state == ContainerState.KILLED and "has not stopped within" in relay.error


# -- errors that cannot succeed on retry ------------------------------------------------------
BAD_SQL = ("AnalysisException: [UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or "
           "function parameter with name `nope` cannot be resolved. SQLSTATE: 42703; line 1 "
           "pos 7; (at spark.py:275 in transform)")


def test_a_fatal_failure_fails_the_application_at_once():
    cluster = chain(MAX_RESTARTS="5")
    response = cluster.report(RELAY, state=FAILED, error=BAD_SQL, fatal=True)
    assert response.shutdown == ABORT
    app, relay = cluster.app, cluster.ops[RELAY]
    assert app.state == ApplicationState.FAILED
    assert app.diagnostics == (f"operator 'relay1' (2) failed: {BAD_SQL} (not retried: this "
                               "error cannot succeed on retry)")
    assert (relay.state, relay.failure_count, relay.error) == (OperatorState.FAILED, 1, BAD_SQL)
    assert cluster.killed == [C1] and cluster.launched == []  # no replacement, no restart
    assert app.recoveries == 0
    for cid in (C0, C2):  # everyone else is told to stop
        assert cluster.beat(cid).shutdown == ABORT


def test_a_failure_that_is_not_fatal_is_still_retried():
    cluster = chain()
    cluster.report(RELAY, state=FAILED, error="ConnectionResetError: peer went away")
    assert cluster.app.state == ApplicationState.RUNNING
    assert cluster.launched == [C3] and cluster.ops[RELAY].failure_count == 1


def test_a_fatal_deploy_error_fails_the_application_at_once():
    """The container reports the operator it could not build FAILED and fatal (no ReportError)."""
    cluster = Cluster(chain_descriptor(3), 3)
    for cid in (C0, C1, C2):
        cluster.beat(cid)
    [info] = cluster.beat(C1).deploy_request
    assert cluster.ops[RELAY].state == OperatorState.PENDING_DEPLOY
    error = ("operator relay1 (tests.Relay) cannot be rebuilt in container app-0001-c1: "
             "ModuleNotFoundError: No module named 'tests'")
    response = cluster.beat(C1, umbilical_pb2.OperatorHeartbeat(
        node_id=info.id, state=FAILED, error=error, fatal=True))
    assert response.shutdown == ABORT
    assert cluster.app.state == ApplicationState.FAILED
    assert cluster.app.diagnostics.startswith(f"operator 'relay1' (2) failed: {error}")
    assert cluster.ops[RELAY].failure_count == 1 and cluster.launched == []


def relay_lost_at_20() -> Cluster:
    """The chain, every operator checkpointed at 20, then the relay's container lost."""
    cluster = chain()
    for op_id in (SOURCE, RELAY, SINK):
        checkpointed(cluster, op_id, 20)
    cluster.liveness({C1: -9})
    return cluster


def test_every_redeploy_is_a_new_generation_that_readers_are_told_of():
    cluster = chain()
    assert [op.generation for op in cluster.ops.values()] == [1, 1, 1]
    checkpointed(cluster, SOURCE, 20)
    checkpointed(cluster, RELAY, 20)
    checkpointed(cluster, SINK, 20)
    cluster.liveness({C1: -9})
    relay, sink = cluster.ops[RELAY], cluster.ops[SINK]
    assert (cluster.ops[SOURCE].generation, relay.generation, sink.generation) == (1, 2, 2)
    cluster.beat(C2)  # the sink's old instance is gone: pending deploy
    [info] = cluster.beat(C3).deploy_request
    assert (info.id, info.generation) == (RELAY, 2)
    assert info.inputs[0].source_generation == 1  # it reads the source's first deployment
    [info] = cluster.beat(C2).deploy_request
    assert (info.id, info.generation, info.inputs[0].source_generation) == (SINK, 2, 2)


def test_a_report_of_a_replaced_generation_is_ignored_and_the_deploy_goes_on():
    cluster = relay_lost_at_20()
    cluster.beat(C2)  # undeployed
    sink = cluster.ops[SINK]
    stale = operator_report(SINK, windows=[window(30, checkpoint=30)])
    stale.generation = 1  # the replaced deployment, still running in the surviving container
    cluster.beat(C3)
    response = cluster.beat(C2, stale)
    assert [i.id for i in response.deploy_request] == [SINK]
    assert sink.state == OperatorState.PENDING_DEPLOY
    assert cluster.app.checkpoints[SINK].windows == [20]  # its checkpoint 30 is not taken


def test_a_redeployed_operator_is_shown_recovering_until_it_finishes_a_window():
    cluster = relay_lost_at_20()
    cluster.beat(C2)
    cluster.beat(C3)
    restoring = operator_report(RELAY)
    restoring.recovering, restoring.generation = True, 2
    cluster.beat(C3, restoring)
    relay = cluster.ops[RELAY]
    assert relay.state == OperatorState.ACTIVE
    assert operator_info(cluster.app, relay).state == "RECOVERING"
    done = operator_report(RELAY, windows=[window(21)])
    done.generation = 2
    cluster.beat(C3, done)
    assert operator_info(cluster.app, relay).state == "ACTIVE"


def test_containers_that_stop_with_a_finished_application_are_no_failures():
    cluster = chain()
    for op_id in (SOURCE, RELAY, SINK):
        cluster.report(op_id, window(25), state=SHUTDOWN)
    assert cluster.app.state == ApplicationState.FINISHED
    cluster.liveness({C0: 0, C1: 0, C2: 0})
    assert all(c.state == ContainerState.KILLED for c in cluster.app.plan.containers.values())
    assert list(application_info(cluster.app).recent_failures) == []


def test_restarts_in_a_row_wait_longer_each_time_up_to_the_maximum():
    """Issue 36: a lasting fault spent every restart back to back. The first restart after
    a checkpoint is at once; each further one in a row waits twice as long, up to the
    maximum, and its operators are not deployed before then."""
    cluster = chain(MAX_RESTARTS="9", RESTART_BACKOFF_MILLIS="1000",
                    RESTART_BACKOFF_MAX_MILLIS="3000")
    delays = []
    for attempt in range(1, 6):
        cluster.report(SINK, state=FAILED, error=f"OSError: disk full {attempt}")
        delays.append(cluster.app.restart_delay_ms)
        replacement = cluster.ops[SINK].container_id
        held_back = cluster.beat(replacement)
        assert bool(held_back.deploy_request) == (cluster.app.restart_delay_ms == 0)
        cluster.clock.advance(cluster.app.restart_delay_ms)
        assert [d.id for d in cluster.beat(replacement).deploy_request] == [SINK]
    assert delays == [0, 1000, 2000, 3000, 3000]
    shown = application_info(cluster.app)
    assert (shown.restart_delay_ms, shown.restart_at_ms) == (3000, cluster.app.restart_at_ms)
    checkpointed(cluster, SINK, 20)  # a new checkpoint: the next restart is at once again
    cluster.report(SINK, state=FAILED, error="OSError: disk full again")
    assert cluster.app.restart_delay_ms == 0

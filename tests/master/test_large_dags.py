"""Large DAGs: a plan over MAX_OPERATORS is refused before it is made, a 10,000-operator
chain is planned and deployed (the planner and the first deploys are linear: quadratic
ones took the master ~15 minutes), and planning holds no lock another application's
heartbeats wait on."""

from __future__ import annotations

import threading

import pytest

from tests.master.fakes import ManualClock, chain_descriptor, container_heartbeat
from weir.master import submit_plan as core_module
from weir.master.core import MasterCore
from weir.master.errors import InvalidArgument
from weir.master.launcher import RecordingLauncher
from weir.master.planner import build_physical_plan
from weir.proto import plan_pb2

pytestmark = pytest.mark.timeout(120)


def chain(n: int, name: str = "chain") -> plan_pb2.DagDescriptor:
    """source -> relay1 -> ... -> sink as a descriptor, built directly (fast at 10,000)."""
    dag = plan_pb2.DagDescriptor(name=name)
    names = ["source", *(f"relay{i}" for i in range(1, n - 1)), "sink"]
    for i, op_name in enumerate(names):
        op = dag.operators.add(name=op_name, class_name="tests.master.fakes.Relay")
        if i == 0:
            op.kind = plan_pb2.OPERATOR_KIND_INPUT
            op.class_name = "tests.master.fakes.Source"
        else:
            op.inputs.add(name="input")
        if i < n - 1:
            op.outputs.add(name="output")
    for i in range(n - 1):
        dag.streams.add(name=f"s{i}", source_operator=names[i], source_port="output",
                        sinks=[plan_pb2.StreamSink(operator=names[i + 1], port="input")])
    return dag


def new_core() -> MasterCore:
    return MasterCore(RecordingLauncher("127.0.0.1:1"), clock=ManualClock())


def test_a_plan_over_max_operators_is_refused_at_submit_and_nothing_is_added():
    core = new_core()
    with pytest.raises(InvalidArgument, match=r"5 physical operators .* MAX_OPERATORS=4"):
        core.submit(chain_descriptor(5), {"MAX_OPERATORS": "4"})
    assert core.list_applications() == []
    assert core.submit(chain_descriptor(5), {"MAX_OPERATORS": "5"})


def test_partitions_and_unifiers_count_toward_max_operators():
    dag = chain_descriptor(3)  # source, relay1, sink; relay1 in 3 partitions + 1 unifier
    overrides = {"relay1.PARTITIONS": "3", "relay1.PARTITION_KEY": "k"}
    plan = build_physical_plan(dag, {**overrides, "MAX_OPERATORS": "6"}, "app-0001")
    assert len(plan.operators) == 6
    with pytest.raises(ValueError, match="6 physical operators"):
        build_physical_plan(dag, {**overrides, "MAX_OPERATORS": "5"}, "app-0001")


def test_the_default_cap_refuses_10001_operators_and_plans_and_deploys_10000():
    core = new_core()
    with pytest.raises(InvalidArgument, match="10,001 physical operators"):
        core.submit(chain(10_001), {})
    app_id = core.submit(chain(10_000), {"CONTAINERS": "4"})
    app = core.application(app_id)
    assert len(app.plan.operators) == 10_000
    deployed: set[int] = set()
    for _ in range(2):  # every container ACTIVE, then each gets its operators
        for i, cid in enumerate(app.plan.containers):
            answer = core.heartbeat(container_heartbeat(cid, port=7000 + i))
            deployed.update(info.id for info in answer.deploy_request)
    assert deployed == set(app.plan.operators)


def test_another_applications_heartbeats_are_answered_while_a_dag_is_planned(monkeypatch):
    core = new_core()
    running = core.submit(chain_descriptor(3), {"CONTAINERS": "1"})
    [cid] = core.application(running).plan.containers
    core.heartbeat(container_heartbeat(cid))
    planning, release = threading.Event(), threading.Event()

    def slow_plan(*args, **kwargs):  # a plan that takes as long as the test says
        planning.set()
        assert release.wait(60), "the test never released the plan"
        return build_physical_plan(*args, **kwargs)

    monkeypatch.setattr(core_module, "build_physical_plan", slow_plan)
    submitted: list[str] = []
    submit = threading.Thread(target=lambda: submitted.append(
        core.submit(chain_descriptor(4, name="big"), {})), daemon=True)
    submit.start()
    assert planning.wait(30)
    answered = threading.Event()
    beat = threading.Thread(target=lambda: (core.heartbeat(container_heartbeat(cid)),
                                            core.list_applications(), answered.set()),
                            daemon=True)
    beat.start()
    # planning holds no lock: the heartbeat and the listing are answered before it ends
    held_up = not answered.wait(30)
    release.set()
    submit.join(30)
    assert not held_up, "a heartbeat waited for another application's planning"
    assert len(submitted) == 1 and submitted[0] != running


def test_only_an_application_master_takes_an_application_id_and_only_its_own_once():
    master = new_core()
    with pytest.raises(InvalidArgument, match="chooses application ids itself"):
        master.submit(chain_descriptor(3), {}, app_id="app-0042")
    own = MasterCore(RecordingLauncher("127.0.0.1:1"), clock=ManualClock(),
                     only_application="app-0042")
    with pytest.raises(InvalidArgument, match="runs app-0042, not 'app-0007'"):
        own.submit(chain_descriptor(3), {}, app_id="app-0007")
    with pytest.raises(InvalidArgument, match="runs app-0042 alone"):
        own.submit(chain_descriptor(3), {})
    assert own.submit(chain_descriptor(3), {}, app_id="app-0042") == "app-0042"
    with pytest.raises(InvalidArgument, match="runs app-0042 alone"):
        own.submit(chain_descriptor(3), {}, app_id="app-0042")

"""What a container asks its cluster manager for (CONTAINER_MEMORY_MB, CONTAINER_CORES):
handed to the launcher with every launch, refused at submit when no node could meet it
(or when Spark's driver would not fit), a container waiting for room shown as such
instead of being given up on, and the local launcher holding containers to it."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.harness import poll_for
from tests.master.fakes import ManualClock, chain_descriptor
from tests.master.test_heartbeat import make_app
from weir.master.core import MasterCore
from weir.master.errors import InvalidArgument
from weir.master.launcher import RecordingLauncher, Resources, UnplaceableRequest
from weir.master.liveness import check_liveness
from weir.master.local_launcher import LocalProcessLauncher
from weir.master.local_limits import MEMORY_POLL_S, CoreSets, MemoryGuard, tree_memory_bytes
from weir.master.physical_plan import ContainerState

pytestmark = pytest.mark.timeout(30)


def test_every_launch_carries_the_applications_request():
    launcher = RecordingLauncher()
    core = MasterCore(launcher, clock=ManualClock())
    app_id = core.submit(chain_descriptor(3), {"CONTAINER_MEMORY_MB": "1536",
                                               "CONTAINER_CORES": "0.5"})
    assert launcher.launched and set(launcher.requests) == set(launcher.launched)
    assert set(launcher.requests.values()) == {Resources(memory_mb=1536, cores=0.5)}
    core.kill_application(app_id, "done")


def test_no_request_is_the_default():
    launcher = RecordingLauncher()
    core = MasterCore(launcher, clock=ManualClock())
    core.submit(chain_descriptor(2), {})
    assert set(launcher.requests.values()) == {Resources(memory_mb=0, cores=0.0)}


@pytest.mark.parametrize(("name", "value"), [("CONTAINER_MEMORY_MB", "-1"),
                                             ("CONTAINER_CORES", "nan"),
                                             ("CONTAINER_CORES", "2000")])
def test_a_request_that_is_no_request_is_refused_at_submit(name, value):
    core = MasterCore(RecordingLauncher(), clock=ManualClock())
    with pytest.raises(InvalidArgument, match=name):
        core.submit(chain_descriptor(2), {name: value})


def test_the_local_launcher_refuses_more_than_this_machine_at_submit(tmp_path):
    launcher = LocalProcessLauncher("127.0.0.1:1", log_dir=tmp_path / "logs")
    core = MasterCore(launcher, clock=ManualClock())
    too_much = (psutil.virtual_memory().total >> 20) + 1
    with pytest.raises(InvalidArgument, match="CONTAINER_MEMORY_MB=.*this machine's memory"):
        core.submit(chain_descriptor(2), {"CONTAINER_MEMORY_MB": str(too_much)})
    with pytest.raises(InvalidArgument, match="CONTAINER_CORES=.*cores"):
        core.submit(chain_descriptor(2), {"CONTAINER_CORES": str((os.cpu_count() or 1) + 1)})
    assert core.list_applications() == []  # nothing planned, nothing launched
    assert not list((tmp_path / "logs").iterdir())
    with pytest.raises(UnplaceableRequest):  # and a launch asked directly, too
        launcher.launch("c0", Resources(memory_mb=too_much))
    launcher.check_request(Resources(memory_mb=64, cores=1))  # what fits is fine


def test_a_container_waiting_for_room_is_shown_and_not_given_up_on():
    clock = ManualClock()
    app = make_app(clock, HEARTBEAT_TIMEOUT_MILLIS="1000")
    reason = "0/3 nodes are available: 3 Insufficient memory."
    waiting = {"app-0001-c1": reason}
    for _ in range(5):  # 5 s: far past twice the heartbeat timeout
        clock.advance(1000)
        losses = check_liveness(app, clock(), {}, 60_000, waiting)
        assert "app-0001-c1" not in [loss.container_id for loss in losses]
    c1 = app.plan.containers["app-0001-c1"]
    assert c1.state == ContainerState.ALLOCATED
    assert c1.diagnostics == f"waiting to be placed: {reason}"
    # placed now: the reason goes, and it has twice the timeout from here to call in
    clock.advance(1500)
    assert check_liveness(app, clock(), {}, 60_000, {}) == []
    assert c1.diagnostics == ""
    clock.advance(1000)
    [loss] = check_liveness(app, clock(), {}, 60_000, {})
    assert loss.container_id == "app-0001-c1" and "never sent a heartbeat" in loss.cause


def test_a_reason_the_launcher_gives_is_part_of_the_loss():
    clock = ManualClock()
    app = make_app(clock)
    clock.advance(100)
    [loss] = check_liveness(app, clock(), {"app-0001-c1": -9}, 60_000, {},
                            {"app-0001-c1": "killed by the local launcher: over its limit"})
    assert loss.cause == ("its process exited with code -9: killed by the local launcher: "
                          "over its limit")


def test_spark_containers_asking_for_less_than_the_driver_needs_are_refused_at_submit():
    core = MasterCore(RecordingLauncher(), clock=ManualClock())
    spark = chain_descriptor(2)
    spark.operators[0].uses_spark = True
    with pytest.raises(InvalidArgument, match=r"CONTAINER_MEMORY_MB=1200 .*SPARK_DRIVER_MEMORY="
                                              r"1g: 1,408 MB"):
        core.submit(spark, {"CONTAINER_MEMORY_MB": "1200"})  # 1 GB heap + 384 MB
    with pytest.raises(InvalidArgument, match="SPARK_DRIVER_MEMORY=4096m: 4,506 MB"):
        core.submit(spark, {"CONTAINER_MEMORY_MB": "4500", "SPARK_DRIVER_MEMORY": "4096m"})
    core.submit(spark, {"CONTAINER_MEMORY_MB": "1408"})
    core.submit(chain_descriptor(2), {"CONTAINER_MEMORY_MB": "200"})  # no Spark: no heap


def test_a_buffer_server_leaving_its_container_no_room_is_refused_at_submit():
    core = MasterCore(RecordingLauncher(), clock=ManualClock())
    with pytest.raises(InvalidArgument, match=r"BUFFER_MEMORY_MB=600 is more than half of "
                                              r"CONTAINER_MEMORY_MB=1000"):
        core.submit(chain_descriptor(2), {"CONTAINER_MEMORY_MB": "1000",
                                          "BUFFER_MEMORY_MB": "600"})
    spark = chain_descriptor(2)
    spark.operators[0].uses_spark = True
    with pytest.raises(InvalidArgument, match=r"cannot hold Spark's driver \(1,408 MB\) and the "
                                              r"buffer server's BUFFER_MEMORY_MB=512"):
        core.submit(spark, {"CONTAINER_MEMORY_MB": "1800", "BUFFER_MEMORY_MB": "512"})
    core.submit(spark, {"CONTAINER_MEMORY_MB": "1920", "BUFFER_MEMORY_MB": "512"})
    core.submit(chain_descriptor(2), {"BUFFER_MEMORY_MB": "4096"})  # no limit: nothing to fit


def _sleeper(tmp_path, allocate_mb: int = 0):
    """A command standing in for `python -m weir.container`: allocates (and touches)
    ``allocate_mb``, starts a child that holds as much, then waits to be stopped."""
    script = tmp_path / "sleeper.py"
    script.write_text(
        "import subprocess, sys, time\n"
        f"grab = 'x = bytearray({allocate_mb} << 20); x[::4096] = b\"1\" * len(x[::4096])'\n"
        "exec(grab)\n"
        "child = subprocess.Popen([sys.executable, '-c', grab + '\\nimport time; "
        "time.sleep(60)'])\n"
        "time.sleep(60)\n")
    return [sys.executable, str(script)]


@pytest.mark.slow
def test_the_local_launcher_kills_a_container_over_its_memory_and_says_why(tmp_path):
    launcher = LocalProcessLauncher("127.0.0.1:1", command=_sleeper(tmp_path, 60))
    told: queue.Queue[str] = queue.Queue()
    launcher.on_exit = told.put
    try:
        launcher.launch("app-0001-c0", Resources(memory_mb=100))  # 2 x 60 MB + Python
        launcher.launch("app-0001-c1", Resources(memory_mb=1000))
        assert told.get(timeout=20) == "app-0001-c0"
        assert launcher.exit_code("app-0001-c0") == -9
        reason = launcher.exit_reason("app-0001-c0")
        assert "killed by the local launcher" in reason
        assert "over its CONTAINER_MEMORY_MB=100" in reason
        used = int(reason.split("used ")[1].split(" MB")[0].replace(",", ""))
        assert used > 100
        time.sleep(2 * MEMORY_POLL_S)  # the guard has looked at c1 since
        assert launcher.exit_code("app-0001-c1") is None
        assert launcher.exit_reason("app-0001-c1") == ""
    finally:
        launcher.stop_all(grace_s=1.0)


def test_memory_guard_sums_the_whole_process_tree(tmp_path):
    child = subprocess.Popen(_sleeper(tmp_path, 50), start_new_session=True)
    over: list[tuple[str, str]] = []
    guard = MemoryGuard(lambda cid, why: over.append((cid, why)))
    try:
        poll_for(lambda: tree_memory_bytes(child.pid) > 100 << 20, 20, "both processes' memory")
        parent = psutil.Process(child.pid).memory_info()
        assert parent.rss - parent.shared < 100 << 20  # not the parent alone
        guard.watch("c0", child.pid, 100)
        guard.check()
        assert [cid for cid, _ in over] == ["c0"]
        guard.check()  # told once, then forgotten
        assert len(over) == 1
    finally:
        guard.stop()
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=10)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="pinning needs Linux and two cores")
def test_the_local_launcher_pins_a_container_to_its_cores_in_turn(tmp_path):
    launcher = LocalProcessLauncher("127.0.0.1:1", command=_sleeper(tmp_path))
    try:
        launcher.launch("app-0001-c0", Resources(cores=1))
        launcher.launch("app-0001-c1", Resources(cores=0.5))  # rounded up to one core
        launcher.launch("app-0001-c2")  # no request: not pinned
        first = os.sched_getaffinity(launcher.pid("app-0001-c0"))
        second = os.sched_getaffinity(launcher.pid("app-0001-c1"))
        assert len(first) == len(second) == 1 and first != second
        assert os.sched_getaffinity(launcher.pid("app-0001-c2")) == os.sched_getaffinity(0)
    finally:
        launcher.stop_all(grace_s=1.0)


def test_core_sets_rotate_and_round_up():
    cores = CoreSets([0, 1, 2])
    assert cores.take(2) == {0, 1}
    assert cores.take(0.5) == {2}
    assert cores.take(8) == {0, 1, 2}


def test_a_launcher_that_cannot_follow_its_containers_says_so_on_each_until_it_can():
    clock = ManualClock()
    app = make_app(clock)
    trouble = "watching pods in namespace weir fails since 12:00:00: ApiException: (403)"
    check_liveness(app, clock(), {}, 60_000, {}, {}, trouble=trouble)
    live = [c for c in app.plan.containers.values() if c.state != ContainerState.KILLED]
    assert live and all(c.diagnostics == f"its launcher cannot follow it: {trouble}"
                        for c in live)
    check_liveness(app, clock(), {}, 60_000, {}, {})
    assert all(c.diagnostics == "" for c in live)


def test_the_launchers_trouble_names_the_watch_the_error_and_since_when():
    launcher = RecordingLauncher()
    assert launcher.trouble() == ""
    launcher._watch_failed("watching Ray actors", ConnectionError("no\n  route"))
    first = launcher.trouble()
    assert first.startswith("watching Ray actors fails since ")
    assert first.endswith(": ConnectionError: no route")
    launcher._watch_failed("watching Ray actors", TimeoutError("again"))
    assert launcher.trouble().split(": ")[0] == first.split(": ")[0]  # the first failure's
    launcher._watch_ok()
    assert launcher.trouble() == ""


def test_a_failure_to_act_on_a_limit_is_tried_again_and_never_blinds_the_guard(tmp_path):
    child = subprocess.Popen(_sleeper(tmp_path, 50), start_new_session=True)
    calls: list[str] = []

    def over_limit(cid: str, why: str) -> None:
        calls.append(cid)
        if len(calls) == 1:
            raise OSError("the kill failed")

    guard = MemoryGuard(over_limit)
    try:
        poll_for(lambda: tree_memory_bytes(child.pid) > 100 << 20, 20, "the memory")
        guard.watch("c0", child.pid, 100)
        guard.check()  # raises inside: logged, the container watched again
        guard.check()
        assert calls == ["c0", "c0"]
    finally:
        guard.stop()
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=10)


def test_a_spark_application_is_refused_at_submit_when_its_containers_have_no_java(tmp_path):
    """The containers run here, with the launcher's environment: no Java there is one
    sentence at submit, before any container starts (a retry would not install it)."""
    from weir.operators import Dag
    from weir.operators.library import EventGenerator, WindowedCount
    from weir.operators.testing import CollectSink

    dag = Dag("spark", CONTAINERS=1)
    source = dag.add_operator("source", EventGenerator(rate_per_second=10, keys=2, total=10))
    count = dag.add_operator("count", WindowedCount(key="key", value="value"))
    sink = dag.add_operator("sink", CollectSink())
    dag.add_stream("events", source.output, count.input)
    dag.add_stream("counts", count.output, sink.input)
    launcher = LocalProcessLauncher("127.0.0.1:1", env={"JAVA_HOME": str(tmp_path / "none")})
    core = MasterCore(launcher, clock=ManualClock())
    with pytest.raises(InvalidArgument, match=r"Spark needs Java, and JAVA_HOME=.* has no "
                                              r"bin/java; install Java 17 or newer"):
        core.submit(dag.to_descriptor(), {})
    assert core.list_applications() == []
    launcher.check_request(Resources())  # the rest of the request fits: only Java is refused

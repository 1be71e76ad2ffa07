"""Launchers tell the master the moment a container process ends (``Launcher.on_exit``).

The master's liveness pass used to find a SIGKILLed container only when it next polled
the launcher's exit codes; with the exit told at once, recovery starts at once.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import time

import pytest

from tests.master.test_launcher import FAKE_CONTAINER, _grandchild
from weir.master.launcher import RecordingLauncher, ThreadLauncher
from weir.master.local_launcher import LocalProcessLauncher

pytestmark = pytest.mark.timeout(60)

_HANG_GUARD_S = 20.0
"""Only against a hang: the exit is told when it happens, nothing here waits for a poll."""


@pytest.fixture
def launcher(tmp_path):
    made = LocalProcessLauncher("127.0.0.1:1234", log_dir=tmp_path / "logs",
                                command=[sys.executable, "-c", FAKE_CONTAINER])
    yield made
    made.stop_all(grace_s=1.0)


def _listen(launcher) -> queue.Queue[str]:
    told: queue.Queue[str] = queue.Queue()
    launcher.on_exit = told.put
    return told


def test_a_sigkilled_container_is_told_without_anyone_polling_its_exit_code(launcher):
    told = _listen(launcher)
    launcher.launch("c0")
    _grandchild(launcher, "c0")  # it runs
    assert told.empty()
    os.kill(launcher.pid("c0"), signal.SIGKILL)  # as the recovery bench does
    assert told.get(timeout=_HANG_GUARD_S) == "c0"
    assert launcher.exit_code("c0") == -signal.SIGKILL  # Popen still reaps it, code intact


def test_an_ended_containers_code_is_read_while_another_thread_reaps_it(launcher):
    # The memory guard's kill reaps the process (Popen.wait) as on_exit is told; Popen's
    # poll says None while that wait holds its lock, so the code once read as "running"
    told = _listen(launcher)
    launcher.launch("c0")
    _grandchild(launcher, "c0")
    popen = launcher._children["c0"].popen
    with popen._waitpid_lock:  # what a reaping thread holds, for a moment
        os.kill(launcher.pid("c0"), signal.SIGKILL)
        assert told.get(timeout=_HANG_GUARD_S) == "c0"
        codes: list[int | None] = []
        reader = threading.Thread(target=lambda: codes.append(launcher.exit_code("c0")))
        reader.start()
        time.sleep(0.2)  # the reader waits for the lock, as for the reaping thread
    reader.join(timeout=_HANG_GUARD_S)
    assert codes == [-signal.SIGKILL]


def test_a_container_that_exits_on_its_own_is_told_once_with_its_code(tmp_path):
    launcher = LocalProcessLauncher("127.0.0.1:1234", log_dir=tmp_path / "logs",
                                    command=[sys.executable, "-c", FAKE_CONTAINER],
                                    env={"FAKE_MODE": "exit3"})
    told = _listen(launcher)
    try:
        launcher.launch("c0")
        assert told.get(timeout=_HANG_GUARD_S) == "c0"
        assert launcher.exit_code("c0") == 3
        launcher.stop_all(grace_s=1.0)
        assert told.empty()
    finally:
        launcher.stop_all(grace_s=1.0)


def test_a_failing_listener_does_not_stop_the_launcher(launcher):
    calls: list[str] = []
    done = threading.Event()

    def listener(container_id: str) -> None:
        calls.append(container_id)
        done.set()
        raise RuntimeError("a listener's bug")

    launcher.on_exit = listener
    launcher.launch("c0")
    _grandchild(launcher, "c0")
    launcher.kill("c0")
    assert done.wait(_HANG_GUARD_S) and calls == ["c0"]
    assert launcher.exit_code("c0") == -signal.SIGKILL


def test_no_listener_is_fine(launcher):
    launcher.launch("c0")
    _grandchild(launcher, "c0")
    launcher.kill("c0")
    assert launcher.exit_code("c0") == -signal.SIGKILL


def test_the_thread_and_recording_launchers_tell_exits_too():
    def container(address: str, cid: str, stop: threading.Event) -> int:
        return 7

    threads = ThreadLauncher("127.0.0.1:9", container)
    told = _listen(threads)
    threads.launch("t0")
    assert told.get(timeout=_HANG_GUARD_S) == "t0" and threads.exit_code("t0") == 7

    recording = RecordingLauncher()
    told = _listen(recording)
    recording.set_exit_code("r0", -signal.SIGKILL)
    assert told.get_nowait() == "r0"


@contextlib.contextmanager
def _core_with_an_hour_tick(containers: int):
    """A master core whose loop ticks once an hour (only a wake-up runs it), an
    application of three operators on ``containers`` containers, their first heartbeats
    given: yields (launcher, core, app, container ids)."""
    from tests.master.fakes import chain_descriptor, container_heartbeat
    from weir.master.core import MasterCore

    launcher = RecordingLauncher("127.0.0.1:1")
    core = MasterCore(launcher, loop_interval_s=3_600.0)
    core.start()
    try:
        app = core.application(core.submit(chain_descriptor(3, CONTAINERS=containers), {}))
        with core.lock:
            ids = sorted(app.plan.containers)
        for index, cid in enumerate(ids):
            core.heartbeat(container_heartbeat(cid, port=7000 + index))
        yield launcher, core, app, ids
    finally:
        core.stop()


def _wait_killed(core, app, cid: str) -> None:
    """Until the loop gave container ``cid`` up (bounded by the hang guard)."""
    from weir.master.physical_plan import ContainerState

    deadline = time.monotonic() + _HANG_GUARD_S
    while time.monotonic() < deadline:
        with core.lock:
            if app.plan.containers[cid].state == ContainerState.KILLED:
                return
        time.sleep(0.01)


def test_the_master_recovers_a_container_the_moment_its_process_ends():
    """The master's loop wakes on the exit: with its tick an hour away, the container is
    still given up on (KILLED) and replaced at once."""
    from weir.master.physical_plan import ContainerState

    with _core_with_an_hour_tick(containers=2) as (launcher, core, app, ids):
        launcher.set_exit_code(ids[0], -signal.SIGKILL)
        _wait_killed(core, app, ids[0])
        with core.lock:
            assert app.plan.containers[ids[0]].state == ContainerState.KILLED
            assert "exited with code -9" in app.plan.containers[ids[0]].diagnostics
            assert len(app.plan.containers) == 3  # its replacement


def test_the_master_gives_up_a_container_whose_heartbeat_reports_a_failed_operator_at_once():
    """The heartbeat only records the loss (and answers ABORT); the loop it wakes, with
    its tick an hour away, gives the container up and replaces it."""
    from tests.master.fakes import container_heartbeat, operator_report
    from weir.master.physical_plan import ContainerState
    from weir.proto import umbilical_pb2

    with _core_with_an_hour_tick(containers=1) as (_, core, app, [cid]):
        failed = operator_report(2, umbilical_pb2.OPERATOR_STATE_FAILED, error="ValueError: x")
        answer = core.heartbeat(container_heartbeat(cid, port=7000, operators=[failed]))
        assert answer.shutdown == umbilical_pb2.SHUTDOWN_TYPE_ABORT
        _wait_killed(core, app, cid)
        with core.lock:
            assert app.plan.containers[cid].state == ContainerState.KILLED
            assert "ValueError: x" in app.plan.containers[cid].diagnostics
            assert len(app.plan.containers) == 2  # its replacement

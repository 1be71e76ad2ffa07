"""The local process launcher (with a stand-in container program), the registry and fakes."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from tests.harness import poll_for
from weir.master.container_processes import is_container_process
from weir.master.launcher import RecordingLauncher, ThreadLauncher, launcher_factory
from weir.master.local_launcher import LocalProcessLauncher
from weir.proto.contract import CONTAINER_ID_ENV

pytestmark = pytest.mark.timeout(60)

# Stands in for `python -m weir.container`: shows its arguments, starts a grandchild, waits.
FAKE_CONTAINER = """
import faulthandler, os, signal, subprocess, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)  # as the container does
mode = os.environ.get("FAKE_MODE", "sleep")
print("ARGV", " ".join(sys.argv[1:]), flush=True)
print("CID", os.environ.get("WEIR_CONTAINER_ID"), flush=True)
if mode == "exit3":
    sys.exit(3)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print("GRANDCHILD", child.pid, flush=True)
time.sleep(120)
"""


@pytest.fixture
def make_launcher(tmp_path):
    launchers: list[LocalProcessLauncher] = []

    def make(mode: str = "sleep") -> LocalProcessLauncher:
        launcher = LocalProcessLauncher("127.0.0.1:1234", log_dir=tmp_path / "logs",
                                        command=[sys.executable, "-c", FAKE_CONTAINER],
                                        env={"FAKE_MODE": mode})
        launchers.append(launcher)
        return launcher

    yield make
    for launcher in launchers:
        launcher.stop_all(grace_s=1.0)


def _log(launcher: LocalProcessLauncher, cid: str) -> str:
    path = Path(launcher.log_dir) / f"{cid}.log"
    return path.read_text() if path.exists() else ""


def _grandchild(launcher: LocalProcessLauncher, cid: str) -> int:
    found = poll_for(lambda: re.search(r"GRANDCHILD (\d+)", _log(launcher, cid)), 10,
                     f"{cid} to start its grandchild")
    return int(found.group(1))


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_launch_passes_master_id_and_environment(make_launcher):
    launcher = make_launcher()
    launcher.launch("app-0001-c0")
    _grandchild(launcher, "app-0001-c0")
    log = _log(launcher, "app-0001-c0")
    assert "ARGV --master 127.0.0.1:1234 --id app-0001-c0" in log
    assert "CID app-0001-c0" in log
    assert launcher.exit_code("app-0001-c0") is None
    assert launcher.argv("x")[-4:] == ["--master", "127.0.0.1:1234", "--id", "x"]
    assert CONTAINER_ID_ENV == "WEIR_CONTAINER_ID"


def test_container_logs_are_readable_by_their_owner_only(make_launcher, tmp_path):
    launcher = make_launcher()
    launcher.launch("app-0001-c0")
    _grandchild(launcher, "app-0001-c0")
    assert stat.S_IMODE((tmp_path / "logs" / "app-0001-c0.log").stat().st_mode) == 0o600


def test_kill_takes_the_whole_process_group(make_launcher):
    launcher = make_launcher()
    launcher.launch("c0")
    grandchild = _grandchild(launcher, "c0")
    launcher.kill("c0")
    assert launcher.exit_code("c0") == -signal.SIGKILL
    poll_for(lambda: _gone(grandchild), 5, "the grandchild to die with its container")
    launcher.kill("c0")  # again: nothing left, no error
    launcher.kill("unknown")


def test_a_kill_asked_to_dump_threads_leaves_them_in_the_log(make_launcher):
    """A container the master gives up on (blocked, silent) says in its log where each of
    its threads stood when it was killed; any other kill leaves the log as it was."""
    launcher = make_launcher()
    for cid in ("c0", "c1"):
        launcher.launch(cid)
        _grandchild(launcher, cid)
    launcher.kill("c0", dump_threads=True)
    launcher.kill("c1")
    for cid in ("c0", "c1"):
        assert launcher.exit_code(cid) == -signal.SIGKILL  # killed, not ended by a dump
    log = _log(launcher, "c0")
    assert "Current thread" in log and 'File "<string>", line 13' in log, log
    assert "Current thread" not in _log(launcher, "c1")


def test_exit_code_of_a_container_that_ended(make_launcher):
    launcher = make_launcher("exit3")
    launcher.launch("c0")
    assert poll_for(lambda: launcher.exit_code("c0") is not None, 10, "c0 to exit")
    assert launcher.exit_code("c0") == 3
    assert launcher.exit_code("never-launched") is None


def test_stop_all_terminates_then_kills_and_leaves_nothing(make_launcher):
    polite, stubborn = make_launcher(), make_launcher("stubborn")
    polite.launch("p0")
    stubborn.launch("s0")
    pids = [_grandchild(polite, "p0"), _grandchild(stubborn, "s0")]
    polite.stop_all(grace_s=2.0)
    assert polite.exit_code("p0") == -signal.SIGTERM
    stubborn.stop_all(grace_s=0.5)
    assert stubborn.exit_code("s0") == -signal.SIGKILL
    for pid in pids:
        poll_for(lambda pid=pid: _gone(pid), 5, f"process {pid} to be gone")


def test_registry_and_recording_launcher():
    with pytest.raises(ValueError, match="unknown launcher 'nope'"):
        launcher_factory("nope")
    launcher = launcher_factory("recording")("127.0.0.1:9")
    assert isinstance(launcher, RecordingLauncher)
    launcher.launch("c0")
    assert launcher.launched == ["c0"] and launcher.exit_code("c0") is None
    launcher.kill("c0")
    assert launcher.killed == ["c0"] and launcher.exit_code("c0") == -signal.SIGKILL


def test_thread_launcher_runs_the_given_entry_point():
    seen = []

    def container(address: str, cid: str, stop: threading.Event) -> int:
        seen.append((address, cid))
        stop.wait(10)
        return 0

    launcher = ThreadLauncher("127.0.0.1:9", container)
    launcher.launch("c0")
    poll_for(lambda: seen, 5, "the container thread to start")
    assert launcher.exit_code("c0") is None
    launcher.stop_all(grace_s=5)
    assert seen == [("127.0.0.1:9", "c0")] and launcher.exit_code("c0") == 0


def _sleeper(**env: str) -> subprocess.Popen:
    """A process that sleeps, returned once it runs (exec'd, with ``env`` as its own: just
    after the fork, /proc still shows the parent's environment)."""
    process = subprocess.Popen([sys.executable, "-c",
                                "import time; print('ready', flush=True); time.sleep(60)"],
                               env={**os.environ, **env}, start_new_session=True,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


def test_a_restarted_master_finds_a_container_whose_process_is_gone_lost_at_once():
    """Issue 36: it used to wait out the heartbeat timeout (14.6 s) for a container whose
    process had already exited while the master was down."""
    dead = _sleeper(**{CONTAINER_ID_ENV: "app-0001-c0"})
    dead.kill()
    dead.wait(10)
    launcher = LocalProcessLauncher("127.0.0.1:1234")
    launcher.adopt("app-0001-c0", dead.pid, "")
    assert launcher.exit_code("app-0001-c0") == -1
    launcher.adopt("app-0001-c1", 4_000_000, "elsewhere")  # another host's: not judged here
    assert launcher.exit_code("app-0001-c1") is None


def test_a_restarted_master_adopts_only_processes_proven_to_be_its_containers():
    """A heartbeat names the pid; only a process carrying that container's id is adopted,
    so no other process (nor init, nor the master's own group) is ever signalled."""
    stranger = _sleeper()
    ours = _sleeper(**{CONTAINER_ID_ENV: "app-0001-c1"})
    launcher = LocalProcessLauncher("127.0.0.1:1234")
    try:
        launcher.adopt("app-0001-c0", stranger.pid, "")
        launcher.adopt("app-0001-c2", 1, "")
        launcher.adopt("app-0001-c3", os.getpid(), "")
        launcher.adopt("app-0001-c1", ours.pid, "")
        assert "is not container app-0001-c0" in is_container_process(stranger.pid,
                                                                       "app-0001-c0")
        for cid in ("app-0001-c0", "app-0001-c2", "app-0001-c3"):
            launcher.kill(cid)
            # not its container: that one is proven gone (lost at once), never signalled
            assert launcher.exit_code(cid) == -1
        launcher.kill("app-0001-c1")
        poll_for(lambda: _gone(ours.pid), 10, "the adopted container to be killed")
        launcher.stop_all(grace_s=1)
        assert stranger.poll() is None, "an unrelated process was killed"
    finally:
        for process in (stranger, ours):
            process.kill()
            process.wait(10)

"""Fencing end to end: a container frozen past its heartbeat timeout is replaced; when it
wakes it writes nothing into the state its replacement uses, and leaves nothing behind.

The containers stand for containers on other hosts: the master cannot signal them (its
launcher's ``kill`` does nothing), so the frozen one really wakes up, as a paused VM or a
healed network partition would. While it wakes, its replacement is frozen in turn (well
within the timeout), so any file that changes in the replacement's folders in that time
was written by the old deployment.
"""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import container_logs, started_master
from tests.e2e.test_exactly_once import assert_exactly_once, write_input
from tests.e2e.test_recovery import wait_finished
from tests.harness import poll_for
from weir.master.client import WeirClient
from weir.master.local_launcher import LocalProcessLauncher
from weir.operators.app import load_app

APP = """
    from weir.operators import Dag
    from weir.operators.library import DirectorySource, FileSink, Tokenize, WindowedCount

    dag = Dag("fencing", CONTAINERS=2, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, HEARTBEAT_TIMEOUT_MILLIS=4000,
              CHECKPOINT_WINDOW_COUNT=2, STATE_DIR={state!r}, SPARK_MASTER="local[1]",
              SPARK_SHUFFLE_PARTITIONS=1, SPARK_WARMUP_ROWS=0, MAX_RESTARTS=8)
    source = dag.add_operator("source", DirectorySource({inbox!r}, delete_consumed=True,
                                                        bytes_per_window=1500), CONTAINER=0)
    tokenize = dag.add_operator("tokenize", Tokenize(), CONTAINER=0)
    count = dag.add_operator("count", WindowedCount(key="word"), CONTAINER=1,
                             APPLICATION_WINDOW_COUNT=2)
    sink = dag.add_operator("sink", FileSink({out!r}, exactly_once=True), CONTAINER=1)
    dag.add_stream("lines", source.output, tokenize.input)
    dag.add_stream("words", tokenize.output, count.input)
    dag.add_stream("counts", count.output, sink.input)
"""


class RemoteLikeLauncher(LocalProcessLauncher):
    """Launches containers here but, like for containers on other hosts, cannot kill one."""

    def kill(self, container_id: str, dump_threads: bool = False) -> None:
        pass


@pytest.fixture
def master(tmp_path):
    with started_master(tmp_path, launcher=RemoteLikeLauncher) as server:
        yield server


def snapshot(folders: list[Path]) -> dict[str, tuple[int, int]]:
    """Every file under ``folders``: (modification time, size)."""
    files = {}
    for folder in folders:
        for path in folder.rglob("*"):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            if path.is_file():
                files[str(path)] = (stat.st_mtime_ns, stat.st_size)
    return files


def test_a_container_frozen_past_its_timeout_writes_nothing_when_it_wakes(master, tmp_path):
    expected = write_input(tmp_path / "inbox", files=10)
    state, out = tmp_path / "state", tmp_path / "out"
    app = tmp_path / "fencing_app.py"
    app.write_text(textwrap.dedent(APP.format(state=str(state), inbox=str(tmp_path / "inbox"),
                                              out=str(out))))
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())

        def container_of(name: str):
            op = next(o for o in client.operators(app_id) if o.name == name)
            return next(c for c in client.containers(app_id) if c.id == op.container_id)

        poll_for(lambda: client.application(app_id).committed_window_id >= 0, 90,
                 f"a first committed window\n{container_logs(master)}")
        old = container_of("count")
        zombie = int(old.process_name.split("@")[0])
        os.kill(zombie, signal.SIGSTOP)
        frozen_at = client.application(app_id).committed_window_id
        poll_for(lambda: container_of("count").id != old.id
                 and container_of("count").state == "ACTIVE", 60,
                 f"a replacement of the frozen container\n{container_logs(master)}")
        poll_for(lambda: client.application(app_id).committed_window_id > frozen_at + 4, 120,
                 f"the replacement to commit windows\n{container_logs(master)}")
        ops = {o.name: o for o in client.operators(app_id)}
        folders = [out, *(state / kind / str(ops[name].id)
                          for kind in ("checkpoints", "operators") for name in ("count",
                                                                               "sink"))]
        replacement = int(container_of("count").process_name.split("@")[0])

        os.kill(replacement, signal.SIGSTOP)  # from now on only the old deployment could write
        try:  # a signal is delivered asynchronously: snapshot once it has taken effect
            poll_for(lambda: psutil.Process(replacement).status() == psutil.STATUS_STOPPED,
                     10, "the replacement to stop", 0.01)
            before = snapshot(folders)
            os.kill(zombie, signal.SIGCONT)
            time.sleep(1.5)
            after = snapshot(folders)
        finally:
            os.kill(replacement, signal.SIGCONT)
        changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
        assert not changed, f"the replaced deployment wrote {changed}\n{container_logs(master)}"
        poll_for(lambda: not psutil.pid_exists(zombie)
                 or psutil.Process(zombie).status() == psutil.STATUS_ZOMBIE, 30,
                 f"the woken container to exit\n{container_logs(master)}")
        wait_finished(client, master, app_id, timeout_s=240)
    assert_exactly_once(tmp_path, expected, "a container frozen and woken")
    leftovers = [str(p) for p in [*state.rglob("*.tmp"), *out.rglob("*.tmp")]]
    assert not leftovers, f"temporary files left behind: {leftovers}"

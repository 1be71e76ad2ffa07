"""The master killed with SIGKILL mid-run and started again on its state folder: the running
containers find it, nothing is redeployed, and the output is exactly the reference."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.e2e.test_exactly_once import write_input
from tests.e2e.wordcount import published_counts
from tests.harness import TAG_ENV, WeirProcess, poll_for, tagged_env, tagged_processes
from weir.master.client import WeirClient
from weir.operators.app import load_app
from weir.proto.contract import CONTAINER_ID_ENV

COUNT_WORDS = """
    import collections
    import pyarrow as pa
    from weir.operators import Dag, Operator, InputPort, OutputPort
    from weir.operators.library import DirectorySource, FileSink

    class CountWords(Operator):
        '''Words per window, in plain Python (no Spark: the tests are about deployments).'''
        input = InputPort()
        output = OutputPort()

        def begin_window(self, window_id):
            self.window = window_id
            self.counts = collections.Counter()

        def process(self, port, batch):
            for line in batch.column("line").to_pylist():
                self.counts.update(line.split())

        def end_window(self):
            if self.counts:
                words = sorted(self.counts)
                self.output.emit(pa.record_batch({{
                    "word": words, "count": [self.counts[w] for w in words]}}))
"""
"""An application file's head: a plain-Python word count operator (for ``str.format``)."""

APP = COUNT_WORDS + """
    dag = Dag("restart", CONTAINERS=2, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, HEARTBEAT_TIMEOUT_MILLIS={timeout_ms},
              TIMEOUT_WINDOW_COUNT={timeout_ms} // 200,
              CHECKPOINT_WINDOW_COUNT=4, STATE_DIR={state!r})
    source = dag.add_operator("source", DirectorySource({inbox!r}, delete_consumed=True,
                                                        bytes_per_window=1500), CONTAINER=0)
    count = dag.add_operator("count", CountWords(), CONTAINER=0)
    sink = dag.add_operator("sink", FileSink({out!r}, exactly_once=True), CONTAINER=1)
    dag.add_stream("lines", source.output, count.input)
    dag.add_stream("counts", count.output, sink.input)
"""


class Master:
    """``weir master --state-dir`` as a process of its own (it is SIGKILLed, not stopped)."""

    def __init__(self, tmp_path: Path, env: dict[str, str], name: str) -> None:
        self.process = WeirProcess(
            ["master", "--port", "0", "--json", "--state-dir", str(tmp_path / "master-state"),
             "--log-dir", str(tmp_path / "containers")], env, tmp_path, tmp_path / f"{name}.log")
        self.address = poll_for(self._address, 60, f"{name} to start")

    def _address(self) -> str | None:
        lines = self.process.output().splitlines()
        if "{" in lines and "}" in lines[lines.index("{"):]:
            start = lines.index("{")
            block = lines[start:lines.index("}", start) + 1]
            return json.loads("\n".join(block))["address"]
        if self.process.proc.poll() is not None:
            raise AssertionError(f"the master exited:\n{self.process.output()}")
        return None


@pytest.fixture
def env(tmp_path):
    environment, tag = tagged_env(WEIR_HOME=str(tmp_path / "home"))
    yield environment
    poll_for(lambda: not tagged_processes(tag), 20, "every container to exit", 0.2)


def _write_app(tmp_path: Path, timeout_ms: int = 10_000) -> Path:
    app = tmp_path / "restart_app.py"
    app.write_text(textwrap.dedent(APP.format(state=str(tmp_path / "state"),
                                              inbox=str(tmp_path / "inbox"),
                                              out=str(tmp_path / "out"), timeout_ms=timeout_ms)))
    return app


def _stop(*masters: Master | None) -> None:
    for master in masters:
        if master is not None and master.process.proc.poll() is None:
            master.process.proc.send_signal(signal.SIGTERM)  # stops its containers too
            master.process.wait(30)


def _container_process(env: dict[str, str], container_id: str) -> psutil.Process:
    """The live process of ``container_id`` among this test's processes."""
    def find() -> psutil.Process | None:
        for process in tagged_processes(env[TAG_ENV]):
            with contextlib.suppress(psutil.Error):
                if process.environ().get(CONTAINER_ID_ENV) == container_id:
                    return process
        return None
    return poll_for(find, 30, f"the process of {container_id}")


def test_master_killed_mid_run_takes_its_application_back(tmp_path, env):
    expected: collections.Counter[str] = write_input(tmp_path / "inbox")
    app = _write_app(tmp_path)
    first = Master(tmp_path, env, "master-1")
    secret = (tmp_path / "master-state" / "secret").read_text().strip()
    second = None
    try:
        cert = tmp_path / "master-state" / "tls" / "cert.pem"  # kept: the same after restart
        with WeirClient(first.address, secret=secret, tls_ca=cert) as client:
            app_id = client.submit(load_app(app).to_descriptor())
            poll_for(lambda: client.application(app_id).committed_window_id >= 0, 60,
                     f"a first committed window\n{first.process.output()}")
            before = {o.name: o for o in client.operators(app_id)}
            containers_before = {c.id for c in client.containers(app_id)}
        os.kill(first.process.proc.pid, signal.SIGKILL)
        first.process.wait(10)

        second = Master(tmp_path, env, "master-2")  # another port: containers re-read it
        with WeirClient(second.address, secret=secret, tls_ca=cert) as client:
            assert client.application(app_id).state == "RUNNING"
            info = poll_for(lambda: (i := client.application(app_id)).state not in (
                "ACCEPTED", "RUNNING") and i, 180, f"{app_id} to end\n{second.process.output()}")
            assert info.state == "FINISHED", f"{info.diagnostics}\n{second.process.output()}"
            after = {o.name: o for o in client.operators(app_id)}
            containers_after = {c.id for c in client.containers(app_id)}
    finally:
        _stop(second, first)

    counted, rows = published_counts(tmp_path / "out")
    assert counted == expected, f"{rows} rows published"
    assert containers_after == containers_before, "no container was replaced"
    for name, op in after.items():
        assert op.failure_count == 0 and op.deploy_window_id == before[name].deploy_window_id, (
            f"{name} was redeployed after the master restarted")
    assert os.listdir(tmp_path / "inbox") == []


def test_a_container_that_died_with_the_master_is_replaced_at_once(tmp_path, env):
    """Issue 36: a restarted master waited out the heartbeat timeout (here 10 minutes, and
    as long for a blocked window) for a container whose process had exited while it was
    down; a process proven gone is lost at once, replaced, and the output is still exactly
    the reference."""
    expected: collections.Counter[str] = write_input(tmp_path / "inbox")
    app = _write_app(tmp_path, timeout_ms=600_000)
    first = Master(tmp_path, env, "master-1")
    secret = (tmp_path / "master-state" / "secret").read_text().strip()
    cert = tmp_path / "master-state" / "tls" / "cert.pem"
    second = None
    try:
        with WeirClient(first.address, secret=secret, tls_ca=cert) as client:
            app_id = client.submit(load_app(app).to_descriptor())
            poll_for(lambda: client.application(app_id).committed_window_id >= 0, 60,
                     f"a first committed window\n{first.process.output()}")
            before = {c.id for c in client.containers(app_id)}
        sink_container = f"{app_id}-c1"
        doomed = _container_process(env, sink_container)
        os.kill(first.process.proc.pid, signal.SIGKILL)
        first.process.wait(10)
        doomed.kill()
        psutil.wait_procs([doomed], timeout=10)

        second = Master(tmp_path, env, "master-2")
        with WeirClient(second.address, secret=secret, tls_ca=cert) as client:
            # far inside the 10-minute heartbeat timeout: only a proven-gone process does it
            poll_for(lambda: {c.id for c in client.containers(app_id)} - before, 120,
                     f"a replacement of {sink_container}\n{second.process.output()}")
            info = poll_for(lambda: (i := client.application(app_id)).state not in (
                "ACCEPTED", "RUNNING") and i, 180, f"{app_id} to end\n{second.process.output()}")
            assert info.state == "FINISHED", f"{info.diagnostics}\n{second.process.output()}"
    finally:
        _stop(second, first)
    counted, rows = published_counts(tmp_path / "out")
    assert counted == expected, f"{rows} rows published"

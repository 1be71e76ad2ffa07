"""The dispatcher (``weir master --application-masters``) with real processes: each
application gets a master process of its own, which runs its containers; an application
master killed with SIGKILL is started again and takes its containers back while the
other application keeps moving; an ended application's master is stopped and its
information kept; one application's secret opens neither the dispatcher nor another
application's master."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.harness import TAG_ENV, WeirProcess, poll_for, tagged_env, tagged_processes
from tests.master.fakes import Endless, Relay
from weir.master.client import WeirClient, WeirClientError
from weir.master.dispatcher_server import DispatcherServer
from weir.operators import Dag
from weir.operators.testing import CollectSink, ListSource

pytestmark = pytest.mark.timeout(240)

FAST = {"STREAMING_WINDOW_SIZE_MILLIS": 100, "HEARTBEAT_INTERVAL_MILLIS": 100,
        "CHECKPOINT_WINDOW_COUNT": 2}


@contextlib.contextmanager
def started_dispatcher(tmp_path: Path) -> Iterator[DispatcherServer]:
    """A dispatcher whose application masters and containers carry a test tag; none of
    them is left after it stopped."""
    env, tag = tagged_env()
    tagged = {TAG_ENV: tag, "PYSPARK_PYTHON": env["PYSPARK_PYTHON"]}
    server = DispatcherServer(tmp_path / "dispatcher", launcher="local",
                              launcher_options={"log_dir": str(tmp_path / "containers"),
                                                "env": tagged},
                              env=tagged, publish_secret=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        poll_for(lambda: not tagged_processes(tag), 30,
                 "every application master and container to exit")


def client(server: DispatcherServer, secret: str | None = None) -> WeirClient:
    return WeirClient(server.address, secret=secret or server.secret,
                      tls_ca=server.tls.trusted, timeout_s=60)


def endless(name: str) -> Dag:
    """A source that never ends (no rows): its windows and checkpoints go on."""
    dag = Dag(name, CONTAINERS=1, **FAST)
    source = dag.add_operator("source", Endless())
    relay = dag.add_operator("relay", Relay())
    dag.add_stream("s", source.output, relay.input)
    return dag


def finite(name: str) -> Dag:
    dag = Dag(name, CONTAINERS=1, **FAST)
    source = dag.add_operator("source", ListSource([[{"x": i}] for i in range(5)]))
    sink = dag.add_operator("sink", CollectSink())
    dag.add_stream("s", source.output, sink.input)
    return dag


def committed(weir: WeirClient, app_id: str) -> int:
    return weir.application(app_id).committed_window_id


def test_each_application_runs_in_a_master_of_its_own_that_a_sigkill_does_not_end(tmp_path):
    with started_dispatcher(tmp_path) as server:
        weir = client(server)
        first = weir.submit(endless("first").to_descriptor(), {})
        second = weir.submit(endless("second").to_descriptor(), {})
        assert first != second
        pids = server.dispatcher.pids()
        assert len({pids[first], pids[second], os.getpid()}) == 3
        assert {a.id for a in weir.applications()} == {first, second}
        for app_id in (first, second):
            poll_for(lambda a=app_id: committed(weir, a) >= 2, 90, f"{app_id} to commit")
        os.kill(pids[first], signal.SIGKILL)
        # the other application's master never stopped: its windows go on meanwhile
        before = committed(weir, second)
        poll_for(lambda: committed(weir, second) > before + 2, 60,
                 "the other application to go on committing")
        # the killed one is started again (a new process) and takes its container back
        poll_for(lambda: server.dispatcher.pids().get(first, 0) not in (0, pids[first]), 60,
                 "the killed application master to be started again")
        before = committed(weir, first)
        poll_for(lambda: committed(weir, first) > before + 2, 90,
                 "the restarted application master's application to commit again")
        assert weir.application(first).state == "RUNNING"
        assert weir.application(first).recoveries == 0  # its container was kept


def test_an_ended_applications_master_is_stopped_and_its_information_kept(tmp_path):
    with started_dispatcher(tmp_path) as server:
        weir = client(server)
        app_id = weir.submit(finite("finite").to_descriptor(), {})
        pid = server.dispatcher.pids()[app_id]
        poll_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status()
                 == psutil.STATUS_ZOMBIE, 120, "the ended application's master to stop")
        info = weir.application(app_id)
        assert info.state == "FINISHED" and info.id == app_id
        assert [a.state for a in weir.applications()] == ["FINISHED"]


def test_a_refused_dag_leaves_no_application_and_no_master(tmp_path):
    with started_dispatcher(tmp_path) as server:
        weir = client(server)
        with pytest.raises(WeirClientError, match="MAX_OPERATORS=1"):
            weir.submit(endless("big").to_descriptor(), {"MAX_OPERATORS": "1"})
        assert weir.applications() == [] and server.dispatcher.pids() == {}


def test_one_applications_secret_opens_neither_the_dispatcher_nor_another_master(tmp_path):
    with started_dispatcher(tmp_path) as server:
        weir = client(server)
        first = weir.submit(endless("first").to_descriptor(), {})
        second = weir.submit(endless("second").to_descriptor(), {})
        apps = server.dispatcher.folder / "apps"
        secret = (apps / first / "secret").read_text().strip()  # what its containers hold
        assert secret != server.secret
        with pytest.raises(WeirClientError, match="refused the call"):
            client(server, secret).kill(second)
        other = server.dispatcher._app(second)  # noqa: SLF001 - its master's address
        stranger = WeirClient(other.address, secret=secret,
                              tls_ca=apps / second / "tls" / "cert.pem", timeout_s=30)
        with pytest.raises(WeirClientError, match="refused the call"):
            stranger.kill(second)
        assert weir.application(second).state in ("ACCEPTED", "RUNNING")


def test_a_killed_dispatcher_leaves_every_application_running_and_its_restart_finds_them(
        tmp_path):
    root = str(Path(__file__).resolve().parents[2])  # the DAG's classes: tests.master.fakes
    env, tag = tagged_env(WEIR_HOME=str(tmp_path / "home"), PYTHONPATH=root)
    folder = tmp_path / "dispatcher"

    def dispatcher(name: str) -> tuple[WeirProcess, str]:
        process = WeirProcess(["master", "--application-masters", "--port", "0", "--json",
                               "--state-dir", str(folder), "--log-dir",
                               str(tmp_path / "containers")], env, tmp_path,
                              tmp_path / f"{name}.log")

        def address() -> str | None:
            text = process.output()
            if process.proc.poll() is not None:
                raise AssertionError(f"the dispatcher exited:\n{text}")
            start = text.find("{")
            if start < 0 or "}" not in text[start:]:
                return None
            return json.loads(text[start:text.index("}", start) + 1])["address"]
        return process, poll_for(address, 60, f"{name} to listen")

    first, address = dispatcher("dispatcher-1")
    second = None
    try:
        secret = (folder / "secret").read_text().strip()
        cert = folder / "tls" / "cert.pem"
        with WeirClient(address, secret=secret, tls_ca=cert, timeout_s=60) as weir:
            app_id = weir.submit(endless("kept").to_descriptor())
            poll_for(lambda: weir.application(app_id).state == "RUNNING", 60, "it to run")
        master_pid = json.loads((folder / "apps" / app_id / "master.json").read_text())["pid"]
        os.kill(first.proc.pid, signal.SIGKILL)
        first.wait(10)
        assert psutil.pid_exists(master_pid)  # the application master runs on
        second, address = dispatcher("dispatcher-2")
        with WeirClient(address, secret=secret, tls_ca=cert, timeout_s=60) as weir:
            info = weir.application(app_id)
            assert info.state == "RUNNING"
            poll_for(lambda: committed(weir, app_id) > info.committed_window_id + 2, 60,
                     "its windows to go on committing")
        assert json.loads((folder / "apps" / app_id / "master.json").read_text())["pid"] \
            == master_pid  # found again, not started again
    finally:
        for process in (first, second):
            if process is not None and process.proc.poll() is None:
                process.proc.send_signal(signal.SIGTERM)  # stops the application masters
                process.wait(60)
        poll_for(lambda: not tagged_processes(tag), 30, "every process to exit")

"""`weir savepoint --stop` through a restart of the master: the CLI finds the master again
(on its new port, where every command looks) and waits for the savepoint to complete.

Issue 36: it exited 1 ("no master answers") though the restarted master completed the
savepoint 2.4 s later. Real processes: the master (``weir master --state-dir``), its
containers and the CLI. The containers are frozen (SIGSTOP) while the savepoint is asked
for, so the master is killed before the savepoint can complete.
"""

from __future__ import annotations

import contextlib
import os
import signal
import textwrap

import psutil

from tests.e2e.test_exactly_once import write_input
from tests.e2e.test_master_restart import APP, Master, env  # noqa: F401 - the fixture
from tests.harness import TAG_ENV, WeirProcess, poll_for, tagged_processes
from weir.master.client import WeirClient
from weir.operators.app import load_app
from weir.storage.savepoints import read_manifest


def _signal_containers(environment: dict[str, str], signum: int) -> None:
    for process in tagged_processes(environment[TAG_ENV]):
        with contextlib.suppress(psutil.Error):
            if process.environ().get("WEIR_CONTAINER_ID"):
                process.send_signal(signum)


def test_savepoint_stop_waits_through_a_master_restart_on_another_port(tmp_path, env):  # noqa: F811
    write_input(tmp_path / "inbox", files=200)
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent(APP.format(
        state=str(tmp_path / "state"), inbox=str(tmp_path / "inbox"), out=str(tmp_path / "out"),
        timeout_ms=30_000)))
    first = Master(tmp_path, env, "master-1")
    secret = (tmp_path / "master-state" / "secret").read_text().strip()
    cert = tmp_path / "master-state" / "tls" / "cert.pem"
    second = cli = None
    savepoint = tmp_path / "savepoint"
    try:
        with WeirClient(first.address, secret=secret, tls_ca=cert) as client:
            app_id = client.submit(load_app(app).to_descriptor())
            poll_for(lambda: client.application(app_id).committed_window_id >= 0, 60,
                     f"a first committed window\n{first.process.output()}")
            _signal_containers(env, signal.SIGSTOP)  # the savepoint cannot complete now
            cli = WeirProcess(["savepoint", app_id, str(savepoint), "--stop", "--wait", "120"],
                              env, tmp_path, tmp_path / "cli.log")
            poll_for(lambda: client.application(app_id).savepoint_state == "writing", 30,
                     f"the savepoint to be asked for\n{cli.output()}")
        os.kill(first.process.proc.pid, signal.SIGKILL)
        first.process.wait(10)
        _signal_containers(env, signal.SIGCONT)
        second = Master(tmp_path, env, "master-2")  # another port: found again by the CLI
        assert cli.wait(150) == 0, cli.output()
        assert "savepoint complete at" in cli.output(), cli.output()
        assert read_manifest(str(savepoint)).operators  # complete: its manifest is written
    finally:
        _signal_containers(env, signal.SIGCONT)
        if cli is not None and cli.proc.poll() is None:
            cli.proc.kill()
        for master in (second, first):
            if master is not None and master.process.proc.poll() is None:
                master.process.proc.send_signal(signal.SIGTERM)
                master.process.wait(30)

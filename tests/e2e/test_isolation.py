"""Two masters on one machine, both numbering their applications from app-0001, with the
default state folder: each application keeps its own checkpoints and recovers."""

from __future__ import annotations

import os
import signal
import textwrap

from tests.e2e.conftest import container_logs
from tests.e2e.test_recovery import APP, expected, final_totals, pid_of, wait_finished
from tests.harness import poll_for
from weir.master.client import WeirClient
from weir.master.local_launcher import LocalProcessLauncher
from weir.master.server import MasterServer
from weir.operators.app import load_app


def submit(master, tmp_path, name: str) -> tuple[WeirClient, str]:
    folder = tmp_path / name
    folder.mkdir()
    app = folder / "totals_app.py"
    source = APP.format(state="", rate=15_000, keys=50, events=120_000, mode="AT_LEAST_ONCE",
                        out=str(folder / "out"))
    app.write_text(textwrap.dedent(source.replace("STATE_DIR='', ", "")))  # default folder
    client = WeirClient(master.address)
    return client, client.submit(load_app(app).to_descriptor())


def test_two_masters_with_default_state_dirs_both_recover(master, tmp_path):
    other = MasterServer("127.0.0.1", 0, lambda address: LocalProcessLauncher(
        address, log_dir=tmp_path / "other-containers"), container_stop_grace_ms=5_000)
    other.start()
    other.log_dir = tmp_path / "other-containers"
    try:
        runs = [submit(master, tmp_path, "first"), submit(other, tmp_path, "second")]
        assert runs[0][1] == runs[1][1] == "app-0001"
        folders = [client.application(app_id).attributes["STATE_DIR"]
                   for client, app_id in runs]
        assert folders[0] != folders[1]
        assert all(os.stat(f).st_mode & 0o077 == 0 for f in folders), "state must be private"
        for (client, app_id), server in zip(runs, (master, other), strict=True):
            poll_for(lambda c=client, a=app_id: c.application(a).committed_window_id >= 0, 60,
                     f"a first committed window\n{container_logs(server)}")
            _, pid = pid_of(client, app_id, "totals")
            os.kill(pid, signal.SIGKILL)
        for (client, app_id), server, name in zip(runs, (master, other), ("first", "second"),
                                                  strict=True):
            with client:
                wait_finished(client, server, app_id)
            assert final_totals(tmp_path / name / "out") == expected()
        poll_for(lambda: not any(os.path.exists(os.path.join(f, "OWNER.json"))
                                 for f in folders), 10,
                 "the ended applications to release their state folders (next master loop pass)")
    finally:
        other.stop()

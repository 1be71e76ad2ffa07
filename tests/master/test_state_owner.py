"""One state folder, one live application: claims, refusals, releases, permissions."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

from weir.master.errors import InvalidArgument
from weir.master.state_owner import (
    OWNER_FILE,
    claim_state_dir,
    default_state_dir,
    new_run_id,
    private_root,
    release_state_dir,
)


def test_a_claim_makes_a_private_folder_and_records_the_owner(tmp_path):
    folder = tmp_path / "state"
    claim = claim_state_dir(str(folder), "app-0001", "run-a")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    owner = json.loads((folder / OWNER_FILE).read_text())
    assert owner["app_id"] == "app-0001" and owner["run_id"] == "run-a"
    assert owner["pid"] == os.getpid()
    release_state_dir(claim)
    assert not (folder / OWNER_FILE).exists()


def test_a_folder_owned_by_a_live_application_is_refused(tmp_path):
    claim_state_dir(str(tmp_path), "app-0001", "run-a")
    with pytest.raises(InvalidArgument, match=r"in use by application app-0001 .*its own "
                                              r"STATE_DIR"):
        claim_state_dir(str(tmp_path), "app-0002", "run-b")
    claim_state_dir(str(tmp_path), "app-0001", "run-a")  # the same run may claim again


def test_a_folder_of_a_dead_master_is_taken_over(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, timeout=30)
    (tmp_path / OWNER_FILE).write_text(json.dumps({
        "app_id": "app-0001", "run_id": "old", "host": os.uname().nodename,
        "pid": int(dead.stdout)}))
    claim = claim_state_dir(str(tmp_path), "app-0001", "new")
    assert json.loads((tmp_path / OWNER_FILE).read_text())["run_id"] == claim.run_id == "new"


def test_releasing_leaves_another_runs_claim_alone(tmp_path):
    mine = claim_state_dir(str(tmp_path), "app-0001", "run-a")
    (tmp_path / OWNER_FILE).write_text(json.dumps({"app_id": "app-0009", "run_id": "x",
                                                   "host": "elsewhere", "pid": 1}))
    release_state_dir(mine)
    assert (tmp_path / OWNER_FILE).exists()


def test_run_ids_differ():
    assert len({new_run_id() for _ in range(50)}) == 50


def test_the_default_root_is_made_private_and_a_planted_or_open_one_is_refused(
        tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = private_root()
    claim_state_dir(default_state_dir("app-0001", new_run_id()), "app-0001", "r1")
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    os.chmod(root, 0o755)  # as older Weir versions made it: closed, not refused
    claim_state_dir(default_state_dir("app-0002", new_run_id()), "app-0002", "r2")
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    os.chmod(root, 0o777)  # anybody could have planted checkpoints in it
    with pytest.raises(InvalidArgument, match=r"has mode 777: other users may write in it"):
        claim_state_dir(default_state_dir("app-0003", new_run_id()), "app-0003", "r3")
    shutil.rmtree(root)
    elsewhere = tmp_path / "planted"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, root)  # a link in its place: the checkpoints would go there
    with pytest.raises(InvalidArgument, match="is a symbolic link"):
        claim_state_dir(default_state_dir("app-0003", new_run_id()), "app-0003", "r3")


@pytest.mark.parametrize("state_dir", ["/proc/weir-cannot-be-here", "nosuchscheme://x/y"])
def test_a_state_dir_that_cannot_be_used_is_an_invalid_argument_naming_it(state_dir):
    with pytest.raises(InvalidArgument, match=f"STATE_DIR '{state_dir}' cannot hold the "
                                              "application's state: .*this user can create"):
        claim_state_dir(state_dir, "app-0001", "r1")


def _core_with_app(**attributes):
    from tests.master.fakes import ManualClock, chain_descriptor
    from weir.master.core import MasterCore
    from weir.master.launcher import RecordingLauncher

    core = MasterCore(RecordingLauncher(), clock=ManualClock())
    app_id = core.submit(chain_descriptor(2, CONTAINERS=1, **attributes), {})
    return core, core.application(app_id)


def _containers_exit(core, app) -> None:
    for container_id in app.plan.containers:
        core.launcher.set_exit_code(container_id, 0)
    for _ in range(3):
        core.check_liveness()


def test_a_killed_runs_default_folder_is_deleted_once_its_containers_exited():
    """Issue 17, item 10: every run would leave its state in $TMPDIR otherwise."""
    core, app = _core_with_app()
    folder = app.plan.attributes["STATE_DIR"]
    assert os.path.isdir(folder) and os.path.dirname(folder) == private_root()
    core.kill_application(app.id, "done with it")
    core.check_liveness()
    _containers_exit(core, app)
    assert not os.path.exists(folder)


def test_a_failed_runs_folder_is_kept_and_a_named_one_always(tmp_path):
    core, app = _core_with_app()
    folder = app.plan.attributes["STATE_DIR"]
    app.fail("an operator failed", core.clock())
    _containers_exit(core, app)
    assert os.path.isdir(folder)  # kept for inspection
    shutil.rmtree(folder)
    core, app = _core_with_app(STATE_DIR=str(tmp_path / "mine"))
    core.kill_application(app.id)
    _containers_exit(core, app)
    assert (tmp_path / "mine").is_dir()  # the user's own folder is never deleted


def test_a_master_without_a_journal_releases_every_run_when_it_stops():
    """Nothing can take its runs back: their default folders go, running or not."""
    from tests.master.fakes import chain_descriptor
    from weir.master.launcher import RecordingLauncher
    from weir.master.server import MasterServer

    with MasterServer(launcher_factory=RecordingLauncher, http_port=None) as server:
        app_id = server.core.submit(chain_descriptor(2, CONTAINERS=1), {})
        folder = server.core.application(app_id).plan.attributes["STATE_DIR"]
        assert os.path.isdir(folder)
    assert not os.path.exists(folder)

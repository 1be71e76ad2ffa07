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

from master.errors import InvalidArgument
from master.state_owner import (
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
    with pytest.raises(InvalidArgument, match="is not a folder"):
        claim_state_dir(default_state_dir("app-0003", new_run_id()), "app-0003", "r3")


@pytest.mark.parametrize("state_dir", ["/proc/weir-cannot-be-here", "nosuchscheme://x/y"])
def test_a_state_dir_that_cannot_be_used_is_an_invalid_argument_naming_it(state_dir):
    with pytest.raises(InvalidArgument, match=f"STATE_DIR '{state_dir}' cannot hold the "
                                              "application's state: .*this user can create"):
        claim_state_dir(state_dir, "app-0001", "r1")

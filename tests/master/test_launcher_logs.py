"""Issue 29, item 13: container logs (``--log-dir``) go only into an owner-only folder of
this user, never through a link planted at a log's name."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from tests.harness import poll_for
from tests.users import as_other_user, other_user_available
from weir.master.local_launcher import LocalProcessLauncher
from weir.storage.private_files import UntrustedPath

pytestmark = pytest.mark.timeout(60)

SAY_HELLO = [sys.executable, "-c", "print('hello from the container')"]


def launch_one(log_dir, container_id: str = "app-0001-c0") -> LocalProcessLauncher:
    """Launches a container that prints a line and exits (stopped at the end)."""
    launcher = LocalProcessLauncher("127.0.0.1:1", log_dir=log_dir, command=SAY_HELLO)
    try:
        launcher.launch(container_id)
        poll_for(lambda: launcher.exit_code(container_id) is not None, 10,
                 "the container to exit")
    finally:
        launcher.stop_all(grace_s=1.0)
    return launcher


def test_a_link_at_a_logs_name_is_not_followed(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    target = tmp_path / "target"
    target.write_text("untouched\n")
    (logs / "app-0001-c0.log").symlink_to(target)
    launcher = LocalProcessLauncher("127.0.0.1:1", log_dir=logs, command=SAY_HELLO)
    try:
        with pytest.raises(OSError):
            launcher.launch("app-0001-c0")
    finally:
        launcher.stop_all(grace_s=1.0)
    assert target.read_text() == "untouched\n"


@pytest.mark.skipif(not other_user_available(), reason="needs root to act as nobody")
def test_a_log_folder_another_user_made_is_refused(shared_dir):
    logs = shared_dir / "logs"
    as_other_user(lambda: (os.mkdir(logs), os.chmod(logs, 0o777)))
    with pytest.raises(UntrustedPath, match=r"log folder .*belongs to user"):
        launch_one(logs)
    assert list(logs.iterdir()) == []


def test_a_log_folder_others_may_write_is_refused_one_they_may_read_is_closed(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    logs.chmod(0o777)
    with pytest.raises(UntrustedPath, match="other users may write"):
        launch_one(logs)
    logs.chmod(0o755)
    launch_one(logs)
    assert stat.S_IMODE(logs.stat().st_mode) == 0o700
    log = logs / "app-0001-c0.log"
    assert "hello from the container" in log.read_text()
    assert stat.S_IMODE(log.stat().st_mode) == 0o600

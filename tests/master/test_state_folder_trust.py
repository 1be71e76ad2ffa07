"""Issue 29, item 2: ``weir master --state-dir DIR`` trusts nothing another user made.

DIR holds the secret the master accepts, the TLS key its containers pin and the journal it
unpickles: a folder another user made, or a file of theirs (or a link) in a folder of
ours, must stop the master before anything in it is used."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.users import as_other_user, other_user_available
from weir.master.launcher import RecordingLauncher
from weir.master.server import MasterServer, MasterStartError
from weir.master.tls import make_self_signed

pytestmark = pytest.mark.timeout(60)

needs_other_user = pytest.mark.skipif(not other_user_available(),
                                      reason="needs root to act as nobody")

KNOWN_SECRET = "a-secret-the-other-user-knows"


def start_master(state_dir: Path) -> MasterServer:
    """A master on ``state_dir`` (started: the caller stops it)."""
    server = MasterServer(launcher_factory=RecordingLauncher, state_dir=state_dir,
                          publish_secret=False, http_port=None)
    server.start()
    return server


def assert_refused(state_dir: Path, match: str) -> None:
    """The master refuses to start, naming the folder or the file."""
    with pytest.raises(MasterStartError, match=match) as refused:
        start_master(state_dir).stop()  # stopped if it (wrongly) started
    assert str(state_dir) in str(refused.value)


def their_identity(tmp_path: Path) -> tuple[bytes, bytes]:
    """A certificate and key the other user would plant (PEM bytes)."""
    files = make_self_signed(tmp_path / "theirs")
    return files.cert.read_bytes(), files.key.read_bytes()


@needs_other_user
@pytest.mark.parametrize("mode", [0o700, 0o755, 0o777], ids=["700", "755", "777"])
def test_a_state_folder_another_user_made_is_refused_and_nothing_in_it_used(
        shared_dir, tmp_path, mode):
    state = shared_dir / "weir-master"
    cert, key = their_identity(tmp_path)

    def plant() -> None:
        os.mkdir(state, mode)
        os.chmod(state, mode)
        (state / "secret").write_text(KNOWN_SECRET + "\n")
        os.mkdir(state / "tls", 0o700)
        (state / "tls" / "cert.pem").write_bytes(cert)
        (state / "tls" / "key.pem").write_bytes(key)

    as_other_user(plant)
    before = sorted(p.name for p in state.iterdir())
    assert_refused(state, r"belongs to user")
    assert sorted(p.name for p in state.iterdir()) == before  # nothing written there either
    assert (state / "secret").read_text() == KNOWN_SECRET + "\n"


def plant_file_of_theirs(state: Path, relative: str, data: bytes) -> None:
    """A file of the other user's in our folder (it was open to them for a moment)."""
    target = state / relative
    target.unlink(missing_ok=True)
    for folder in {state, target.parent}:
        folder.chmod(0o777)
    as_other_user(lambda: target.write_bytes(data))
    for folder in {state, target.parent}:
        folder.chmod(0o700)


@needs_other_user
@pytest.mark.parametrize("relative", ["secret", "tls/key.pem", "journal/00000000000000000000.log",
                                      "master.json"])
def test_a_file_of_another_user_in_our_state_folder_is_refused(shared_dir, relative):
    state = shared_dir / "master"
    start_master(state).stop()  # a real folder of ours, with everything a master keeps
    plant_file_of_theirs(state, relative, KNOWN_SECRET.encode())
    assert_refused(state, r"belongs to user")
    assert (state / relative).read_bytes() == KNOWN_SECRET.encode()


@pytest.mark.parametrize("relative", ["secret", "tls/key.pem", "tls/cert.pem", "journal",
                                      "master.json"])
def test_a_link_in_our_state_folder_is_refused_never_followed(tmp_path, relative):
    state = tmp_path / "master"
    start_master(state).stop()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    target = elsewhere / "target"
    target.write_text(KNOWN_SECRET)
    target.chmod(0o600)
    link = state / relative
    if link.is_dir():
        os.rename(link, elsewhere / "journal")
        target = elsewhere / "journal"
    else:
        link.unlink()
    link.symlink_to(target)
    assert_refused(state, r"symbolic link")
    assert link.is_symlink()


def test_the_state_folder_itself_as_a_link_is_refused(tmp_path):
    real = tmp_path / "real"
    start_master(real).stop()
    (tmp_path / "link").symlink_to(real)
    assert_refused(tmp_path / "link", r"symbolic link")


def test_a_state_folder_others_may_write_is_refused_one_they_may_read_is_closed(tmp_path):
    state = tmp_path / "master"
    start_master(state).stop()
    state.chmod(0o777)
    assert_refused(state, r"has mode 777: other users may write")
    state.chmod(0o755)  # as older Weir versions may have left it: closed, not refused
    start_master(state).stop()
    assert stat.S_IMODE(state.stat().st_mode) == 0o700


@pytest.mark.parametrize("relative", ["secret", "tls/key.pem"])
def test_a_kept_secret_or_key_others_may_read_is_refused(tmp_path, relative):
    state = tmp_path / "master"
    start_master(state).stop()
    (state / relative).chmod(0o644)
    assert_refused(state, r"has mode 644: other users may read it")


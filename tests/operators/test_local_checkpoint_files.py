"""Issue 29, item 13: the local runner's checkpoints (pickles a resumed run loads) are
owner-only, written through no predictable name, and read from nothing another user
could have planted."""

from __future__ import annotations

import os
import stat

import pytest

from weir.runtime.local.checkpoints import LocalCheckpoints
from weir.storage.private_files import UntrustedPath


@pytest.fixture
def usual_umask():
    """The umask most users have: files are 0644 unless made otherwise."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_checkpoints_and_their_folders_are_owner_only(tmp_path, usual_umask):
    store = LocalCheckpoints(tmp_path / "checkpoints")
    store.save("count", 7, b"state")
    folder = tmp_path / "checkpoints" / "count"
    (saved,) = folder.iterdir()
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "checkpoints").stat().st_mode) == 0o700
    assert store.load("count", 7) == b"state"


def test_a_link_planted_at_a_checkpoint_name_is_not_written_through(tmp_path):
    store = LocalCheckpoints(tmp_path / "checkpoints")
    folder = tmp_path / "checkpoints" / "count"
    folder.mkdir(mode=0o700)
    target = tmp_path / "target"
    target.write_bytes(b"untouched")
    for name in (f"{7:016x}.partial", f"{7:016x}.ckpt"):  # the fixed temporary name Weir used
        (folder / name).symlink_to(target)
    store.save("count", 7, b"state")
    assert target.read_bytes() == b"untouched"
    assert store.load("count", 7) == b"state"


def test_a_linked_checkpoint_is_not_loaded(tmp_path):
    store = LocalCheckpoints(tmp_path / "checkpoints")
    store.save("count", 1, b"ours")
    planted = tmp_path / "planted"
    planted.write_bytes(b"a pickle from elsewhere")
    path = tmp_path / "checkpoints" / "count" / f"{2:016x}.ckpt"
    path.symlink_to(planted)
    with pytest.raises(UntrustedPath, match="symbolic link"):
        store.load("count", 2)


def test_a_checkpoint_folder_others_may_write_is_refused(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(UntrustedPath, match="other users may write"):
        LocalCheckpoints(folder)

"""Owner-only files and folders: what another local user made or can write is refused
before it is read, and writes never go through a planted link."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from tests.users import as_other_user, other_user_available
from weir.storage.private_files import (
    UntrustedPath,
    check_private_dir,
    check_private_file,
    check_private_tree,
    make_private_dir,
    read_private_file,
    write_private_file,
)


def test_a_folder_made_by_this_user_owner_only_is_trusted(tmp_path):
    folder = tmp_path / "mine"
    make_private_dir(str(folder))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    check_private_dir(str(folder))


def test_a_folder_others_may_write_is_refused_naming_it(tmp_path):
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(UntrustedPath, match=r"open has mode 777: other users may write"):
        check_private_dir(str(folder), "the state folder")
    with pytest.raises(UntrustedPath):
        make_private_dir(str(folder))


def test_a_folder_others_may_only_read_is_closed(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    folder.chmod(0o755)
    make_private_dir(str(folder))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_link_in_place_of_a_folder_or_file_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UntrustedPath, match="symbolic link"):
        check_private_dir(str(tmp_path / "link"))
    target = tmp_path / "secret"
    write_private_file(str(target), b"x")
    (tmp_path / "file-link").symlink_to(target)
    with pytest.raises(OSError):
        read_private_file(str(tmp_path / "file-link"))
    with pytest.raises(UntrustedPath, match="symbolic link"):
        check_private_file(str(tmp_path / "file-link"))


@pytest.mark.skipif(not other_user_available(), reason="needs root to act as nobody")
def test_a_folder_or_file_of_another_user_is_refused(shared_dir):
    theirs = shared_dir / "theirs"
    as_other_user(lambda: os.mkdir(theirs, 0o700))
    with pytest.raises(UntrustedPath, match="belongs to user"):
        make_private_dir(str(theirs))
    planted = shared_dir / "planted"
    as_other_user(lambda: planted.write_bytes(b"pickle"))
    with pytest.raises(UntrustedPath, match="belongs to user"):
        read_private_file(str(planted))


def test_a_secret_readable_by_others_is_refused(tmp_path):
    path = tmp_path / "secret"
    path.write_text("s")
    path.chmod(0o644)
    assert read_private_file(str(path)) == b"s"
    with pytest.raises(UntrustedPath, match="other users may read"):
        read_private_file(str(path), "the secret", secret=True)


def test_a_fifo_does_not_block_the_reader(tmp_path):
    fifo = tmp_path / "savepoint.json"
    os.mkfifo(fifo, 0o600)
    result: list[BaseException] = []

    def read() -> None:
        try:
            read_private_file(str(fifo))
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            result.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "reading a FIFO blocked"
    assert isinstance(result[0], UntrustedPath)


def test_a_write_replaces_a_planted_link_instead_of_following_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "manifest").symlink_to(victim)
    write_private_file(str(tmp_path / "manifest"), b"new")
    assert victim.read_bytes() == b"precious"
    assert not (tmp_path / "manifest").is_symlink()
    assert stat.S_IMODE((tmp_path / "manifest").stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest", "victim"]


def test_a_tree_with_a_file_others_may_write_is_refused(tmp_path):
    root = tmp_path / "part"
    make_private_dir(str(root / "checkpoints" / "3"))
    write_private_file(str(root / "checkpoints" / "3" / "1.ckpt"), b"x")
    check_private_tree(str(root))
    (root / "checkpoints" / "3" / "1.ckpt").chmod(0o666)
    with pytest.raises(UntrustedPath, match=r"1.ckpt has mode 666"):
        check_private_tree(str(root), "the savepoint")

"""Savepoint parts are private (issue 29, item 1): written owner-only (folders 0700, files
0600) into a folder of this user's alone, and a savepoint another user could have written
into is refused before anything of it is unpickled."""

from __future__ import annotations

import os
import pickle
import stat
from pathlib import Path

import pytest

from tests.container.test_savepoint_parts import WINDOW, Totals, seeded
from tests.users import as_other_user, other_user_available
from weir.container import savepoint_parts
from weir.container.buffer_server import BufferServer
from weir.container.checkpoint_store import CheckpointStore
from weir.container.deploy import DeployError, Deployment
from weir.container.savepoint_parts import SavedParts, write_part
from weir.runtime.operator_state import capture
from weir.storage.savepoints import SavepointError

needs_other_user = pytest.mark.skipif(not other_user_available(),
                                      reason="needs root to act as nobody")


class Planted:
    """What an attacker's pickle does when it is loaded: here, leave a mark."""

    def __init__(self, mark: str) -> None:
        self.mark = mark

    def __reduce__(self):
        return (open, (self.mark, "w"))


def modes(root) -> dict[str, int]:
    """Every folder and file under ``root`` (itself included) and its permission bits."""
    found = {".": stat.S_IMODE(os.lstat(root).st_mode)}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            found[os.path.relpath(path, root)] = stat.S_IMODE(os.lstat(path).st_mode)
    return found


def state_folder(tmp_path) -> tuple[CheckpointStore, str]:
    """An old run's checkpoint of operator 7 at WINDOW and its durable folder."""
    store = CheckpointStore(str(tmp_path / "old"))
    store.save(7, WINDOW, capture(Totals({"a": 1})))
    durable = tmp_path / "old" / "operators" / "7"
    (durable / "wal").mkdir(parents=True)
    (durable / "store.db").write_text("store")
    (durable / "wal" / "0001.log").write_text("log")
    for path in (durable, durable / "wal", durable / "store.db", durable / "wal" / "0001.log"):
        path.chmod(0o755 if path.is_dir() else 0o644)  # as an operator may have left them
    return store, str(durable)


@pytest.fixture
def deployment(tmp_path):
    deployment = Deployment("app-0002", "app-0002-c0", BufferServer(), None, 0,  # type: ignore[arg-type]
                            {"STATE_DIR": str(tmp_path / "new")}, on_change=lambda: None)
    yield deployment
    deployment.stop_all()


def test_a_part_is_written_owner_only(tmp_path):
    store, durable = state_folder(tmp_path)
    savepoint = str(tmp_path / "sp")
    write_part(store, 7, WINDOW, durable, savepoint)
    found = modes(savepoint)
    assert found == {".": 0o700, "checkpoints": 0o700, "checkpoints/7": 0o700,
                     f"checkpoints/7/{WINDOW:016x}.ckpt": 0o600, "operators": 0o700,
                     "operators/7": 0o700, "operators/7/wal": 0o700,
                     "operators/7/store.db": 0o600, "operators/7/wal/0001.log": 0o600}


def test_a_part_written_again_replaces_the_durable_folder(tmp_path):
    store, durable = state_folder(tmp_path)
    savepoint = str(tmp_path / "sp")
    write_part(store, 7, WINDOW, durable, savepoint)
    os.unlink(os.path.join(durable, "store.db"))
    write_part(store, 7, WINDOW, durable, savepoint)
    assert sorted(os.listdir(tmp_path / "sp" / "operators" / "7")) == ["wal"]


def test_a_link_in_a_durable_folder_is_refused(tmp_path):
    store, durable = state_folder(tmp_path)
    os.symlink("/etc/passwd", os.path.join(durable, "passwd"))
    with pytest.raises(SavepointError, match="passwd is a link or a special file"):
        write_part(store, 7, WINDOW, durable, str(tmp_path / "sp"))


def test_a_restored_durable_folder_is_owner_only(tmp_path, deployment):
    store, durable = state_folder(tmp_path)
    savepoint = str(tmp_path / "sp")
    write_part(store, 7, WINDOW, durable, savepoint)
    operator = deployment._build(seeded(savepoint, [7]), WINDOW)
    assert operator.totals == {"a": 1}
    assert modes(Path(deployment.folders.operator_dir(1))) == {
        ".": 0o700, "wal": 0o700, "store.db": 0o600, "wal/0001.log": 0o600}


@needs_other_user
def test_a_part_is_not_written_into_a_folder_another_user_made(shared_dir, tmp_path):
    store, durable = state_folder(tmp_path)
    theirs = shared_dir / "sp"
    as_other_user(lambda: (os.mkdir(theirs), os.chmod(theirs, 0o777)))
    with pytest.raises(SavepointError, match=r"sp belongs to user .*a savepoint is code"):
        write_part(store, 7, WINDOW, durable, str(theirs))
    assert os.listdir(theirs) == []


@needs_other_user
def test_a_part_another_user_swapped_in_is_never_unpickled(shared_dir, tmp_path, deployment):
    """The audit's attack: a savepoint in another user's open folder, its checkpoint
    swapped for a pickle with a valid header; the new run refuses it before loading."""
    theirs = shared_dir / "sp"
    as_other_user(lambda: (os.mkdir(theirs), os.chmod(theirs, 0o777)))
    CheckpointStore(str(theirs)).save(7, WINDOW, capture(Totals({"a": 1})))  # the old run
    mark = tmp_path / "unpickled"

    def swap() -> None:
        os.rename(theirs / "checkpoints", theirs / "old")
        CheckpointStore(str(theirs)).save(7, WINDOW, pickle.dumps(Planted(str(mark))))

    as_other_user(swap)
    with pytest.raises(DeployError) as raised:
        deployment._build(seeded(str(theirs), [7]), WINDOW)
    assert not mark.exists()
    assert raised.value.fatal and "cannot be restored or saved: the savepoint" in str(
        raised.value) and "belongs to user" in str(raised.value)
    with pytest.raises(savepoint_parts.UntrustedSavepoint, match="belongs to user"):
        SavedParts(str(theirs))


@needs_other_user
def test_a_savepoint_of_mine_with_a_folder_others_could_write_is_not_read(
        shared_dir, tmp_path, deployment):
    store, durable = state_folder(tmp_path)
    savepoint = shared_dir / "sp"
    write_part(store, 7, WINDOW, durable, str(savepoint))
    for folder in (savepoint, savepoint / "checkpoints"):
        folder.chmod(0o755)  # others may enter, not write: that alone is no harm
    (savepoint / "checkpoints" / "7").chmod(0o777)  # but here they may write
    mark = tmp_path / "unpickled"
    planted = savepoint / "checkpoints" / "7" / f"{WINDOW + 1:016x}.ckpt"
    as_other_user(lambda: CheckpointStore(str(savepoint)).save(
        7, WINDOW + 1, pickle.dumps(Planted(str(mark)))))
    assert planted.exists()
    with pytest.raises(DeployError) as raised:
        deployment._build(seeded(str(savepoint), [7]), WINDOW)
    assert not mark.exists()
    assert "checkpoints/7 has mode 777: other users may write" in str(raised.value)

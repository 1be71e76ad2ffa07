"""A savepoint is code: a folder another user made or can write is refused before anything
of it is read, the manifest is written without following a planted link, and a manifest
or path that is not one is a clear ``SavepointError`` (issue 29, items 1, 4, 15)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from tests.users import as_other_user, other_user_available
from weir.storage.private_files import make_private_dir, write_private_file
from weir.storage.savepoints import (
    MANIFEST,
    Manifest,
    SavedOperator,
    SavedPartition,
    SavepointError,
    check_unused,
    read_manifest,
    write_manifest,
)

WINDOW = (1_700_000_000 << 32) + 41
needs_other_user = pytest.mark.skipif(not other_user_available(),
                                      reason="needs root to act as nobody")


def manifest(window: int = WINDOW) -> Manifest:
    return Manifest(window=window, app_name="wc", application_id="app-0001", operators=[
        SavedOperator("source", "weir.operators.testing.ListSource", [SavedPartition(1, window)])])


def manifest_file(tmp_path, content: bytes) -> str:
    """A savepoint folder of this user whose manifest holds ``content``."""
    folder = tmp_path / "sp"
    make_private_dir(str(folder))
    write_private_file(str(folder / MANIFEST), content)
    return str(folder)


def raw_manifest(**changes: object) -> bytes:
    raw = json.loads(manifest().to_json())
    raw.update(changes)
    return json.dumps(raw).encode()


@needs_other_user
def test_a_folder_another_user_made_is_refused_as_a_savepoint_target(shared_dir):
    theirs = shared_dir / "sp"
    as_other_user(lambda: (os.mkdir(theirs), os.chmod(theirs, 0o777)))
    with pytest.raises(SavepointError, match=r"sp belongs to user .*a savepoint is code"):
        check_unused(str(theirs))
    with pytest.raises(SavepointError, match="belongs to user"):
        write_manifest(str(theirs), manifest())
    assert not (theirs / MANIFEST).exists()


@needs_other_user
def test_a_savepoint_in_a_folder_another_user_can_write_is_not_read(shared_dir):
    theirs = shared_dir / "sp"
    as_other_user(lambda: (os.mkdir(theirs), os.chmod(theirs, 0o777)))
    (theirs / MANIFEST).write_text(manifest().to_json())
    with pytest.raises(SavepointError, match=r"sp belongs to user .*a savepoint is code"):
        read_manifest(str(theirs))


@needs_other_user
def test_a_file_another_user_put_in_a_savepoint_makes_it_untrusted(shared_dir):
    path = manifest_file(shared_dir, manifest().to_json().encode())
    os.chmod(path, 0o777)  # once open to all: anyone could have dropped a part in
    as_other_user(lambda: open(os.path.join(path, "planted.ckpt"), "wb").close())
    os.chmod(path, 0o700)
    with pytest.raises(SavepointError, match="planted.ckpt belongs to user"):
        read_manifest(path)


@needs_other_user
def test_the_manifest_is_never_written_through_a_planted_link(shared_dir, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("mine")
    theirs = shared_dir / "sp"

    def plant() -> None:
        os.mkdir(theirs)
        os.chmod(theirs, 0o777)
        os.symlink(victim, theirs / f".{MANIFEST}.tmp")

    as_other_user(plant)
    with pytest.raises(SavepointError):
        write_manifest(str(theirs), manifest())
    assert victim.read_text() == "mine"


def test_a_link_in_a_folder_of_mine_is_replaced_not_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("mine")
    folder = tmp_path / "sp"
    make_private_dir(str(folder))
    (folder / f".{MANIFEST}.tmp").symlink_to(victim)
    (folder / MANIFEST).symlink_to(victim)
    write_manifest(str(folder), manifest())
    assert victim.read_text() == "mine"
    written = folder / MANIFEST
    assert not written.is_symlink() and stat.S_IMODE(written.stat().st_mode) == 0o600


def test_a_folder_of_mine_others_may_write_is_refused_and_a_missing_one_is_made_owner_only(
        tmp_path):
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(SavepointError, match=r"open has mode 777: other users may write"):
        check_unused(str(folder))
    new = tmp_path / "new"
    check_unused(str(new))
    write_manifest(str(new), manifest())
    assert stat.S_IMODE(new.stat().st_mode) == 0o700
    assert read_manifest(str(new)) == manifest()


@pytest.mark.parametrize(("content", "fragment"), [
    (b"[]", "the manifest is [], not a JSON object"),
    (b"null", "the manifest is None, not a JSON object"),
    (b"\xff\xfe{}", "is not UTF-8 text"),
    (b"{", "not JSON"),
    (b"[" * 100_000, "not JSON"),
    (raw_manifest(window=2**80), "'window' is 1208925819614629174706176, not an integer in "
                                 "0..2**63-1"),
    (raw_manifest(window=-5), "'window' is -5, not an integer"),
    (raw_manifest(window=True), "'window' is True, not an integer"),
    (raw_manifest(window=1.5), "'window' is 1.5, not an integer"),
    (raw_manifest(created_ms=2**63), "'created_ms'"),
    (raw_manifest(operators=[{"name": "a", "class_name": "C",
                              "partitions": [{"id": 2**64, "window": 1}]}]),
     "operator 'a': 'id' is 18446744073709551616, not an integer"),
    (raw_manifest(operators=[{"name": "a", "class_name": "C",
                              "partitions": [{"id": 1, "window": 2**63}]}]),
     "operator 'a': 'window'"),
    (raw_manifest(operators=[{"name": "a", "class_name": "C", "partitions": [],
                              "attributes": {"X": 1}}]), "its attributes must map names"),
    (raw_manifest(operators={"a": 1}), "'operators' is {'a': 1}, not a list"),
    (raw_manifest(operators=[None]), "an operator is None, not a JSON object"),
    (raw_manifest(app_name=7), "'app_name' is 7, not a string"),
    (raw_manifest(format=2), "savepoint format 2 is not 1"),
    (b'{"format": 1}', "it has no 'operators'"),
])
def test_a_manifest_that_is_not_one_is_refused_naming_why(tmp_path, content, fragment):
    path = manifest_file(tmp_path, content)
    with pytest.raises(SavepointError, match="is not a savepoint manifest") as raised:
        read_manifest(path)
    assert fragment in str(raised.value)


def test_a_manifest_too_large_is_not_read(tmp_path, monkeypatch):
    import weir.storage.savepoints as savepoints

    monkeypatch.setattr(savepoints, "MAX_MANIFEST_BYTES", 1000)
    path = manifest_file(tmp_path, raw_manifest(app_name="x" * 2000))
    with pytest.raises(SavepointError, match="larger than"):
        read_manifest(path)


@pytest.mark.parametrize(("path", "fragment"), [
    ("/data/sp\0x", "holds a NUL character"),
    ("/data/sp\ud800", "cannot be encoded"),
    ("relative/sp", "is relative: give an absolute path"),
    ("", "name the folder of the savepoint"),
    ("foo://bucket/sp", "unknown scheme 'foo': give an absolute local path or a URI of "
                        "file://, local://, s3://"),
    ("ftp://user:secret@host/sp", "'ftp://***@host/sp' has an unknown scheme"),
])
@pytest.mark.parametrize("call", [check_unused, read_manifest,
                                  lambda path: write_manifest(path, manifest())])
def test_a_path_that_is_not_one_is_a_savepoint_error(path, fragment, call):
    with pytest.raises(SavepointError) as raised:
        call(path)
    assert fragment in str(raised.value)
    assert "secret" not in str(raised.value)


def test_a_file_uri_is_a_local_folder_and_checked_as_one(tmp_path):
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(SavepointError, match="other users may write"):
        check_unused(f"file://{folder}")
    write_manifest(f"file://{tmp_path}/sp", manifest())
    assert stat.S_IMODE((tmp_path / "sp" / MANIFEST).stat().st_mode) == 0o600
    assert read_manifest(f"file://{tmp_path}/sp") == manifest()


def test_a_store_that_fails_is_a_savepoint_error(tmp_path):
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(SavepointError, match="cannot write the manifest of the savepoint"):
        write_manifest(str(file / "sp"), manifest())

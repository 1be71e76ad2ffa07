"""The checkpoint store on real files: round trip, atomic saves, corruption detection, cleanup."""

from __future__ import annotations

import os
import struct
import zlib

import pyarrow.fs as pafs
import pytest

from weir.container.checkpoint_store import (
    HEADER_SIZE,
    MAGIC,
    CheckpointInfo,
    CheckpointStore,
    CorruptCheckpoint,
)

W1 = (1_700_000_000 << 32) | 20
W2 = (1_700_000_000 << 32) | 40
W3 = (1_700_000_000 << 32) | 60


@pytest.fixture
def store(tmp_path) -> CheckpointStore:
    return CheckpointStore(str(tmp_path / "state"))


def test_round_trip_and_layout(store, tmp_path):
    data = os.urandom(100_000)
    info = store.save(7, W1, data)
    assert isinstance(info, CheckpointInfo)
    assert info.window_id == W1 and info.bytes == len(data) + HEADER_SIZE
    assert 0 <= info.seconds < 10
    path = tmp_path / "state" / "checkpoints" / "7" / f"{W1:016x}.ckpt"
    assert path.is_file() and path.read_bytes()[:8] == MAGIC
    assert path.stat().st_size == info.bytes
    assert store.load(7, W1) == data
    assert store.load("7", W1) == data  # ids as int or str name the same folder
    assert store.windows(7) == [W1]


def test_empty_payload_and_overwrite(store):
    store.save(1, W1, b"")
    assert store.load(1, W1) == b""
    store.save(1, W1, b"second")
    assert store.load(1, W1) == b"second"
    assert store.windows(1) == [W1]


def test_relative_root_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = CheckpointStore("rel")
    store.save(1, W1, b"x")
    monkeypatch.chdir("/")
    assert store.load(1, W1) == b"x"
    assert (tmp_path / "rel" / "checkpoints" / "1").is_dir()


def test_missing_operator_and_window(store):
    assert store.windows(3) == []
    assert store.latest(3) is None
    assert store.delete_before(3, W2) == 0
    store.delete(3)  # nothing to delete is fine
    with pytest.raises(FileNotFoundError, match="no checkpoint of operator 3"):
        store.load(3, W1)


def test_leftover_temp_file_is_ignored(store, tmp_path):
    store.save(2, W1, b"good")
    folder = tmp_path / "state" / "checkpoints" / "2"
    # a save that died before its rename leaves a torn temporary file
    torn = folder / f".{W2:016x}.ckpt.abc123.tmp"
    torn.write_bytes(MAGIC + b"\x01")
    (folder / "notes.txt").write_text("not a checkpoint")
    assert store.windows(2) == [W1]
    assert store.latest(2) == W1
    with pytest.raises(FileNotFoundError):
        store.load(2, W2)
    store.save(2, W2, b"newer")
    assert store.windows(2) == [W1, W2]
    assert store.load(2, W2) == b"newer"
    assert torn.exists()  # never mistaken for the checkpoint it was going to be


def test_save_leaves_no_temp_file_and_failed_save_keeps_the_old_one(store, tmp_path,
                                                                    monkeypatch):
    store.save(2, W1, b"old")
    folder = tmp_path / "state" / "checkpoints" / "2"
    assert sorted(os.listdir(folder)) == [f"{W1:016x}.ckpt"]

    def broken_fsync(fd):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk on fire"):
        store.save(2, W1, b"new")
    monkeypatch.undo()
    assert sorted(os.listdir(folder)) == [f"{W1:016x}.ckpt"]  # temp file removed
    assert store.load(2, W1) == b"old"


def _file(tmp_path, operator_id, window_id):
    return tmp_path / "state" / "checkpoints" / str(operator_id) / f"{window_id:016x}.ckpt"


def test_flipped_payload_byte_is_a_checksum_mismatch(store, tmp_path):
    store.save(4, W1, b"a" * 1000)
    path = _file(tmp_path, 4, W1)
    raw = bytearray(path.read_bytes())
    raw[HEADER_SIZE + 500] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch") as caught:
        store.load(4, W1)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.path == str(path)


def test_flipped_header_byte_is_detected(store, tmp_path):
    store.save(4, W1, b"payload")
    path = _file(tmp_path, 4, W1)
    raw = bytearray(path.read_bytes())
    raw[12] ^= 0x01  # lowest byte of the window id
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch"):
        store.load(4, W1)


@pytest.mark.parametrize("keep", [0, 5, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 99])
def test_truncated_file(store, tmp_path, keep):
    store.save(5, W1, b"z" * 100)
    path = _file(tmp_path, 5, W1)
    path.write_bytes(path.read_bytes()[:keep])
    with pytest.raises(CorruptCheckpoint, match="truncated") as caught:
        store.load(5, W1)
    assert str(path) in str(caught.value)


def test_trailing_bytes(store, tmp_path):
    store.save(5, W1, b"z" * 100)
    path = _file(tmp_path, 5, W1)
    path.write_bytes(path.read_bytes() + b"junk")
    with pytest.raises(CorruptCheckpoint, match="4 bytes of trailing data"):
        store.load(5, W1)


def test_wrong_magic(store, tmp_path):
    store.save(6, W1, b"state")
    path = _file(tmp_path, 6, W1)
    path.write_bytes(b"PAR1" + path.read_bytes()[4:])
    with pytest.raises(CorruptCheckpoint, match="bad magic.*not a Weir checkpoint"):
        store.load(6, W1)


def test_unknown_version(store, tmp_path):
    store.save(6, W1, b"state")
    path = _file(tmp_path, 6, W1)
    raw = bytearray(path.read_bytes())
    raw[8:12] = struct.pack("<I", 99)
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpoint, match="unsupported format version 99"):
        store.load(6, W1)


def test_header_names_another_window(store, tmp_path):
    store.save(8, W1, b"state of W1")
    # a whole, valid file under the wrong name (copied or renamed by hand)
    _file(tmp_path, 8, W1).rename(_file(tmp_path, 8, W2))
    with pytest.raises(CorruptCheckpoint, match="window id mismatch") as caught:
        store.load(8, W2)
    assert f"{W1:016x}" in str(caught.value) and f"{W2:016x}" in str(caught.value)


def test_checksum_covers_the_header():
    # the format as documented: CRC32 of header bytes 0..27, then the payload
    header = struct.pack("<8sIQQ", MAGIC, 1, W1, 3)
    crc = zlib.crc32(b"abc", zlib.crc32(header))
    assert len(header) + 4 == HEADER_SIZE
    blob = header + struct.pack("<I", crc) + b"abc"
    from weir.container.checkpoint_store import _verify
    assert _verify("x", blob, W1) == b"abc"


def test_windows_latest_and_delete_before(store):
    for w in (W3, W1, W2):
        store.save(9, w, str(w).encode())
    store.save(10, W1, b"other operator")
    assert store.windows(9) == [W1, W2, W3]
    assert store.latest(9) == W3
    assert store.latest(9, at_most=W3) == W3
    assert store.latest(9, at_most=W3 - 1) == W2
    assert store.latest(9, at_most=W2) == W2
    assert store.latest(9, at_most=W1 - 1) is None
    assert store.delete_before(9, W2) == 1
    assert store.windows(9) == [W2, W3]
    assert store.delete_before(9, W2) == 0
    assert store.delete_before(9, W3 + 1) == 2
    assert store.windows(9) == []
    assert store.windows(10) == [W1]  # untouched


def test_delete_removes_the_operator_folder(store, tmp_path):
    store.save(11, W1, b"a")
    store.save(11, W2, b"b")
    (tmp_path / "state" / "checkpoints" / "11" / ".x.tmp").write_bytes(b"torn")
    store.save(12, W1, b"c")
    store.delete(11)
    assert not (tmp_path / "state" / "checkpoints" / "11").exists()
    assert store.windows(11) == []
    assert store.load(12, W1) == b"c"


def test_bad_ids_are_rejected(store):
    with pytest.raises(ValueError, match="window id -1"):
        store.save(1, -1, b"")
    with pytest.raises(ValueError, match="window id"):
        store.save(1, 1 << 64, b"")
    for bad in ("", "..", "a/b"):
        with pytest.raises(ValueError, match="cannot name a checkpoint folder"):
            store.save(bad, W1, b"")


def test_file_uri_root(tmp_path):
    root = tmp_path / "uri state"
    store = CheckpointStore(root.as_uri())
    assert isinstance(store.fs, pafs.LocalFileSystem)
    store.save(3, W1, b"via uri")
    assert (root / "checkpoints" / "3" / f"{W1:016x}.ckpt").is_file()
    assert store.windows(3) == [W1]
    # a plain-path store sees the same files
    assert CheckpointStore(str(root)).load(3, W1) == b"via uri"


def test_generic_pyarrow_filesystem(tmp_path):
    """A filesystem other than LocalFileSystem takes the pyarrow.fs write path."""
    base = tmp_path / "sub"
    base.mkdir()
    fs = pafs.SubTreeFileSystem(str(base), pafs.LocalFileSystem())
    store = CheckpointStore("state", filesystem=fs)
    store.save(1, W1, b"one")
    store.save(1, W2, b"two")
    folder = base / "state" / "checkpoints" / "1"
    assert sorted(os.listdir(folder)) == [f"{W1:016x}.ckpt", f"{W2:016x}.ckpt"]
    (folder / f".{W3:016x}.ckpt.dead.tmp").write_bytes(b"torn")
    assert store.windows(1) == [W1, W2]
    assert store.load(1, W2) == b"two"
    raw = bytearray((folder / f"{W1:016x}.ckpt").read_bytes())
    raw[-1] ^= 0xFF
    (folder / f"{W1:016x}.ckpt").write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch"):
        store.load(1, W1)
    assert store.delete_before(1, W2) == 1
    store.delete(1)
    assert not folder.exists()


def test_a_fenced_save_leaves_no_checkpoint_and_no_temporary_file(store):
    old, new = store.fence(7, 1), store.fence(7, 2)
    old.claim()
    store.save(7, W1, b"first", check=old.check)
    new.claim()
    with pytest.raises(Exception, match="generation 1 of operator 7 is fenced off"):
        store.save(7, W2, b"from a replaced deployment", check=old.check)
    assert store.windows(7) == [W1]
    assert [n for n in os.listdir(store.folder(7)) if n.endswith(".tmp")] == []
    store.save(7, W2, b"from its successor", check=new.check)
    assert store.load(7, W2) == b"from its successor"


def test_temporaries_of_cut_short_saves_are_swept(store):
    store.save(7, W1, b"x")
    leftover = os.path.join(store.folder(7), f".{W2:016x}.ckpt.abc.tmp")
    with open(leftover, "wb") as out:
        out.write(b"half")
    assert store.delete_temporaries(7) == 1
    assert not os.path.exists(leftover) and store.windows(7) == [W1]

"""An append-only log of checksummed records in segment files: the one durable primitive.

Write-ahead logs of push sources, the window logs of replayable sources and the
commit-step stores of exactly-once sinks are all this log. A record is durable once
``sync()`` returned; a crash may leave a torn tail, which opening the log cuts off with a
warning. Damage anywhere else is never guessed around: opening raises ``CorruptLog``
naming the file and the byte offset.

What is a torn tail: the records appended since the last ``sync`` reach the disk in any
order (page by page), so a crash can leave a zeroed or stale page *between* good ones.
So each sync, once done, writes a *sync mark* (not itself synced): a small record stating
the offset that sync made durable. Opening the last segment, a bad record
at offset P is a torn tail, cut off with what follows, unless a later sync mark says a
sync covered P: then it is damage to synced data (``CorruptLog``). In the other
segments, which were synced whole before the next began, any bad record is damage.

Layout: a folder of segments ``<sequence number of the first record, 20 digits>.log``.
A segment is the 8 bytes ``WEIRLOG1`` followed by records:

====== ===== =====================================================
bytes  field
====== ===== =====================================================
4      payload length (little-endian); the top bit marks a sync mark
4      CRC32 of those 4 length bytes: a damaged length is caught
n      payload (a sync mark's: the durable offset, 8 bytes)
4      CRC32 of the payload
====== ===== =====================================================

>>> import tempfile
>>> log = RecordLog(tempfile.mkdtemp())
>>> [log.append(p) for p in (b"a", b"bb")], log.sync()
([0, 1], None)
>>> list(RecordLog(log.folder).records())
[(0, b'a'), (1, b'bb')]
"""

from __future__ import annotations

import logging
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import BinaryIO

__all__ = ["CorruptLog", "RecordLog", "sync_folder"]

_LOGGER = logging.getLogger(__name__)

MAGIC = b"WEIRLOG1"
_LENGTH = struct.Struct("<II")  # length, CRC32 of the length bytes
_CRC = struct.Struct("<I")
_NAME = re.compile(r"^(\d{20})\.log$")
MAX_RECORD = 1 << 30
_MARK_FLAG = 1 << 31  # in the length field: a sync mark, not a record
_MARK_LENGTH = _CRC.pack(_MARK_FLAG | 8)
_MARK_HEAD = _MARK_LENGTH + _CRC.pack(zlib.crc32(_MARK_LENGTH))  # the same 8 bytes always
_OFFSET = struct.Struct("<Q")


class CorruptLog(Exception):
    """A log segment is damaged before its end: its records cannot be trusted.

    Attributes:
        path: the segment file.
        offset: byte offset in it of the first bad record.
        reason: what is wrong, in a few words.
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"corrupt log record in {path} at byte {offset}: {reason}; the log "
                         "cannot be replayed past it (restore the file or remove the folder to "
                         "start over, losing what it held)")
        self.path = path
        self.offset = offset
        self.reason = reason


def sync_folder(path: str) -> None:
    """fsync a folder, so a file created or renamed in it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _discard(file: BinaryIO) -> None:
    """Closes ``file`` dropping what it buffered: its descriptor is pointed at the null
    device first, so the flush that closing makes writes nowhere."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, file.fileno())
    finally:
        os.close(null)
    file.close()


def _no_guard() -> None:
    """Every write is allowed (a log without a fence)."""


class RecordLog:
    """A durable append-only log in ``folder``; records are numbered from 0.

    Opening scans every segment (checking every checksum) and repairs a torn tail of the
    last one. Not thread-safe: one writer, in the operator's thread.

    Args:
        folder: where the segments live (created if missing).
        segment_bytes: a segment is closed and a new one started past this size.
        guard: called before every write (append, sync, roll, delete); raises to refuse
            it: the operator's fence (``storage.fence``), so a replaced
            deployment never writes into the log its successor uses.
    """

    def __init__(self, folder: str, segment_bytes: int = 64 << 20,
                 guard: Callable[[], None] | None = None) -> None:
        self.folder = folder
        self.segment_bytes = segment_bytes
        self._guard = guard or _no_guard
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self._segments: list[int] = []  # first sequence number of each segment, ascending
        self.next_seq = 0
        self._file: BinaryIO | None = None
        self._file_bytes = 0
        self._new_segment = False
        self._open()

    # -- writing ------------------------------------------------------------------
    def append(self, payload: bytes) -> int:
        """Adds a record (buffered until ``sync``); returns its sequence number."""
        if len(payload) > MAX_RECORD:
            raise ValueError(f"a log record holds at most {MAX_RECORD} bytes, not {len(payload)}")
        self._guard()
        if self._file is None or self._file_bytes >= self.segment_bytes:
            self.roll()
        assert self._file is not None
        length = _CRC.pack(len(payload))
        self._file.write(length + _CRC.pack(zlib.crc32(length)) + payload
                         + _CRC.pack(zlib.crc32(payload)))
        self._file_bytes += _LENGTH.size + len(payload) + _CRC.size
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def sync(self) -> None:
        """Makes every appended record durable (file and, for a new segment, folder), then
        writes a sync mark saying so (it reaches the disk with the next sync, or sooner)."""
        if self._file is None:
            return
        self._guard()
        self._file.flush()
        os.fsync(self._file.fileno())
        if self._new_segment:
            sync_folder(self.folder)
            self._new_segment = False
        durable = _OFFSET.pack(self._file_bytes)
        self._file.write(_MARK_HEAD + durable + _CRC.pack(zlib.crc32(durable)))
        self._file.flush()
        self._file_bytes += _LENGTH.size + _OFFSET.size + _CRC.size

    def roll(self) -> None:
        """Closes the current segment; the next record starts a new one."""
        self._guard()
        if self._file is not None:
            self.sync()
            self._file.close()
        path = self._path(self.next_seq)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._file = os.fdopen(fd, "wb")
        self._file.write(MAGIC)
        self._file_bytes = len(MAGIC)
        self._segments.append(self.next_seq)
        self._new_segment = True

    def delete_before(self, seq: int) -> int:
        """Deletes the closed segments whose records all come before ``seq``; returns how many.

        The segment being written is kept even when it is entirely older.
        """
        deleted = 0
        if len(self._segments) > 1 and self._segments[1] <= seq:
            self._guard()
        while len(self._segments) > 1 and self._segments[1] <= seq:
            os.remove(self._path(self._segments.pop(0)))
            deleted += 1
        if deleted:
            sync_folder(self.folder)
        return deleted

    def close(self) -> None:
        """Syncs and closes; if the guard refuses the sync, what is buffered is dropped."""
        if self._file is None:
            return
        file, self._file = self._file, None
        try:
            self._guard()
        except BaseException:
            _discard(file)  # the refused records never reach the file
            raise
        file.flush()
        os.fsync(file.fileno())
        file.close()

    # -- reading ------------------------------------------------------------------
    @property
    def first_seq(self) -> int:
        """The oldest record still kept (``next_seq`` when the log is empty)."""
        return self._segments[0] if self._segments else self.next_seq

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    def records(self, from_seq: int = 0) -> Iterator[tuple[int, bytes]]:
        """``(sequence number, payload)`` of the synced or appended records from ``from_seq``."""
        if self._file is not None:
            self._file.flush()
        for index, first in enumerate(self._segments):
            following = (self._segments[index + 1] if index + 1 < len(self._segments)
                         else self.next_seq)
            if following <= from_seq:
                continue
            seq = first
            for payload, _ in _read_segment(self._path(first), repair=False):
                if seq >= following:
                    break
                if seq >= from_seq:
                    yield seq, payload
                seq += 1

    # -- opening ------------------------------------------------------------------
    def _path(self, first_seq: int) -> str:
        return os.path.join(self.folder, f"{first_seq:020d}.log")

    def _open(self) -> None:
        names = sorted(n for n in os.listdir(self.folder) if _NAME.match(n))
        self._segments = [int(_NAME.match(n).group(1)) for n in names]  # type: ignore[union-attr]
        if not self._segments:
            return
        for index, first in enumerate(self._segments):
            last = index == len(self._segments) - 1
            count, end = 0, len(MAGIC)
            for _, record_end in _read_segment(self._path(first), repair=last):
                count, end = count + 1, record_end
            if not last and first + count != self._segments[index + 1]:
                raise CorruptLog(self._path(first), end,
                                 f"it holds {count} records but the next segment starts at "
                                 f"record {self._segments[index + 1]}, not {first + count}")
            self.next_seq = first + count
        path = self._path(self._segments[-1])
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0))
        os.fchmod(fd, 0o600)  # owner-only whatever the umask or an older version made it
        self._file = os.fdopen(fd, "ab")
        self._file_bytes = self._file.tell()


def _read_segment(path: str, *, repair: bool) -> Iterator[tuple[bytes, int]]:
    """``(payload, end offset)`` of each good record (sync marks skipped); a torn tail is
    cut off when ``repair`` (the last segment, at open)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:len(MAGIC)] != MAGIC:
        if repair and len(data) < len(MAGIC) and MAGIC.startswith(data):
            _truncate(path, 0, "a torn segment header")
            with open(path, "wb") as f:
                f.write(MAGIC)
            return
        raise CorruptLog(path, 0, "not a Weir log segment (bad magic)")
    offset = len(MAGIC)
    while offset < len(data):
        problem, torn = _check_record(data, offset)
        if problem is None:
            length = _CRC.unpack_from(data, offset)[0]
            end = offset + _LENGTH.size + (length & ~_MARK_FLAG) + _CRC.size
            if not length & _MARK_FLAG:
                yield data[offset + _LENGTH.size:end - _CRC.size], end
            offset = end
            continue
        synced = _synced_past(data, offset)
        if synced is not None:
            raise CorruptLog(path, offset, f"{problem}, in data a sync made durable (up to "
                                           f"byte {synced})")
        if not torn and not repair:
            raise CorruptLog(path, offset, problem)
        if not repair:
            return  # a reader of a log being repaired elsewhere: stop at the tear
        _truncate(path, offset, problem)
        return


def _synced_past(data: bytes, offset: int) -> int | None:
    """The durable offset a sync mark after ``offset`` states, if it is past ``offset``
    (the bad record there was synced: damage, not a tear); None if no mark says so."""
    found = data.find(_MARK_HEAD, offset + 1)
    while found >= 0:
        start = found + _LENGTH.size
        end = start + _OFFSET.size + _CRC.size
        if end <= len(data):
            payload = data[start:start + _OFFSET.size]
            if zlib.crc32(payload) == _CRC.unpack_from(data, end - _CRC.size)[0]:
                (durable,) = _OFFSET.unpack(payload)
                if durable > offset:
                    return durable
        found = data.find(_MARK_HEAD, found + 1)
    return None


def _check_record(data: bytes, offset: int) -> tuple[str | None, bool]:
    """What is wrong with the record at ``offset`` (None = nothing), and whether that is a
    torn tail (the crash of a writer) rather than damage."""
    rest = len(data) - offset
    if not any(data[offset:]):
        return "zeros after the last record", True
    if rest < _LENGTH.size:
        return "a record header cut short", True
    length, length_crc = _LENGTH.unpack_from(data, offset)
    if zlib.crc32(data[offset:offset + 4]) != length_crc:
        return "the record length fails its checksum", False
    if length & _MARK_FLAG and length != _MARK_FLAG | _OFFSET.size:
        return "a sync mark of the wrong length", False
    end = offset + _LENGTH.size + (length & ~_MARK_FLAG) + _CRC.size
    if end > len(data):
        return f"a record of {length} bytes cut short", True
    (crc,) = _CRC.unpack_from(data, end - _CRC.size)
    if zlib.crc32(data[offset + _LENGTH.size:end - _CRC.size]) != crc:
        return "the payload fails its checksum", end == len(data)
    return None, False


def _truncate(path: str, offset: int, problem: str) -> None:
    _LOGGER.warning("log %s: cutting off a torn tail at byte %d (%s): the writer crashed "
                    "before syncing it, so nobody was told it was durable", path, offset,
                    problem)
    with open(path, "r+b") as f:
        f.truncate(offset)
        f.flush()
        os.fsync(f.fileno())

"""The master's journal: the latest record of every key, durable and compacted.

Kafka's offset manager keeps a compacted log: each write appends ``(key, value)``, a
reader keeps the newest value per key, and compaction rewrites the log with only those.
The master journals each application's state under its id the same way, so a master
killed at any moment starts again from exactly what it had acknowledged.

Records live in a ``RecordLog`` (checksummed; a torn last record is cut off with a
warning, damage elsewhere raises ``CorruptLog`` naming the file and byte offset).
Compaction writes a snapshot (every live record) into a fresh segment and only then
deletes the older segments: a crash at any point leaves either the old segments or the
new one, each complete, and reading the union gives the same state.

A record is a 4-byte key length, the key (UTF-8), then the value; an empty value with
the tombstone flag deletes the key. A batch record (``put_many``) holds several such
records, each after its 4-byte length: they land together or, torn, not at all.

>>> import tempfile
>>> journal = Journal(tempfile.mkdtemp())
>>> journal.put("app-0001", b"state 1"); journal.put("app-0001", b"state 2")
>>> Journal(journal.folder).load()
{'app-0001': b'state 2'}
"""

from __future__ import annotations

import logging
import struct
import time

from weir.storage.records import RecordLog

__all__ = ["Journal"]

_LOGGER = logging.getLogger(__name__)
_HEAD = struct.Struct("<IB")  # key length, flags
_TOMBSTONE = 1
_BATCH = 2
_LENGTH = struct.Struct("<I")


class Journal:
    """A compacted, durable key → bytes store on an append-only log.

    Args:
        folder: where the journal's segments live.
        segment_bytes: size at which a segment is closed.
        compact_ratio: compact when the log holds this many times more bytes than the live
            records (and at least ``min_compact_bytes``): by size, not count, so a few
            keys rewritten with large values cannot grow it unchecked.
        min_compact_bytes: a log smaller than this is never compacted.
    """

    def __init__(self, folder: str, segment_bytes: int = 16 << 20,
                 compact_ratio: int = 8, min_compact_bytes: int = 1 << 20) -> None:
        self.folder = folder
        self.compact_ratio = compact_ratio
        self.min_compact_bytes = min_compact_bytes
        self._log = RecordLog(folder, segment_bytes)
        self._values: dict[str, bytes] = {}
        self._live_bytes = 0  # what a snapshot of the live records takes
        self._log_bytes = 0  # record bytes in the log (what compaction would drop or keep)
        self.write_seconds = 0.0  # time spent appending and syncing, for the benchmark
        self.writes = 0
        self.compactions = 0
        for seq, payload in self._log.records():
            self._apply(seq, payload)
            self._log_bytes += len(payload)

    def load(self) -> dict[str, bytes]:
        """The newest value of every key, as read at open and written since."""
        return dict(self._values)

    def __contains__(self, key: str) -> bool:
        return key in self._values

    def put(self, key: str, value: bytes, *, sync: bool = True) -> None:
        """Records ``value`` for ``key``; durable when this returns (unless ``sync=False``)."""
        self._write(_encode(key, value, 0), sync)
        self._set(key, value)
        self._maybe_compact()

    def put_many(self, items: list[tuple[str, bytes]], *, sync: bool = True) -> None:
        """Records every ``(key, value)`` at once: after a crash, all of them or none."""
        if len(items) == 1:
            self.put(*items[0], sync=sync)
            return
        parts = []
        for key, value in items:
            record = _encode(key, value, 0)
            parts += [_LENGTH.pack(len(record)), record]
        self._write(_encode("", b"".join(parts), _BATCH), sync)
        for key, value in items:
            self._set(key, value)
        self._maybe_compact()

    def delete(self, key: str, *, sync: bool = True) -> None:
        if key in self._values:
            self._write(_encode(key, b"", _TOMBSTONE), sync)
            self._remove(key)
            self._maybe_compact()

    def sync(self) -> None:
        self._log.sync()

    def compact(self) -> None:
        """Rewrites the live records into a new segment, then drops the older segments."""
        self._log.roll()
        first = self._log.next_seq
        for key, value in self._values.items():
            self._log.append(_encode(key, value, 0))
        self._log.sync()
        self._log.delete_before(first)
        self._log_bytes = self._live_bytes
        self.compactions += 1
        _LOGGER.debug("journal %s compacted to %d records (%d bytes)", self.folder,
                      len(self._values), self._live_bytes)

    def close(self) -> None:
        self._log.close()

    def _write(self, record: bytes, sync: bool) -> None:
        started = time.perf_counter()
        self._log.append(record)
        if sync:
            self._log.sync()
        self._log_bytes += len(record)
        self.write_seconds += time.perf_counter() - started
        self.writes += 1

    def _maybe_compact(self) -> None:
        """Compacts once the log is ``compact_ratio`` times the live records' size; called
        after the in-memory values took the write, so the snapshot holds it."""
        if self._log_bytes > max(self.compact_ratio * self._live_bytes,
                                 self.min_compact_bytes):
            self.compact()

    def _set(self, key: str, value: bytes) -> None:
        old = self._values.get(key)
        if old is not None:
            self._live_bytes -= _size(key, old)
        self._values[key] = value
        self._live_bytes += _size(key, value)

    def _remove(self, key: str) -> None:
        old = self._values.pop(key, None)
        if old is not None:
            self._live_bytes -= _size(key, old)

    def _apply(self, seq: int, payload: bytes) -> None:
        if len(payload) < _HEAD.size:
            raise ValueError(f"journal {self.folder}: record {seq} is too short to hold a key")
        length, flags = _HEAD.unpack_from(payload)
        key = payload[_HEAD.size:_HEAD.size + length].decode("utf-8")
        if flags & _BATCH:
            offset = _HEAD.size + length
            while offset < len(payload):
                (size,) = _LENGTH.unpack_from(payload, offset)
                self._apply(seq, payload[offset + _LENGTH.size:offset + _LENGTH.size + size])
                offset += _LENGTH.size + size
            return
        if flags & _TOMBSTONE:
            self._remove(key)
        else:
            self._set(key, payload[_HEAD.size + length:])


def _size(key: str, value: bytes) -> int:
    """The bytes a live record takes in a snapshot."""
    return _HEAD.size + len(key.encode("utf-8")) + len(value)


def _encode(key: str, value: bytes, flags: int) -> bytes:
    raw = key.encode("utf-8")
    return _HEAD.pack(len(raw), flags) + raw + value

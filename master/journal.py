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

from operators.durable.records import RecordLog

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
        compact_ratio: compact when the log holds this many times more records than keys.
    """

    def __init__(self, folder: str, segment_bytes: int = 16 << 20,
                 compact_ratio: int = 8) -> None:
        self.folder = folder
        self.compact_ratio = compact_ratio
        self._log = RecordLog(folder, segment_bytes)
        self._values: dict[str, bytes] = {}
        self._records = 0
        self.write_seconds = 0.0  # time spent appending and syncing, for the benchmark
        self.writes = 0
        self.compactions = 0
        for seq, payload in self._log.records():
            self._apply(seq, payload)

    def load(self) -> dict[str, bytes]:
        """The newest value of every key, as read at open and written since."""
        return dict(self._values)

    def __contains__(self, key: str) -> bool:
        return key in self._values

    def put(self, key: str, value: bytes, *, sync: bool = True) -> None:
        """Records ``value`` for ``key``; durable when this returns (unless ``sync=False``)."""
        self._append(key, value, 0, sync)
        self._values[key] = value

    def put_many(self, items: list[tuple[str, bytes]], *, sync: bool = True) -> None:
        """Records every ``(key, value)`` at once: after a crash, all of them or none."""
        if len(items) == 1:
            self.put(*items[0], sync=sync)
            return
        parts = []
        for key, value in items:
            record = _encode(key, value, 0)
            parts += [_LENGTH.pack(len(record)), record]
        self._append("", b"".join(parts), _BATCH, sync)
        self._values.update(items)

    def delete(self, key: str, *, sync: bool = True) -> None:
        if key in self._values:
            self._append(key, b"", _TOMBSTONE, sync)
            del self._values[key]

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
        self._records = len(self._values)
        self.compactions += 1
        _LOGGER.debug("journal %s compacted to %d records", self.folder, self._records)

    def close(self) -> None:
        self._log.close()

    def _append(self, key: str, value: bytes, flags: int, sync: bool) -> None:
        started = time.perf_counter()
        self._log.append(_encode(key, value, flags))
        if sync:
            self._log.sync()
        self._records += 1
        self.write_seconds += time.perf_counter() - started
        self.writes += 1
        if self._records > self.compact_ratio * max(len(self._values), 16):
            self.compact()

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
            self._values.pop(key, None)
        else:
            self._values[key] = payload[_HEAD.size + length:]
        self._records += 1


def _encode(key: str, value: bytes, flags: int) -> bytes:
    raw = key.encode("utf-8")
    return _HEAD.pack(len(raw), flags) + raw + value

"""The write-ahead log of a ``TcpLineSource``: one ``RecordLog`` shared by the receiver
thread (appends, each synced before it is acknowledged) and the operator's thread (reads
what it emits, deletes what was committed), with recent records kept in memory."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable

from weir.storage.records import RecordLog

__all__ = ["Wal", "has_line"]



class Wal:
    """The RecordLog shared by the receiver (appends) and the operator (reads, deletes).

    RecordLog is single-threaded, so every use holds the lock; an append and its sync
    happen under one hold, so the operator only ever reads synced records. Recent records
    are also kept in memory for the operator to emit without reading the disk.
    """

    def __init__(self, log: RecordLog, cache_bytes: int = 16 << 20) -> None:
        self.log = log
        self.cache_bytes = cache_bytes  # recent records in memory: emitting rarely reads disk
        self.folder = log.folder
        self.lock = threading.Lock()
        self._cache: deque[tuple[int, bytes, int]] = deque()  # (seq, payload, lines)
        self._cache_bytes = 0

    @property
    def first_seq(self) -> int:
        with self.lock:
            return self.log.first_seq

    @property
    def next_seq(self) -> int:
        with self.lock:
            return self.log.next_seq

    def append(self, payloads: list[bytes], before_sync: Callable[[], None]) -> None:
        """Appends and syncs ``payloads``; ``before_sync`` runs in between (crash tests)."""
        with self.lock:
            seqs = [self.log.append(p) for p in payloads]
            before_sync()
            self.log.sync()
            for seq, payload in zip(seqs, payloads, strict=True):
                if self._cache and self._cache[-1][0] + 1 != seq:
                    self._drop_cache()
                if self._cache_bytes + len(payload) <= self.cache_bytes:
                    self._cache.append((seq, payload, payload.count(b"\n")))
                    self._cache_bytes += len(payload)

    def take(self, position: int, max_lines: int) -> list[tuple[int, bytes]]:
        """Whole records from ``position`` holding about ``max_lines`` lines (at least one)."""
        with self.lock:
            if position >= self.log.next_seq:
                return []
            while self._cache and self._cache[0][0] < position:
                self._cache_bytes -= len(self._cache.popleft()[1])
            if self._cache and self._cache[0][0] == position:
                source = ((seq, payload) for seq, payload, _ in self._cache)
            else:
                source = self.log.records(position)
            taken, lines = [], 0
            for seq, payload in source:
                taken.append((seq, payload))
                lines += payload.count(b"\n")
                if lines >= max_lines:
                    break
            return taken

    def range(self, first: int, end: int) -> list[tuple[int, bytes]]:
        """Records ``[first, end)``, all of them or an error."""
        with self.lock:
            records = list(itertools.islice(self.log.records(first), end - first))
        if [seq for seq, _ in records] != list(range(first, end)):
            raise RuntimeError(f"the WAL in {self.folder} no longer holds records [{first}, "
                               f"{end}) that a window being replayed read")
        return records

    def contains_line(self, position: int, line: bytes) -> bool:
        """Whether a record from ``position`` on holds ``line`` (a line without its break)."""
        with self.lock:
            return any(has_line(payload, line) for _, payload in self.log.records(position))

    def delete_before(self, seq: int) -> int:
        with self.lock:
            return self.log.delete_before(seq)

    @property
    def segment_count(self) -> int:
        with self.lock:
            return self.log.segment_count

    def close(self) -> None:
        with self.lock:
            self.log.close()
            self._drop_cache()

    def _drop_cache(self) -> None:
        self._cache.clear()
        self._cache_bytes = 0


def has_line(payload: bytes, line: bytes) -> bool:
    return any(part.removesuffix(b"\r") == line for part in payload.split(b"\n"))

"""Buffer-server storage policy: spill files of message blocks, and the memory and disk budgets.

A stream that outgrows the memory budget moves its oldest messages to disk a block at a
time: one Arrow IPC file per block, holding the block's messages as envelope batches (the
wire form of ``container.stream_messages``): a batch is encoded when it is spilled, unless
it was already (served over Flight), and read back as those bytes. ``Budget`` counts the
messages' encoded bytes (``Message.nbytes``) held in memory and on disk against their
limits; the buffer server spills past the first and makes publishers wait past both.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from weir.container.stream_messages import ENVELOPE_SCHEMA, Message, from_envelope, to_envelope
from weir.proto import umbilical_pb2
from weir.storage.orphans import remove_orphans

__all__ = ["SPILL_BATCH_BYTES", "Budget", "SpillStore", "read_block", "write_block"]

_LOGGER = logging.getLogger(__name__)

SPILL_BATCH_BYTES = 8 << 20
"""Payload bytes per envelope batch in a spill file (one bigger message goes alone)."""


def write_block(path: Path, messages: Sequence[Message],
                batch_bytes: int = SPILL_BATCH_BYTES) -> None:
    """Writes messages to ``path`` as an Arrow IPC file of envelope batches."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, ENVELOPE_SCHEMA) as writer:
        start, size = 0, 0
        for i, message in enumerate(messages):
            if i > start and size + message.nbytes > batch_bytes:
                writer.write_batch(to_envelope(list(messages[start:i])))
                start, size = i, 0
            size += message.nbytes
        if start < len(messages):
            writer.write_batch(to_envelope(list(messages[start:])))


def read_block(path: Path) -> list[Message]:
    """The messages of a spill file, in order; payloads are zero-copy over a memory map."""
    reader = pa.ipc.open_file(pa.memory_map(str(path)))
    messages: list[Message] = []
    for i in range(reader.num_record_batches):
        messages.extend(from_envelope(reader.get_batch(i)))
    return messages


class SpillStore:
    """A buffer server's spill folder: created under ``parent`` (the system's temporary
    folder if None) on the first write, removed with everything in it by ``close()``."""

    def __init__(self, parent: str | os.PathLike[str] | None = None,
                 prefix: str = "weir-spill-") -> None:
        self._parent = None if parent is None else Path(parent)
        self._prefix = prefix
        self._path: Path | None = None
        self._lock = threading.Lock()
        self._names = itertools.count()
        self._closed = False

    @property
    def path(self) -> Path | None:
        """The folder, once something was spilled (None before)."""
        return self._path

    def _folder(self) -> Path:
        with self._lock:
            if self._closed:
                raise OSError("spill store closed")
            if self._path is None:
                parent = self._parent or Path(tempfile.gettempdir())
                parent.mkdir(parents=True, exist_ok=True)
                remove_orphans(parent, self._prefix)  # left by killed containers
                self._path = Path(tempfile.mkdtemp(prefix=f"{self._prefix}{os.getpid()}-",
                                                   dir=parent))
                _LOGGER.info("buffer server spills to %s", self._path)
            return self._path

    def write(self, tag: str, messages: Sequence[Message]) -> Path:
        """Writes one block to a new file named after ``tag``; returns its path."""
        path = self._folder() / f"{tag}-{next(self._names):08d}.arrow"
        try:
            write_block(path, messages)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return path

    @staticmethod
    def delete(path: Path) -> None:
        """Removes a block file (readers that have it mapped keep their view)."""
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            _LOGGER.warning("cannot remove spill file %s: %s", path, exc)

    def close(self) -> None:
        """Removes the folder and every block in it; later writes fail (idempotent)."""
        with self._lock:
            self._closed = True
            path, self._path = self._path, None
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
            _LOGGER.debug("spill folder %s removed", path)


class Budget:
    """Payload bytes held in memory and on disk, against their limits, and publisher waits.

    Every field is guarded by ``cond``, which is notified whenever room is freed. Memory
    is reserved before a message is stored; a reservation always succeeds when nothing is
    held in memory, so one message bigger than the whole budget still goes through.
    """

    def __init__(self, memory_limit: int, disk_limit: int) -> None:
        self.cond = threading.Condition()
        self.memory_limit = memory_limit
        self.disk_limit = disk_limit
        self.memory = 0
        self.disk = 0
        self.blocks_spilled = 0
        self.blocks_read = 0
        self.waits = 0
        self.wait_s = 0.0
        self.waiting = 0

    def stats(self) -> umbilical_pb2.BufferServerStats:
        """The figures the heartbeat reports."""
        with self.cond:
            return umbilical_pb2.BufferServerStats(
                memory_limit_bytes=self.memory_limit, memory_bytes=self.memory,
                disk_bytes=self.disk, blocks_spilled=self.blocks_spilled)

    def fits_locked(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit in memory (call with ``cond`` held)."""
        return self.memory == 0 or self.memory + nbytes <= self.memory_limit

    def reserve_memory(self, nbytes: int) -> bool:
        """Reserves ``nbytes`` of memory if they fit; returns whether they did."""
        with self.cond:
            if not self.fits_locked(nbytes):
                return False
            self.memory += nbytes
            return True

    def disk_room(self) -> int:
        with self.cond:
            return max(self.disk_limit - self.disk, 0)

    def reserve_disk(self, nbytes: int) -> bool:
        """Reserves ``nbytes`` of disk if they fit within the limit."""
        with self.cond:
            if self.disk + nbytes > self.disk_limit:
                return False
            self.disk += nbytes
            return True

    def release(self, memory: int = 0, disk: int = 0) -> None:
        """Frees memory and disk bytes and wakes waiting publishers."""
        if memory or disk:
            with self.cond:
                self.memory -= memory
                self.disk -= disk
                self.cond.notify_all()

    def spilled(self, nbytes: int) -> None:
        """A block of ``nbytes`` (disk already reserved) left memory."""
        with self.cond:
            self.memory -= nbytes
            self.blocks_spilled += 1
            self.cond.notify_all()

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

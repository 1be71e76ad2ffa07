"""One stream's retained messages: what a buffer server keeps for its subscribers.

Messages are addressed by absolute sequence numbers, so purging the front (the committed
windows) or rewinding the back (a publisher restarted from its checkpoint) never
invalidates a subscriber's position (its ``Cursor``). A stream is a run of spilled blocks
(oldest first, ``container.spill``) followed by the messages still in memory. It knows
its *floor*: the windows it cannot serve (purged, or before the checkpoint its publisher
restarted from into an empty stream); a subscriber that needs them fails (``WindowGap``).
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa

from weir.container.spill import Budget, SpillStore
from weir.container.stream_messages import Kind, Message, WindowGap
from weir.operators.watermarks import NO_WATERMARK
from weir.operators.windows import format_window_id

__all__ = [
    "LATEST_WINDOW",
    "MAX_BLOCK_BYTES",
    "Block",
    "Cursor",
    "RetainedStream",
    "SpillResult",
    "BufferStats",
    "StreamStats",
]

_LOGGER = logging.getLogger(__name__)

MAX_BLOCK_BYTES = 32 << 20
"""Largest default spill block (the default is an eighth of the memory budget, up to this)."""

@dataclasses.dataclass(frozen=True, slots=True)
class BufferStats:
    """A buffer server's totals over all streams, its budgets and its publishers' waits.

    Bytes are payload bytes. ``blocks_spilled`` and ``blocks_read`` count since start;
    ``publisher_wait_s`` is the total time publishers spent blocked for room.
    """

    streams: int
    messages: int
    memory_bytes: int
    disk_bytes: int
    memory_budget_bytes: int
    disk_budget_bytes: int
    blocks_on_disk: int
    blocks_spilled: int
    blocks_read: int
    publisher_waits: int
    publisher_wait_s: float
    publishers_waiting: int


class StreamStats(NamedTuple):
    """One stream's retained messages and their payload bytes in memory and on disk."""

    messages: int
    memory_bytes: int
    disk_bytes: int


def _window_of(message: Message) -> int:
    return message.window_id


@dataclasses.dataclass(eq=False, slots=True)
class Block:
    """Messages moved to a spill file: the file's rows have sequence numbers ``seq0 …``,
    of which ``[start, end)`` are still retained (purge and rewind move the bounds)."""

    path: Path
    seq0: int
    windows: list[int]
    nbytes: int
    start: int
    end: int

    def after(self, window_id: int) -> int:
        """The first retained sequence number of a window > ``window_id`` (``end`` if none)."""
        return self.seq0 + bisect.bisect_right(self.windows, window_id, self.start - self.seq0,
                                               self.end - self.seq0)


def _block_end(block: Block) -> int:
    return block.end


class SpillResult(enum.Enum):
    SPILLED = "spilled"
    BUSY = "busy"  # a spill of this stream is under way
    NOTHING = "nothing"  # no payload bytes to move
    NO_DISK = "no disk"  # the disk budget (or the disk) has no room for the oldest message


LATEST_WINDOW = -2
"""``from_window`` of a subscriber that wants no replay: windows after the newest one."""


@dataclasses.dataclass(slots=True)
class Cursor:
    """A subscription's position: the next sequence number to read (None: not placed yet)
    and the last window it was given whole (``from_window`` before any)."""

    from_window: int
    seq: int | None = None
    rewinds_seen: int = 0
    latest: bool = False  # skip to the newest window (never to one at or before from_window)
    generation: int = 0  # the publisher's generation it reads (0: any)
    position: int = -1
    checked: bool = True  # windows it needs must be there (not a latest cursor)


class RetainedStream:
    """One stream's retained messages: spilled ``blocks`` then in-memory ``messages``.

    Every field is guarded by ``cond``. Messages are kept in publishing order with
    non-decreasing window ids; the blocks' retained ranges and the memory part are
    contiguous, ``first_seq`` being the sequence number of ``messages[0]``. END_STREAM,
    once published, is the last message, stays in memory and survives purges so late
    subscribers still see the end. ``budget`` is the server's; memory for an appended
    message is reserved by its publisher, and freed here.
    """

    def __init__(self, stream_id: str, index: int = 0, budget: Budget | None = None,
                 store: SpillStore | None = None, block_bytes: int = MAX_BLOCK_BYTES) -> None:
        self.stream_id = stream_id
        self.index = index
        self.budget = budget if budget is not None else Budget(1 << 62, 0)
        self.store = store
        self.block_bytes = block_bytes
        self.cond = threading.Condition()
        self.blocks: list[Block] = []
        self.messages: list[Message] = []
        self.first_seq = 0
        self.memory_bytes = 0
        self.disk_bytes = 0
        self.last_window: int | None = None
        self.ended = False
        self.spilling = False
        self.suspended = False  # its publisher was undeployed; a successor will rewind it
        self.rewinds: list[int] = []  # the end sequence number after each rewind
        # windows <= floor are not served: purged (committed), or never published here (a
        # publisher restarted from a checkpoint into an empty stream starts after it)
        self.floor = -1
        self.generation = 0  # its publisher's (0: not given); an older one cannot publish
        self.idle_subscribers = 0  # subscriptions placed, given all there is, waiting for more

    @property
    def end_seq(self) -> int:
        return self.first_seq + len(self.messages)

    @property
    def start_seq(self) -> int:
        return self.blocks[0].start if self.blocks else self.first_seq

    def stats(self) -> StreamStats:
        with self.cond:
            return StreamStats(self.end_seq - self.start_seq, self.memory_bytes, self.disk_bytes)

    def check(self, message: Message) -> None:
        """Raises ValueError if ``message`` cannot follow the stream's last one."""
        if self.ended:
            raise ValueError(f"stream {self.stream_id!r}: {message.kind.name} published "
                             "after END_STREAM")
        if self.last_window is not None and message.window_id < self.last_window:
            raise ValueError(
                f"stream {self.stream_id!r}: {message.kind.name} of window "
                f"{message.window_id} after window {self.last_window}: windows must not "
                "go back (restart the publisher with from_window to republish)")

    def append(self, message: Message) -> None:
        with self.cond:
            self.check(message)
            self.messages.append(message)
            self.memory_bytes += message.nbytes
            self.last_window = message.window_id
            if message.kind == Kind.END_STREAM:
                self.ended = True
            self.cond.notify_all()

    def end(self, watermark: int = NO_WATERMARK) -> None:
        """Appends END_STREAM, stamped with the last window published (-1 if none); a
        ``watermark`` says the stream stopped for a savepoint there (it did not end)."""
        with self.cond:
            window = -1 if self.last_window is None else self.last_window
            self.append(Message(Kind.END_STREAM, window, watermark=watermark))

    def _wait_for_spill(self) -> None:
        while self.spilling:
            self.cond.wait()

    def purge(self, window_id: int) -> int:
        """Drops the messages of windows <= ``window_id`` (END_STREAM stays) and the spill
        files wholly at or before it; returns the count of messages dropped."""
        files: list[Path] = []
        with self.cond:
            self._wait_for_spill()
            self.floor = max(self.floor, window_id)
            dropped = freed_memory = freed_disk = 0
            while self.blocks:
                block = self.blocks[0]
                cut = block.after(window_id)
                dropped += cut - block.start
                if cut < block.end:  # later messages, in memory too, are of later windows
                    block.start = cut
                    break
                self.blocks.pop(0)
                files.append(block.path)
                freed_disk += block.nbytes
            else:
                count = bisect.bisect_right(self.messages, window_id, key=_window_of)
                if self.ended:
                    count = min(count, len(self.messages) - 1)
                if count > 0:
                    freed_memory = sum(m.nbytes for m in self.messages[:count])
                    del self.messages[:count]
                    self.first_seq += count
                    dropped += count
            self.memory_bytes -= freed_memory
            self.disk_bytes -= freed_disk
        self._free(files, freed_memory, freed_disk)
        return dropped

    def rewind(self, window_id: int) -> int:
        """Drops the messages of windows > ``window_id`` and END_STREAM; returns count."""
        files: list[Path] = []
        with self.cond:
            self._wait_for_spill()
            keep = bisect.bisect_right(self.messages, window_id, key=_window_of)
            if self.ended and keep == len(self.messages):
                keep -= 1
            dropped = len(self.messages) - keep
            freed_memory = sum(m.nbytes for m in self.messages[keep:])
            freed_disk = 0
            del self.messages[keep:]
            tail = self.first_seq
            while not self.messages and self.blocks:
                block = self.blocks[-1]
                cut = block.after(window_id)
                if cut == block.end:
                    break
                dropped += block.end - cut
                tail = cut
                if cut > block.start:
                    block.end = cut  # the file keeps its rows; they are no longer retained
                    break
                self.blocks.pop()
                files.append(block.path)
                freed_disk += block.nbytes
            self.first_seq = tail
            self.memory_bytes -= freed_memory
            self.disk_bytes -= freed_disk
            self.ended = False
            if self.messages:
                self.last_window = self.messages[-1].window_id
            elif self.blocks:
                block = self.blocks[-1]
                self.last_window = block.windows[block.end - block.seq0 - 1]
            else:
                self.last_window = None
                self.floor = max(self.floor, window_id)  # nothing up to it was published here
            self.rewinds.append(self.end_seq)
            self.cond.notify_all()
        self._free(files, freed_memory, freed_disk)
        return dropped

    def _free(self, files: list[Path], memory: int, disk: int) -> None:
        for path in files:
            SpillStore.delete(path)
        self.budget.release(memory, disk)

    def spill(self) -> SpillResult:
        """Moves the oldest in-memory messages (about ``block_bytes`` of payload) to a spill
        file, without holding ``cond`` while writing."""
        with self.cond:
            if self.spilling:
                return SpillResult.BUSY
            if self.store is None:
                return SpillResult.NOTHING
            limit = len(self.messages) - (1 if self.ended else 0)  # END_STREAM stays
            room = self.budget.disk_room()
            count = size = 0
            no_room = False
            while count < limit and size < self.block_bytes:
                nbytes = self.messages[count].nbytes
                if size + nbytes > room:
                    no_room = True
                    break
                count += 1
                size += nbytes
            if size == 0:
                return SpillResult.NO_DISK if no_room else SpillResult.NOTHING
            if not self.budget.reserve_disk(size):
                return SpillResult.NO_DISK
            self.spilling = True
            batch = self.messages[:count]
            seq0 = self.first_seq
        try:
            path = self.store.write(f"s{self.index}", batch)
        except BaseException as exc:
            self.budget.release(disk=size)
            with self.cond:
                self.spilling = False
                self.cond.notify_all()
            if not isinstance(exc, (OSError, pa.ArrowException)):
                raise
            _LOGGER.warning("stream %s: cannot spill %d bytes: %s", self.stream_id, size, exc)
            return SpillResult.NO_DISK
        with self.cond:
            # purge and rewind wait for the spill: the memory part still starts at seq0
            self.blocks.append(Block(path, seq0, [m.window_id for m in batch], size, seq0,
                                      seq0 + count))
            del self.messages[:count]
            self.first_seq += count
            self.memory_bytes -= size
            self.disk_bytes += size
            self.spilling = False
            self.cond.notify_all()
        self.budget.spilled(size)
        _LOGGER.debug("stream %s: spilled %d messages (%d bytes) to %s", self.stream_id, count,
                      size, path)
        return SpillResult.SPILLED

    def _locate(self, from_window: int) -> int:
        """The sequence number of the first message of a window > ``from_window``."""
        for block in self.blocks:
            seq = block.after(from_window)
            if seq < block.end:
                return seq
        seq = self.first_seq + bisect.bisect_right(self.messages, from_window, key=_window_of)
        if self.ended:
            seq = min(seq, self.end_seq - 1)
        return seq

    def take(self, cursor: Cursor, max_bytes: int,
             loaded: Mapping[Block, list[Message]] | None = None,
             ) -> tuple[list[Message], Block | None]:
        """The next messages for ``cursor`` (at most ``max_bytes`` of payload unless one
        message is bigger), advancing it. Spilled messages come from ``loaded`` (a block's
        rows as read back); when the next one is in a block not loaded and nothing was
        taken, that block is returned to be loaded. Call with ``cond`` held."""
        if self.suspended:  # what follows may be rewound: serve nothing until it is
            return [], None
        if cursor.generation and cursor.generation != self.generation:
            return [], None  # another deployment publishes: wait for the one it reads
        if cursor.seq is None:
            if cursor.latest or cursor.from_window == LATEST_WINDOW:  # windows from now on
                newest = self.last_window if self.last_window is not None else -1
                cursor.from_window = max(cursor.from_window, newest)
                cursor.checked = False
            cursor.seq = self._locate(cursor.from_window)
            cursor.rewinds_seen = len(self.rewinds)
            cursor.position = cursor.from_window
        elif cursor.rewinds_seen < len(self.rewinds):
            cursor.seq = min(cursor.seq, *self.rewinds[cursor.rewinds_seen:])
            cursor.rewinds_seen = len(self.rewinds)
        if cursor.checked and cursor.position < self.floor:
            needed = ("from the stream's start" if cursor.position < 0
                      else f"after {format_window_id(cursor.position)}")
            raise WindowGap(f"stream {self.stream_id!r} holds only the windows after "
                            f"{format_window_id(self.floor)}, but the subscriber needs every "
                            f"window {needed}")
        seq = max(cursor.seq, self.start_seq)  # purged messages are skipped
        out: list[Message] = []
        size = 0
        if seq < self.first_seq:
            index = bisect.bisect_right(self.blocks, seq, key=_block_end)
            for block in self.blocks[index:]:
                rows = None if loaded is None else loaded.get(block)
                if rows is None:
                    cursor.seq = seq
                    return out, None if out else block
                while seq < block.end:
                    message = rows[seq - block.seq0]
                    if out and size + message.nbytes > max_bytes:
                        cursor.seq = seq
                        return out, None
                    seq += 1
                    if message.window_id > cursor.from_window:
                        out.append(message)
                        size += message.nbytes
                        if message.kind == Kind.END_WINDOW:
                            cursor.position = message.window_id
        index = seq - self.first_seq
        while index < len(self.messages):
            message = self.messages[index]
            if out and size + message.nbytes > max_bytes:
                break
            index += 1
            if message.window_id <= cursor.from_window and message.kind != Kind.END_STREAM:
                continue
            out.append(message)
            size += message.nbytes
            if message.kind == Kind.END_WINDOW:
                cursor.position = message.window_id
        cursor.seq = self.first_seq + index
        return out, None

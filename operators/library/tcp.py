"""A push source with a write-ahead log: lines sent over TCP, acknowledged once durable.

Senders cannot be asked to send again, so what they push must be durable before they are
told it arrived (Spark Streaming's receiver write-ahead log). A background thread receives
lines, appends them to a ``RecordLog`` in the operator's durable folder, syncs it and only
then acknowledges; the operator's thread emits from that log, window by window, and a
recovered operator re-reads its windows from it. Segments are deleted once every window
that read them is committed.

Protocol (one TCP connection, up to ``max_connections`` at once): the sender writes UTF-8
lines ending in ``\\n`` (a trailing ``\\r`` is dropped); the source answers ``ACK <n>\\n``
where ``n`` is the number of lines of this connection that are durable so far
(cumulative). A line without its ``\\n`` when the connection closes was never acknowledged
and is dropped. Invalid UTF-8 or a line longer than ``max_line_bytes`` gets
``ERR <reason>\\n`` and the connection is closed (the lines before it stay acknowledged).
A sender connecting while ``max_connections`` others are gets ``ERR too many
connections...`` and is closed before anything is read (it may connect again later).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, ClassVar

import pyarrow as pa

from weir.operators.library.sources import LINE_SCHEMA
from weir.operators.library.tcp_receiver import (
    Receiver,
    encode_end,
    listen,
    register_writer,
    stop_writer_of,
)
from weir.operators.library.tcp_wal import Wal
from weir.operators.metrics import metric
from weir.operators.operator import OperatorContext
from weir.operators.ports import OutputPort
from weir.storage.records import RecordLog
from weir.storage.replayable import ReplayableSource, take_committed

__all__ = ["TcpLineSource"]

_LOGGER = logging.getLogger(__name__)



class TcpLineSource(ReplayableSource):
    """Listens on a TCP address and emits every acknowledged line exactly once downstream.

    Use it to take lines from systems that push (log shippers, devices, scripts): each
    line is in the write-ahead log (``<state folder>/wal``) and synced before the sender
    gets its ``ACK``, so a container killed at any moment loses no acknowledged line: the
    recovered source re-emits the windows it had read identically (window log) and then
    the lines it had logged but not yet emitted. See the module docs for the protocol.

    Recovery binds the same address again, so give a fixed ``port``: with ``port=0`` the
    system picks a free port (``bound_port`` tells which) and a recovered source would
    listen elsewhere. Needs a local ``STATE_DIR``.

    The stream is unbounded unless ``end_line`` is given: the first line equal to it
    (from any connection) ends the stream: the lines logged before it are emitted, it is
    not; the source stops taking input once it logged it (later lines of that chunk are
    neither logged nor acknowledged, the connections are closed).

    Args:
        port: TCP port to listen on (0 = any free port; not for recoverable apps).
        host: address to listen on.
        end_line: a line that ends the stream (None = never ends).
        batch_lines: lines per emitted batch at most (a window may hold many batches).
        segment_bytes: size of a WAL segment; whole segments are deleted when committed.
        max_line_bytes: a longer line is refused (the connection is closed).
        max_wal_bytes: the write-ahead log's bound while commits stall (downstream slow
            or stuck): past it the source stops reading senders (TCP holds them back,
            nothing is lost or refused) until commits delete segments.
        cache_bytes: the newest logged lines kept in memory too, so that emitting them
            rarely reads the disk.
        bind_retry_s: how long a port in use is tried again before setup fails (a
            predecessor in this process may still hold it).
        max_connections: the most senders connected at once; one more is refused (``ERR``,
            closed) and counted (metric ``connections_refused``), so that nobody able to
            connect can take every file descriptor of the container. A setting of the
            deployment: a restore does not bring back an earlier value.

    Example:
        >>> src = TcpLineSource(port=7070, end_line="EOF")
        >>> src.output.spec.schema
        line: string
    """

    output = OutputPort(LINE_SCHEMA)

    SETTINGS: ClassVar[tuple[str, ...]] = ("max_connections",)
    NON_STATE: ClassVar[tuple[str, ...]] = ReplayableSource.NON_STATE + SETTINGS + (
        "_wal", "_receiver", "_ends", "_context")

    def __init__(self, port: int, host: str = "127.0.0.1", end_line: str | None = None,
                 batch_lines: int = 10_000, segment_bytes: int = 1 << 20,
                 max_line_bytes: int = 1 << 20, max_wal_bytes: int = 1 << 30,
                 cache_bytes: int = 16 << 20, bind_retry_s: float = 5.0,
                 max_connections: int = 128) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, not {port}")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) \
                or max_connections < 1:
            raise ValueError(f"max_connections must be a positive integer (the most senders "
                             f"connected at once), not {max_connections!r}")
        if batch_lines <= 0 or segment_bytes <= 0 or max_line_bytes <= 0:
            raise ValueError("batch_lines, segment_bytes and max_line_bytes must be positive")
        if max_wal_bytes < 2 * segment_bytes:
            raise ValueError(f"max_wal_bytes ({max_wal_bytes}) must hold two segments "
                             f"(2 x segment_bytes = {2 * segment_bytes})")
        if end_line is not None and ("\n" in end_line or "\r" in end_line):
            raise ValueError(f"end_line must be one line, not {end_line!r}")
        self.host = host
        self.port = port
        self.end_line = end_line
        self.batch_lines = batch_lines
        self.segment_bytes = segment_bytes
        self.max_line_bytes = max_line_bytes
        self.max_wal_bytes = max_wal_bytes
        self.cache_bytes = cache_bytes
        self.bind_retry_s = bind_retry_s
        self.max_connections = max_connections
        self.position = 0  # the next WAL sequence number to emit
        self.lines_emitted = 0
        self.ended = False
        self._window_first = 0
        self.reset_non_state()

    @property
    def bound_port(self) -> int:
        """The port actually listened on (useful with ``port=0``); 0 when not listening."""
        receiver = self.__dict__.get("_receiver")
        return receiver.port if receiver is not None else 0

    @metric
    def connections(self) -> int:
        """Senders connected now."""
        receiver = self.__dict__.get("_receiver")
        return receiver.connection_count if receiver is not None else 0

    @metric
    def connections_refused(self) -> int:
        """Senders refused since setup: ``max_connections`` others were connected."""
        receiver = self.__dict__.get("_receiver")
        return receiver.refused if receiver is not None else 0

    # -- runtime hooks -----------------------------------------------------------------
    def setup(self, context: OperatorContext) -> None:
        super().setup(context)
        self._context = context
        folder = context.durable_dir("wal")
        stop_writer_of(folder)  # a predecessor in this process (undeployed, not torn down)
        end = encode_end(self.end_line)
        # the port is the mutex between processes: the log is opened only once it is ours
        server = listen(context.name, self.host, self.port, self.bind_retry_s)
        try:
            self._wal = Wal(RecordLog(folder, self.segment_bytes, guard=context.check_fence),
                            self.cache_bytes)
            self._check_position(context)
            input_complete = end is not None and self._wal.contains_line(self.position, end)
        except BaseException:
            server.close()
            raise
        self._ends = {context.recovered_window: self.position} \
            if context.recovered_window >= 0 else {}
        if input_complete:
            server.close()
            _LOGGER.info("operator %s: the WAL already holds the end line %r: taking no more "
                         "input", context.name, self.end_line)
            return
        self._receiver = Receiver(server, self._wal, end, self.max_line_bytes,
                                   context.crash_point, threading.current_thread(),
                                   context.name,
                                   max_segments=self.max_wal_bytes // self.segment_bytes,
                                   max_connections=self.max_connections)
        register_writer(folder, self._receiver)
        self._receiver.start()
        _LOGGER.info("operator %s listens on %s:%d, WAL %s from record %d", context.name,
                     self.host, self._receiver.port, folder, self.position)

    def begin_window(self, window_id: int) -> None:
        super().begin_window(window_id)
        self._window_first = self.position

    def end_window(self) -> None:
        super().end_window()
        if self._window_id >= 0:
            self._ends[self._window_id] = self.position

    def teardown(self) -> None:
        super().teardown()
        receiver = self.__dict__.get("_receiver")
        if receiver is not None:
            receiver.stop()
            self._receiver = None
        wal = self.__dict__.get("_wal")
        if wal is not None:
            wal.close()

    # -- ReplayableSource --------------------------------------------------------------
    def read(self, limit: Any | None) -> bool:
        """Emits WAL records from ``position``: what is there (None) or ``[first, end)``."""
        receiver = self._receiver
        if receiver is not None and receiver.error is not None:
            raise RuntimeError(f"TcpLineSource {self._name}: writing the WAL failed: "
                               f"{receiver.error}") from receiver.error
        if self.ended:
            return False
        assert self._wal is not None, "setup() was not called"
        if limit is None:
            return self._emit(self._wal.take(self.position, self.batch_lines))
        first, end = int(limit[0]), int(limit[1])
        if first != self.position:
            raise RuntimeError(
                f"TcpLineSource {self._name}: the window log replays WAL records "
                f"[{first}, {end}) but the restored read position is {self.position}; the "
                "window log and the checkpoint do not belong together")
        return self._emit(self._wal.range(first, end))

    def window_record(self) -> list[int]:
        return [self._window_first, self.position]

    def release(self, window_id: int) -> None:
        """Deletes the WAL segments that only windows up to ``window_id`` read."""
        position = take_committed(self._ends, window_id)
        if position is None or self._wal is None:
            return
        deleted = self._wal.delete_before(position)
        if deleted:
            _LOGGER.debug("operator %s: deleted %d WAL segments before record %d", self._name,
                          deleted, position)

    # -- pickling: only state travels (deploy payloads, checkpoints) ---------------------
    def reset_non_state(self) -> None:
        super().reset_non_state()
        self._wal: Wal | None = None
        self._receiver: Receiver | None = None
        self._ends: dict[int, int] = {}
        self._context: OperatorContext | None = None

    # -- helpers -----------------------------------------------------------------------
    @property
    def _name(self) -> str:
        context = self.__dict__.get("_context")
        return repr(context.name) if context is not None else ""

    def _check_position(self, context: OperatorContext) -> None:
        assert self._wal is not None
        first, next_seq = self._wal.first_seq, self._wal.next_seq
        if self.position > next_seq:
            raise RuntimeError(
                f"TcpLineSource {context.name!r}: the checkpoint read up to WAL record "
                f"{self.position} but the WAL in {self._wal.folder} ends at record {next_seq}: "
                "it lost synced records (removed or replaced folder?)")
        if self.position < first:
            if context.recovered_window >= 0:
                raise RuntimeError(
                    f"TcpLineSource {context.name!r}: the checkpoint resumes at WAL record "
                    f"{self.position} but the WAL in {self._wal.folder} starts at record "
                    f"{first}: records that were never committed were deleted")
            self.position = first
        if context.recovered_window < 0 and next_seq > self.position:
            _LOGGER.warning("operator %s starts without a checkpoint but its WAL %s holds %d "
                            "records (of an instance that died before its first checkpoint, "
                            "or of an earlier run): they are emitted first", context.name,
                            self._wal.folder, next_seq - self.position)

    def _emit(self, records: list[tuple[int, bytes]]) -> bool:
        """Emits the lines of ``records`` (whole records) and moves ``position`` past them;
        False once the end line came."""
        lines: list[str] = []
        for seq, payload in records:
            text = payload.decode("utf-8")[:-1]  # valid and \n-terminated: checked on receipt
            if "\r" in text:
                record_lines = [line.removesuffix("\r") for line in text.split("\n")]
            else:
                record_lines = text.split("\n")
            if self.end_line is not None and self.end_line in record_lines:
                lines.extend(record_lines[:record_lines.index(self.end_line)])
                self.position = seq + 1
                self.ended = True
                break
            lines.extend(record_lines)
            self.position = seq + 1
        for start in range(0, len(lines), self.batch_lines):
            part = lines[start:start + self.batch_lines]
            self.output.emit(pa.record_batch([pa.array(part, pa.string())], schema=LINE_SCHEMA))
        self.lines_emitted += len(lines)
        return not self.ended

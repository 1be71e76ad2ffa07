"""A push source with a write-ahead log: lines sent over TCP, acknowledged once durable.

Senders cannot be asked to send again, so what they push must be durable before they are
told it arrived (Spark Streaming's receiver write-ahead log). A background thread receives
lines, appends them to a ``RecordLog`` in the operator's durable folder, syncs it and only
then acknowledges; the operator's thread emits from that log, window by window, and a
recovered operator re-reads its windows from it. Segments are deleted once every window
that read them is committed.

Protocol (one TCP connection, any number at once): the sender writes UTF-8 lines ending in
``\\n`` (a trailing ``\\r`` is dropped); the source answers ``ACK <n>\\n`` where ``n`` is the
number of lines of this connection that are durable so far (cumulative). A line without
its ``\\n`` when the connection closes was never acknowledged and is dropped. Invalid UTF-8
or a line longer than ``max_line_bytes`` gets ``ERR <reason>\\n`` and the connection is
closed (the lines before it stay acknowledged).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

import pyarrow as pa

from operators.durable.records import RecordLog
from operators.durable.replayable import ReplayableSource
from operators.library.sources import LINE_SCHEMA
from operators.operator import OperatorContext
from operators.ports import OutputPort

__all__ = ["TcpLineSource"]

_LOGGER = logging.getLogger(__name__)

_RECV_BYTES = 256 << 10
_POLL_S = 0.1  # how often the receiver checks that it should still run
_CACHE_BYTES = 16 << 20  # recent records kept in memory, so emitting rarely reads the disk
_BIND_RETRY_S = 5.0  # a predecessor in this process may still hold the port this long

_WRITERS: dict[str, _Receiver] = {}  # WAL folder -> the receiver writing it, in this process
_WRITERS_LOCK = threading.Lock()


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

    Example:
        >>> src = TcpLineSource(port=7070, end_line="EOF")
        >>> src.output.spec.schema
        line: string
    """

    output = OutputPort(LINE_SCHEMA)

    NON_STATE: ClassVar[tuple[str, ...]] = ReplayableSource.NON_STATE + (
        "_wal", "_receiver", "_ends", "_context")

    def __init__(self, port: int, host: str = "127.0.0.1", end_line: str | None = None,
                 batch_lines: int = 10_000, segment_bytes: int = 1 << 20,
                 max_line_bytes: int = 1 << 20, max_wal_bytes: int = 1 << 30) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, not {port}")
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

    # -- runtime hooks -----------------------------------------------------------------
    def setup(self, context: OperatorContext) -> None:
        super().setup(context)
        self._context = context
        folder = context.durable_dir("wal")
        _stop_writer_of(folder)  # a predecessor in this process (undeployed, not torn down)
        end = _encode_end(self.end_line)
        # the port is the mutex between processes: the log is opened only once it is ours
        server = _listen(context.name, self.host, self.port)
        try:
            self._wal = _Wal(RecordLog(folder, self.segment_bytes, guard=context.check_fence))
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
        self._receiver = _Receiver(server, self._wal, end, self.max_line_bytes,
                                   context.crash_point, threading.current_thread(),
                                   context.name,
                                   max_segments=self.max_wal_bytes // self.segment_bytes)
        with _WRITERS_LOCK:
            _WRITERS[folder] = self._receiver
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
        known = [w for w in self._ends if w <= window_id]
        if not known or self._wal is None:
            return
        newest = max(known)
        position = self._ends[newest]
        for w in known:
            if w != newest:
                del self._ends[w]
        deleted = self._wal.delete_before(position)
        if deleted:
            _LOGGER.debug("operator %s: deleted %d WAL segments before record %d", self._name,
                          deleted, position)

    # -- pickling: only state travels (deploy payloads, checkpoints) ---------------------
    def reset_non_state(self) -> None:
        super().reset_non_state()
        self._wal: _Wal | None = None
        self._receiver: _Receiver | None = None
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


class _Wal:
    """The RecordLog shared by the receiver (appends) and the operator (reads, deletes).

    RecordLog is single-threaded, so every use holds the lock; an append and its sync
    happen under one hold, so the operator only ever reads synced records. Recent records
    are also kept in memory for the operator to emit without reading the disk.
    """

    def __init__(self, log: RecordLog) -> None:
        self.log = log
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
                if self._cache_bytes + len(payload) <= _CACHE_BYTES:
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
            return any(_has_line(payload, line) for _, payload in self.log.records(position))

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


class _Connection:
    """One sender: bytes received but not yet logged, lines acknowledged, ACKs to send."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.inbox = bytearray()
        self.outbox = bytearray()
        self.acked = 0
        self.eof = False
        self.closing = False  # refused: send what is queued, then close


class _Receiver:
    """The background thread: accepts senders, logs their complete lines, acknowledges.

    A daemon thread that also ends when the operator's thread is gone (the runtime stops an
    undeployed operator without ``teardown``), so it never outlives its operator by more
    than ``_POLL_S`` nor keeps the port from a successor.
    """

    def __init__(self, server: socket.socket, wal: _Wal, end: bytes | None,
                 max_line_bytes: int, crash_point: Callable[[str], None],
                 owner: threading.Thread, name: str, max_segments: int = 1 << 30) -> None:
        self.server = server
        self.port = server.getsockname()[1]
        self.wal = wal
        self.end = end
        self.max_line_bytes = max_line_bytes
        self.crash_point = crash_point
        self.owner = owner
        self.name = name
        self.max_segments = max_segments
        self.paused = False  # the WAL is full: senders are not read
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._connections: dict[int, _Connection] = {}
        self._thread = threading.Thread(target=self._run, name=f"tcp-wal-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        self._selector.register(self.server, selectors.EVENT_READ)
        try:
            while not self._stop.is_set() and self.owner.is_alive():
                self._pause_while_full()
                ready: list[_Connection] = []
                for key, mask in self._selector.select(timeout=_POLL_S):
                    if key.fileobj is self.server:
                        self._accept()
                        continue
                    connection = key.data
                    if mask & selectors.EVENT_WRITE:
                        self._flush(connection)
                    if mask & selectors.EVENT_READ:
                        self._receive(connection)
                        ready.append(connection)
                if ready and self._log(ready):
                    break  # the end line is logged: no more input
        except Exception as exc:  # noqa: BLE001 - the operator's thread reports it
            self.error = exc
            _LOGGER.error("operator %s: the TCP receiver stopped: %s", self.name, exc)
        finally:
            self._shut_down()

    def _pause_while_full(self) -> None:
        """Stops reading senders while the WAL holds ``max_segments`` (commits stalled),
        and reads them again once commits deleted some: TCP's own flow control holds the
        senders back meanwhile, so nothing is refused or lost."""
        full = self.wal.segment_count >= self.max_segments
        if full == self.paused:
            return
        self.paused = full
        if full:
            _LOGGER.warning("operator %s: the write-ahead log holds %d segments, its bound; "
                            "senders wait until commits free some", self.name,
                            self.max_segments)
        else:
            _LOGGER.info("operator %s: commits freed write-ahead log segments; reading "
                         "senders again", self.name)
        for connection in list(self._connections.values()):
            self._flush(connection)  # registers each for reading, or not

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self.server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionError:  # the sender gave up before we accepted
                continue
            sock.setblocking(False)
            connection = _Connection(sock, f"{peer[0]}:{peer[1]}")
            self._connections[sock.fileno()] = connection
            self._watch(connection, 0 if self.paused else selectors.EVENT_READ)

    def _receive(self, connection: _Connection) -> None:
        try:
            data = connection.sock.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            connection.inbox += data
        else:
            connection.eof = True

    def _log(self, ready: list[_Connection]) -> bool:
        """Logs the complete lines of ``ready``, syncs, then acknowledges; True once the
        end line is logged."""
        chunks: list[tuple[_Connection, bytes]] = []
        problems: dict[int, str] = {}
        ended = False
        for connection in ready:
            if connection.closing:
                continue
            cut = connection.inbox.rfind(b"\n")
            data, problem = self._check(bytes(connection.inbox[:cut + 1]), connection)
            del connection.inbox[:cut + 1]
            if ended:
                data = b""  # the end line came from another sender: refuse the rest
            elif self.end is not None and data:
                data, ended = _cut_after_end(data, self.end)
            if data:
                chunks.append((connection, data))
            if problem:
                problems[id(connection)] = problem
        if chunks:
            self.wal.append([data for _, data in chunks],
                            lambda: self.crash_point("wal.appended"))
            for connection, data in chunks:  # durable: now the sender may know
                connection.acked += data.count(b"\n")
                connection.outbox += f"ACK {connection.acked}\n".encode()
        for connection in ready:
            problem = problems.get(id(connection))
            if problem:
                _LOGGER.warning("operator %s: closing the connection from %s: %s", self.name,
                                connection.peer, problem)
                connection.outbox += f"ERR {problem}\n".encode()
            if problem or connection.eof:
                connection.closing = True
            self._flush(connection)
        return ended

    def _check(self, data: bytes, connection: _Connection) -> tuple[bytes, str]:
        """The complete lines of ``data`` up to the first bad one, and what is wrong with
        it ('' = nothing); the partial line left in the inbox counts too."""
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            good = data.rfind(b"\n", 0, exc.start) + 1
            line = connection.acked + data.count(b"\n", 0, good) + 1
            return data[:good], f"line {line} is not UTF-8 ({exc.reason})"
        if len(data) > self.max_line_bytes:
            start = 0
            while start < len(data):
                stop = data.index(b"\n", start)
                if stop - start > self.max_line_bytes:
                    return data[:start], f"a line is longer than {self.max_line_bytes} bytes"
                start = stop + 1
        if len(connection.inbox) - len(data) > self.max_line_bytes:
            return data, f"a line is longer than {self.max_line_bytes} bytes"
        return data, ""

    def _flush(self, connection: _Connection) -> None:
        try:
            sent = connection.sock.send(connection.outbox) if connection.outbox else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:  # the sender is gone
            self._close(connection)
            return
        del connection.outbox[:sent]
        if connection.closing and not connection.outbox:
            self._close(connection)
            return
        read = 0 if connection.closing or self.paused else selectors.EVENT_READ
        events = read | (selectors.EVENT_WRITE if connection.outbox or connection.closing
                         else 0)  # a closing sender stays readable (EOF): write only
        self._watch(connection, events)

    def _watch(self, connection: _Connection, events: int) -> None:
        """Selects ``connection`` for ``events``; none (paused, nothing to send): not at all."""
        sock = connection.sock
        try:
            key = self._selector.get_key(sock)
        except (KeyError, ValueError):
            key = None
        with contextlib.suppress(KeyError, ValueError):
            if not events:
                if key is not None:
                    self._selector.unregister(sock)
            elif key is None:
                self._selector.register(sock, events, connection)
            else:
                self._selector.modify(sock, events, connection)

    def _close(self, connection: _Connection) -> None:
        if self._connections.pop(connection.sock.fileno(), None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(connection.sock)
        connection.sock.close()

    def _shut_down(self) -> None:
        """Closes the port and every connection, sending queued ACKs first (briefly)."""
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(self.server)
        self.server.close()
        for connection in list(self._connections.values()):
            if connection.outbox and self.error is None:
                with contextlib.suppress(OSError):
                    connection.sock.settimeout(1.0)
                    connection.sock.sendall(connection.outbox)
            self._close(connection)
        self._selector.close()
        with _WRITERS_LOCK:
            for folder, receiver in list(_WRITERS.items()):
                if receiver is self:
                    del _WRITERS[folder]


def _listen(name: str, host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; SO_REUSEADDR lets a recovered source take the
    port of a killed one at once (its connections may linger in TIME_WAIT)."""
    deadline = time.monotonic() + _BIND_RETRY_S
    while True:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
            sock.setblocking(False)
            return sock
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            raise OSError(exc.errno, f"operator {name!r}: TcpLineSource cannot listen on "
                          f"{host}:{port}: {exc.strerror}; another process holds the port or "
                          "the address is not this machine's: stop that process or give the "
                          "operator another host/port") from None


def _stop_writer_of(folder: str) -> None:
    with _WRITERS_LOCK:
        previous = _WRITERS.pop(folder, None)
    if previous is not None:
        _LOGGER.info("operator %s: stopping the receiver of an earlier instance", previous.name)
        previous.stop()
        previous.wal.close()


def _encode_end(end_line: str | None) -> bytes | None:
    return None if end_line is None else end_line.encode("utf-8")


def _has_line(payload: bytes, line: bytes) -> bool:
    return any(part.removesuffix(b"\r") == line for part in payload.split(b"\n"))


def _cut_after_end(data: bytes, end: bytes) -> tuple[bytes, bool]:
    """``data`` up to and including the end line, and whether it holds one."""
    start = 0
    while start < len(data):
        stop = data.index(b"\n", start)
        if data[start:stop].removesuffix(b"\r") == end:
            return data[:stop + 1], True
        start = stop + 1
    return data, False

"""The receiving side of a ``TcpLineSource``: a thread that accepts senders, logs their
complete lines in the write-ahead log, syncs, and only then acknowledges them; while the
log is at its bound it stops reading (TCP holds the senders back).

Connections are bounded (``max_connections``): past it a new sender gets ``ERR`` and is
closed at once, so that no local user can take every file descriptor of the container.
A process out of descriptors or memory (``accept`` fails with ``EMFILE``, ``ENFILE``,
``ENOBUFS`` or ``ENOMEM``) stops accepting for a while, up to ``_MAX_BACKOFF_S``, and
goes on serving its senders: the waiting connections stay in the kernel's backlog."""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable

from weir.operators.library.tcp_wal import Wal

__all__ = ["Receiver", "cut_after_end", "encode_end", "listen", "register_writer",
           "stop_writer_of"]

_LOGGER = logging.getLogger("weir.operators.library.tcp")

_RECV_BYTES = 256 << 10
_POLL_S = 0.1  # how often the receiver checks that it should still run
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_MIN_BACKOFF_S, _MAX_BACKOFF_S = 0.1, 1.0  # accept() out of resources: pause, doubling
_LOG_EVERY_S = 10.0  # refused connections and failing accepts are logged at most this often

_WRITERS: dict[str, Receiver] = {}  # WAL folder -> the receiver writing it, in this process
_WRITERS_LOCK = threading.Lock()


def register_writer(folder: str, receiver: Receiver) -> None:
    """``receiver`` writes the WAL in ``folder`` now (one writer per folder per process)."""
    with _WRITERS_LOCK:
        _WRITERS[folder] = receiver


class Connection:
    """One sender: bytes received but not yet logged, lines acknowledged, ACKs to send."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.inbox = bytearray()
        self.outbox = bytearray()
        self.acked = 0
        self.eof = False
        self.closing = False  # refused: send what is queued, then close


class Receiver:
    """The background thread: accepts senders, logs their complete lines, acknowledges.

    A daemon thread that also ends when the operator's thread is gone (the runtime stops an
    undeployed operator without ``teardown``), so it never outlives its operator by more
    than ``_POLL_S`` nor keeps the port from a successor.
    """

    def __init__(self, server: socket.socket, wal: Wal, end: bytes | None,
                 max_line_bytes: int, crash_point: Callable[[str], None],
                 owner: threading.Thread, name: str, max_segments: int = 1 << 30,
                 max_connections: int = 1 << 30) -> None:
        self.server = server
        self.port = server.getsockname()[1]
        self.wal = wal
        self.end = end
        self.max_line_bytes = max_line_bytes
        self.crash_point = crash_point
        self.owner = owner
        self.name = name
        self.max_segments = max_segments
        self.max_connections = max_connections
        self.paused = False  # the WAL is full: senders are not read
        self.refused = 0  # connections closed at once: ``max_connections`` were open
        self._refusals_logged = (0, 0.0)  # (refused, when) at the last log of refusals
        self._backoff_s = 0.0  # accept() ran out of resources: how long it pauses now
        self._exhaustion_logged: float | None = None  # when a failing accept was logged
        self._accept_at: float | None = None  # when to accept again; None: accepting
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._connections: dict[int, Connection] = {}
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
                self._resume_accepting()
                ready: list[Connection] = []
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

    @property
    def connection_count(self) -> int:
        """The senders connected now (those being closed included)."""
        return len(self._connections)

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self.server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionError:  # the sender gave up before we accepted
                continue
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    raise
                self._pause_accepting(exc)
                return
            self._backoff_s = 0.0
            if len(self._connections) >= self.max_connections:
                self._refuse(sock, peer)
                continue
            sock.setblocking(False)
            connection = Connection(sock, f"{peer[0]}:{peer[1]}")
            self._connections[sock.fileno()] = connection
            self._watch(connection, 0 if self.paused else selectors.EVENT_READ)

    def _pause_accepting(self, exc: OSError) -> None:
        """Out of descriptors or memory: stops selecting the port for a while (it would
        be ready at once again) and serves the open connections, which may free some."""
        now = time.monotonic()
        if self._exhaustion_logged is None or now - self._exhaustion_logged >= _LOG_EVERY_S:
            self._exhaustion_logged = now
            _LOGGER.warning("operator %s: cannot accept a connection: %s; the %d open "
                            "connection(s) are served and accepting is tried again, every "
                            "%.1f s at most (raise the open-files limit or lower "
                            "max_connections)", self.name, exc, len(self._connections),
                            _MAX_BACKOFF_S)
        self._backoff_s = min(_MAX_BACKOFF_S, max(_MIN_BACKOFF_S, 2 * self._backoff_s))
        self._accept_at = now + self._backoff_s
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(self.server)

    def _resume_accepting(self) -> None:
        if self._accept_at is not None and time.monotonic() >= self._accept_at:
            self._accept_at = None
            self._selector.register(self.server, selectors.EVENT_READ)

    def _refuse(self, sock: socket.socket, peer: tuple) -> None:
        """Closes a connection past ``max_connections`` at once, telling the sender why."""
        self.refused += 1
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(f"ERR too many connections: {self.max_connections} are open\n".encode())
        sock.close()
        logged, when = self._refusals_logged
        now = time.monotonic()
        if logged == 0 or now - when >= _LOG_EVERY_S:
            _LOGGER.warning("operator %s: refused %d connection(s) (the latest from %s:%s): "
                            "max_connections=%d are open", self.name, self.refused - logged,
                            peer[0], peer[1], self.max_connections)
            self._refusals_logged = (self.refused, now)

    def _receive(self, connection: Connection) -> None:
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

    def _log(self, ready: list[Connection]) -> bool:
        """Logs the complete lines of ``ready``, syncs, then acknowledges; True once the
        end line is logged."""
        chunks: list[tuple[Connection, bytes]] = []
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
                data, ended = cut_after_end(data, self.end)
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

    def _check(self, data: bytes, connection: Connection) -> tuple[bytes, str]:
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

    def _flush(self, connection: Connection) -> None:
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

    def _watch(self, connection: Connection, events: int) -> None:
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

    def _close(self, connection: Connection) -> None:
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


def listen(name: str, host: str, port: int, retry_s: float = 5.0) -> socket.socket:
    """A listening socket on ``host:port``; SO_REUSEADDR lets a recovered source take the
    port of a killed one at once (its connections may linger in TIME_WAIT), and a port in
    use is tried again for ``retry_s`` (a predecessor in this process may still hold it)."""
    deadline = time.monotonic() + retry_s
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


def stop_writer_of(folder: str) -> None:
    with _WRITERS_LOCK:
        previous = _WRITERS.pop(folder, None)
    if previous is not None:
        _LOGGER.info("operator %s: stopping the receiver of an earlier instance", previous.name)
        previous.stop()
        previous.wal.close()


def encode_end(end_line: str | None) -> bytes | None:
    return None if end_line is None else end_line.encode("utf-8")


def cut_after_end(data: bytes, end: bytes) -> tuple[bytes, bool]:
    """``data`` up to and including the end line, and whether it holds one."""
    start = 0
    while start < len(data):
        stop = data.index(b"\n", start)
        if data[start:stop].removesuffix(b"\r") == end:
            return data[:stop + 1], True
        start = stop + 1
    return data, False

"""TcpLineSource driven through its hooks with real sockets: acknowledged only once synced,
identical replays and the unemitted tail after a restore, segments freed at commit, a
damaged WAL named, a torn tail cut off."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import struct
import threading
import time
import zlib
from pathlib import Path

import pytest

from tests.harness import poll_for
from tests.operators.test_exactly_once import lines_by_window, source_window
from tests.operators.test_library import Emitted, wid
from weir.operators.library import TcpLineSource
from weir.operators.operator import OperatorContext
from weir.runtime.operator_state import capture, restore
from weir.storage import CorruptLog, RecordLog

TIMEOUT_S = 5.0


def context(state: Path, recovered: int = -1) -> OperatorContext:
    return OperatorContext(name="tcp", operator_id=4, container_id="c0",
                           attributes={"STREAMING_WINDOW_SIZE_MILLIS": 100},
                           state_dir=str(state), recovered_window=recovered)


def started(src: TcpLineSource, state: Path, recovered: int = -1,
            ctx: OperatorContext | None = None) -> Emitted:
    emitted = Emitted()
    src.connect_outputs(emitted)
    src.setup(ctx or context(state, recovered))
    return emitted


def window(src: TcpLineSource, emitted: Emitted, counter: int, calls: int = 3) -> bool:
    """One streaming window of ``calls`` emit_tuples calls; False once the stream ended."""
    return source_window(src, emitted, counter, calls)


class Sender:
    """A sender: writes lines, reads the source's replies."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
        self.sent = 0
        self._buffer = b""

    def send(self, lines: list[str], raw: bytes = b"") -> None:
        self.sock.sendall("".join(f"{line}\n" for line in lines).encode() + raw)
        self.sent += len(lines)

    def reply(self) -> str:
        """The next reply line; '' when the source closed the connection."""
        while b"\n" not in self._buffer:
            data = self.sock.recv(4096)
            if not data:
                return ""
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def acked(self, count: int | None = None) -> int:
        """Reads ACKs until ``count`` (default: every line sent) lines are acknowledged."""
        count = self.sent if count is None else count
        n = 0
        while n < count:
            reply = self.reply()
            assert reply.startswith("ACK "), f"expected an ACK, got {reply!r}"
            n = int(reply.split()[1])
        return n

    def send_acked(self, lines: list[str]) -> None:
        self.send(lines)
        self.acked()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def source(tmp_path: Path):
    """A started source on any free port; torn down at the end."""
    made: list[TcpLineSource] = []

    def make(**kwargs) -> tuple[TcpLineSource, Emitted]:
        src = TcpLineSource(port=0, **kwargs)
        made.append(src)
        return src, started(src, tmp_path / "state")

    yield make
    for src in made:
        src.teardown()


def wal_records(state: Path) -> list[bytes]:
    """The WAL's records, read from a copy (opening a log may repair it)."""
    copy = state.parent / f"wal-copy-{time.monotonic_ns()}"
    shutil.copytree(state / "wal", copy)
    return [payload for _, payload in RecordLog(str(copy)).records()]


def test_lines_are_emitted_in_order_as_line_batches(source) -> None:
    src, emitted = source()
    sender = Sender(src.bound_port)
    sender.send_acked([f"a{i}" for i in range(5)])
    assert window(src, emitted, 1)
    sender.send_acked(["b0", "b1 \N{SNOWMAN}"])
    sender.send([], raw=b"c0\r\nc1\n")
    assert sender.acked(9) == 9  # cumulative over the connection
    assert window(src, emitted, 2)
    assert lines_by_window(emitted) == {wid(1): [f"a{i}" for i in range(5)],
                                        wid(2): ["b0", "b1 \N{SNOWMAN}", "c0", "c1"]}
    assert all(b.schema.names == ["line"] for b in emitted.all_batches())
    assert src.lines_emitted == 9


def test_lines_past_the_memory_cache_are_read_from_disk(source) -> None:
    src, emitted = source(batch_lines=4, cache_bytes=30)  # about one record
    sender = Sender(src.bound_port)
    for i in range(6):
        sender.send_acked([f"{i}-a", f"{i}-b", f"{i}-c"])
    window(src, emitted, 1, calls=2)
    window(src, emitted, 2, calls=10)
    assert lines_by_window(emitted) == {  # a call takes whole records, 4 lines or more
        wid(1): [f"{i}-{x}" for i in range(0, 4) for x in "abc"],
        wid(2): [f"{i}-{x}" for i in range(4, 6) for x in "abc"]}
    assert max(b.num_rows for b in emitted.all_batches()) <= 4


def test_an_ack_comes_only_after_the_lines_are_synced(tmp_path: Path) -> None:
    """The crash point between append and sync holds the receiver: no ACK meanwhile; when
    the ACK arrives the lines are in the WAL on disk."""
    appended, release = threading.Event(), threading.Event()

    def crash_point(name: str) -> None:
        if name == "wal.appended":
            appended.set()
            assert release.wait(TIMEOUT_S)

    ctx = context(tmp_path / "state")
    ctx.crash_point = crash_point  # type: ignore[method-assign]
    src = TcpLineSource(port=0)
    started(src, tmp_path / "state", ctx=ctx)
    try:
        sender = Sender(src.bound_port)
        sender.send(["one", "two"])
        assert appended.wait(TIMEOUT_S)
        sender.sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sender.reply()  # appended, not synced: nothing acknowledged
        sender.sock.settimeout(TIMEOUT_S)
        release.set()
        assert sender.reply() == "ACK 2"
        assert b"".join(wal_records(tmp_path / "state")) == b"one\ntwo\n"
    finally:
        release.set()
        src.teardown()


def test_acks_count_per_connection_and_partial_lines_are_not_acknowledged(source) -> None:
    src, emitted = source()
    first, second = Sender(src.bound_port), Sender(src.bound_port)
    first.send_acked(["x1", "x2"])
    second.send_acked(["y1"])
    first.send(["x3"], raw=b"x4-without-newline")
    assert first.acked() == 3
    second.send_acked(["y2", "y3"])
    first.sock.shutdown(socket.SHUT_WR)
    assert first.reply() == ""  # closed; the partial line was dropped
    window(src, emitted, 1)
    assert sorted(lines_by_window(emitted)[wid(1)]) == ["x1", "x2", "x3", "y1", "y2", "y3"]


def test_invalid_utf8_and_long_lines_are_refused(source) -> None:
    src, emitted = source(max_line_bytes=20)
    bad = Sender(src.bound_port)
    bad.send(["fine"], raw=b"caf\xe9\nlater\n")
    assert bad.reply() == "ACK 1"
    assert bad.reply().startswith("ERR line 2 is not UTF-8")
    assert bad.reply() == ""
    long = Sender(src.bound_port)
    long.send(["short", "x" * 30])
    assert long.reply() == "ACK 1"
    assert long.reply() == "ERR a line is longer than 20 bytes"
    window(src, emitted, 1)
    assert sorted(lines_by_window(emitted)[wid(1)]) == ["fine", "short"]


def test_the_end_line_ends_the_stream_and_nothing_after_it_is_acknowledged(source) -> None:
    src, emitted = source(end_line="EOF")
    sender = Sender(src.bound_port)
    sender.send_acked(["a", "b"])
    assert window(src, emitted, 1)
    sender.send(["c", "EOF", "d"])
    assert sender.acked(4) == 4  # c and EOF: d is neither logged nor acknowledged
    assert sender.reply() == ""  # and the source takes no more input
    port = src.bound_port
    poll_for(lambda: not _accepts(port), TIMEOUT_S, f"port {port} to close")
    assert not window(src, emitted, 2)
    assert lines_by_window(emitted) == {wid(1): ["a", "b"], wid(2): ["c"]}
    assert not src.emit_tuples()


def test_a_logged_window_is_replayed_identically_and_the_unemitted_tail_follows(
        tmp_path: Path) -> None:
    state = tmp_path / "state"
    src = TcpLineSource(port=0, batch_lines=3)
    emitted = started(src, state)
    sender = Sender(src.bound_port)
    sender.send_acked(["w1-0", "w1-1"])
    window(src, emitted, 1)
    checkpoint = capture(src)  # the state as of window 1
    for counter in range(2, 5):
        sender.send_acked([f"w{counter}-{i}" for i in range(counter)])
        sender.send_acked([f"w{counter}-more"])
        window(src, emitted, counter, calls=1)  # few calls: the window reads part of it
    sender.send_acked(["logged-not-emitted-0", "logged-not-emitted-1"])
    first_run = lines_by_window(emitted)
    sender.close()
    # the container dies (no teardown); a new instance restores window 1's checkpoint
    again = restore(TcpLineSource(port=0), checkpoint)
    replayed = started(again, state, recovered=wid(1))
    for counter in range(2, 5):
        window(again, replayed, counter, calls=10)  # other timing, same windows
    assert lines_by_window(replayed) == {w: ls for w, ls in first_run.items() if w > wid(1)}
    window(again, replayed, 5, calls=10)
    emitted_twice = [line for ls in lines_by_window(replayed).values() for line in ls]
    assert emitted_twice[-2:] == ["logged-not-emitted-0", "logged-not-emitted-1"]
    everything = [line for w, ls in sorted({**first_run, **lines_by_window(replayed)}.items())
                  for line in ls]
    assert len(everything) == len(set(everything)) == 2 + 3 * 2 + 2 + 3 + 4 - 3 + 2
    again.teardown()


def test_wal_segments_are_deleted_once_committed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    src = TcpLineSource(port=0, segment_bytes=200)  # about 3 records a segment
    emitted = started(src, state)
    sender = Sender(src.bound_port)
    ends = {}
    for counter in range(1, 6):
        for _ in range(3):
            sender.send_acked([f"{counter}-{i:02d}-" + "x" * 20 for i in range(2)])
        window(src, emitted, counter, calls=10)
        ends[counter] = src.window_record()[1]  # the window read WAL records up to this
    segments = sorted(os.listdir(state / "wal"))
    starts = [int(name[:20]) for name in segments]
    assert len(segments) >= 4
    src.checkpointed(wid(3))
    assert sorted(os.listdir(state / "wal")) == segments, "nothing is deleted before a commit"
    src.committed(wid(3))
    kept = sorted(os.listdir(state / "wal"))
    # exactly the segments holding only records that windows up to 3 read are gone
    assert set(segments) - set(kept) == {
        name for name, following in zip(segments[:-1], starts[1:], strict=True)
        if following <= ends[3]}
    assert len(kept) < len(segments)
    src.committed(wid(5))
    assert len(os.listdir(state / "wal")) == 1  # the segment being written stays
    src.teardown()


def test_a_corrupt_wal_segment_is_named_with_its_offset(tmp_path: Path) -> None:
    state = tmp_path / "state"
    src = TcpLineSource(port=0, segment_bytes=100)
    emitted = started(src, state)
    sender = Sender(src.bound_port)
    for i in range(6):
        sender.send_acked([f"line {i} " + "y" * 40])
    window(src, emitted, 1)
    checkpoint = capture(src)
    src.teardown()
    segment = state / "wal" / sorted(os.listdir(state / "wal"))[1]
    data = bytearray(segment.read_bytes())
    data[8 + 10] ^= 0xFF  # a payload byte of its first record, another record follows
    segment.write_bytes(bytes(data))
    with pytest.raises(CorruptLog, match=f"{segment} at byte 8") as error:
        started(restore(TcpLineSource(port=0), checkpoint), state, recovered=wid(1))
    assert error.value.path == str(segment) and error.value.offset == 8


def test_a_torn_last_record_is_cut_off_and_the_rest_is_read(tmp_path: Path, caplog) -> None:
    state = tmp_path / "state"
    src = TcpLineSource(port=0)
    started(src, state)
    before = capture(src)  # nothing emitted yet
    sender = Sender(src.bound_port)
    sender.send_acked(["kept 1", "kept 2"])
    sender.send_acked(["kept 3"])
    src.teardown()
    segment = state / "wal" / sorted(os.listdir(state / "wal"))[-1]
    payload = b"never acknowledged\n"
    length = struct.pack("<I", len(payload))
    with open(segment, "ab") as out:  # a writer died in the middle of an append
        out.write(length + struct.pack("<I", zlib.crc32(length)) + payload[:7])
    again = restore(TcpLineSource(port=0), before)
    with caplog.at_level(logging.WARNING):
        emitted = started(again, state, recovered=wid(0))
    assert "cutting off a torn tail" in caplog.text
    window(again, emitted, 1)
    assert lines_by_window(emitted) == {wid(1): ["kept 1", "kept 2", "kept 3"]}
    again.teardown()


def test_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    holder = socket.create_server(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    try:
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}.*another host/port"):
            started(TcpLineSource(port=port, bind_retry_s=0.2), tmp_path / "state")
    finally:
        holder.close()


def test_the_receiver_stops_with_the_operator_thread(tmp_path: Path) -> None:
    """The runtime may stop an operator's thread without teardown: the port is freed."""
    src = TcpLineSource(port=0)
    thread = threading.Thread(target=started, args=(src, tmp_path / "state"))
    thread.start()
    thread.join(TIMEOUT_S)
    port = src.bound_port
    poll_for(lambda: not _accepts(port), TIMEOUT_S, f"port {port} to be released")
    again = TcpLineSource(port=port)
    started(again, tmp_path / "state", recovered=-1)  # binds the same port at once
    again.teardown()


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_a_full_wal_holds_senders_back_until_commits_free_it(tmp_path: Path) -> None:
    """Issue 17, item 10: while commits stall, the WAL stops at its bound; the sender is
    not refused and loses nothing: it is simply not read until a commit frees segments."""
    state = tmp_path / "state"
    src = TcpLineSource(port=0, segment_bytes=200, max_wal_bytes=800)  # 4 segments
    emitted = started(src, state)
    sender = Sender(src.bound_port)
    try:
        counter = 0
        while src._receiver.paused is False and counter < 50:
            counter += 1
            sender.send_acked([f"{counter}-{i}-" + "x" * 40 for i in range(4)])
            window(src, emitted, counter, calls=10)
        assert src._receiver.paused, "the WAL never reached its bound"
        assert len(os.listdir(state / "wal")) <= 4
        sender.send([f"held-{i}" for i in range(3)])  # not read, so not acknowledged yet
        sender.sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sender.reply()
        sender.sock.settimeout(TIMEOUT_S)
        src.checkpointed(wid(counter))
        src.committed(wid(counter))  # segments go: the held lines are read and logged
        assert sender.acked() == sender.sent
        window(src, emitted, counter + 1, calls=10)
        assert [r["line"] for r in emitted.rows()][-3:] == ["held-0", "held-1", "held-2"]
    finally:
        sender.close()
        src.teardown()

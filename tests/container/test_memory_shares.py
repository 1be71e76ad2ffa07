"""A container keeps its buffers inside CONTAINER_MEMORY_MB: the buffer server spills past
a quarter of it, and each input port queues at most a sixteenth of it in payload bytes.
Without a limit, the buffer server keeps a sixteenth of the machine's memory. Arrow
allocates from jemalloc either way."""

from __future__ import annotations

import threading
import time

import psutil

from weir.container.buffer_server import MEMORY_BUDGET_BYTES
from weir.container.memory_shares import (
    buffer_memory_bytes,
    input_queue_bytes,
    use_container_pool,
)
from weir.container.port_input import PortInput
from weir.container.stream_messages import Kind, Message


def test_the_shares_follow_the_limit_and_the_machine_without_one():
    gib = 1 << 30
    assert buffer_memory_bytes({}, host_bytes=24 * gib) == 1536 << 20
    assert buffer_memory_bytes({}, host_bytes=2 * gib) == MEMORY_BUDGET_BYTES  # at least
    assert buffer_memory_bytes({}, host_bytes=256 * gib) == 4 * gib  # at most
    assert buffer_memory_bytes({}) == buffer_memory_bytes(
        {}, host_bytes=psutil.virtual_memory().total)
    assert buffer_memory_bytes({"CONTAINER_MEMORY_MB": 384}, host_bytes=24 * gib) == 96 << 20
    assert buffer_memory_bytes({"CONTAINER_MEMORY_MB": 8192}) == MEMORY_BUDGET_BYTES
    assert buffer_memory_bytes({"BUFFER_MEMORY_MB": 1024}) == 1024 << 20  # asked: taken
    assert buffer_memory_bytes({"CONTAINER_MEMORY_MB": 8192, "BUFFER_MEMORY_MB": 2048}) \
        == 2048 << 20
    assert input_queue_bytes({}) == 0
    assert input_queue_bytes({"CONTAINER_MEMORY_MB": 384}) == 24 << 20


def _data(size: int) -> Message:
    return Message(Kind.DATA, 1, payload=b"x" * size, rows=1)


def test_an_input_port_queues_no_more_payload_bytes_than_its_bound():
    stopped = threading.Event()
    messages = [Message(Kind.BEGIN_WINDOW, 1), *[_data(1000) for _ in range(6)],
                Message(Kind.END_WINDOW, 1), Message(Kind.END_STREAM, -1)]
    port = PortInput("input", lambda _w: (iter(messages), lambda: None), 100, stopped,
                     max_bytes=2500)
    port.start()
    try:
        time.sleep(0.3)  # the pump has run as far as the bound lets it
        assert port.queue_size == 3  # BEGIN_WINDOW and two of 1,000 bytes: a third is over
        assert port.get().kind == Kind.BEGIN_WINDOW
        port.get()  # one of the two goes: room for one more
        time.sleep(0.3)
        assert port.queue_size == 2
        got = [port.get() for _ in range(7)]
        assert [m.kind for m in got[-2:]] == [Kind.END_WINDOW, Kind.END_STREAM]
    finally:
        stopped.set()
        port.close()


def test_a_message_larger_than_the_bound_still_passes_alone():
    stopped = threading.Event()
    messages = [_data(5000), _data(5000), Message(Kind.END_STREAM, -1)]
    port = PortInput("input", lambda _w: (iter(messages), lambda: None), 100, stopped,
                     max_bytes=1000)
    port.start()
    try:
        assert port.get().nbytes == 5000 and port.get().nbytes == 5000
        assert port.get().kind == Kind.END_STREAM
    finally:
        stopped.set()
        port.close()


def test_a_container_allocates_arrow_memory_from_jemalloc_with_or_without_a_limit():
    import pyarrow as pa

    before = pa.default_memory_pool()
    try:
        pa.set_memory_pool(pa.mimalloc_memory_pool())  # pyarrow's own default here
        assert use_container_pool() == "jemalloc"  # the Linux wheels are built with it
        assert pa.default_memory_pool().backend_name == "jemalloc"
        pool = pa.default_memory_pool()
        held = pool.bytes_allocated()
        values = pa.array(range(100_000), pa.int64())  # allocated from it
        assert pool.bytes_allocated() >= held + values.nbytes
    finally:
        pa.set_memory_pool(before)

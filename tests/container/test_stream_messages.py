"""The wire form of stream messages: END_WINDOW's watermark through the envelope, spill files
and a buffer server's replay of retained windows."""

from __future__ import annotations

import pyarrow as pa
import pytest

from weir.container.buffer_client import subscribe
from weir.container.buffer_server import BufferServer
from weir.container.spill import read_block, write_block
from weir.container.stream_messages import (
    ENVELOPE_SCHEMA,
    Kind,
    Message,
    from_envelope,
    to_envelope,
)
from weir.operators.watermarks import END_OF_TIME, NO_WATERMARK

pytestmark = pytest.mark.timeout(60)

MARKS = [NO_WATERMARK, 0, 1_700_000_000_123, END_OF_TIME]


def window_messages() -> list[Message]:
    messages = []
    for w, mark in enumerate(MARKS, start=1):
        messages += [Message(Kind.BEGIN_WINDOW, w),
                     Message.data(w, pa.record_batch({"x": [w, w + 1]})),
                     Message(Kind.END_WINDOW, w, watermark=mark)]
    return messages


def shape(messages: list[Message]) -> list[tuple[Kind, int, int]]:
    return [(m.kind, m.window_id, m.watermark) for m in messages]


def test_the_envelope_carries_each_end_window_watermark():
    messages = window_messages()
    envelope = to_envelope(messages)
    assert envelope.schema.equals(ENVELOPE_SCHEMA)
    back = from_envelope(envelope)
    assert shape(back) == shape(messages)
    assert [m.watermark for m in back if m.kind == Kind.END_WINDOW] == MARKS
    assert back[1].batch() == messages[1].batch()


def test_an_envelope_without_the_watermark_column_reads_as_no_watermark():
    """A peer from before watermarks sends four columns."""
    full = to_envelope(window_messages())
    old = pa.RecordBatch.from_arrays(full.columns[:4], names=full.schema.names[:4])
    assert {m.watermark for m in from_envelope(old)} == {NO_WATERMARK}


def test_spill_files_keep_the_watermarks(tmp_path):
    messages = window_messages()
    write_block(tmp_path / "block.arrow", messages, batch_bytes=1)  # one batch per message
    assert shape(read_block(tmp_path / "block.arrow")) == shape(messages)


def test_a_replayed_window_says_the_same_watermark():
    with BufferServer() as server:
        publisher = server.publisher("1.output")
        for w, mark in enumerate(MARKS, start=1):
            publisher.begin_window(w)
            publisher.data(w, pa.record_batch({"x": [w]}))
            publisher.end_window(w, mark)
        publisher.end_stream()
        host, port = server.address
        first = list(subscribe(host, port, "1.output", -1, timeout_s=10))
        replay = list(subscribe(host, port, "1.output", 2, timeout_s=10))  # after window 2
    ends = [(m.window_id, m.watermark) for m in first if m.kind == Kind.END_WINDOW]
    assert ends == list(enumerate(MARKS, start=1))
    assert [(m.window_id, m.watermark) for m in replay if m.kind == Kind.END_WINDOW] == ends[2:]


def bids(rows: int) -> pa.RecordBatch:
    return pa.record_batch({"auction": pa.array(range(rows), pa.int64()),
                            "price": pa.array([float(i) for i in range(rows)])})


def test_a_published_batch_stays_as_it_is_until_it_leaves_the_process():
    batch = bids(1000)
    message = Message.data(3, batch)
    assert message.payload is None and message.batch() is batch  # no copy, no encoding
    size = message.nbytes
    payload = message.encoded()
    assert len(payload) == size  # the accounting does not change when it is encoded
    assert message.nbytes == size and message.record is None
    assert message.encoded() is payload  # encoded once
    assert message.batch().equals(batch) and message == Message.data(3, batch)


def test_a_small_slice_of_a_large_batch_is_copied_at_once():
    """Kept as it is, a slice would pin its parent's buffers, which nobody counts."""
    message = Message.data(1, bids(100_000).slice(10, 5))
    assert message.payload is not None and message.record is None
    assert message.nbytes == len(message.payload)
    assert message.batch().equals(bids(100_000).slice(10, 5))
    whole = Message.data(1, bids(100_000).slice(0, 90_000))
    assert whole.payload is None  # most of its parent: kept


def test_a_local_reader_gets_the_published_batch_and_a_flight_reader_its_bytes():
    batch = bids(1000)
    with BufferServer() as server:
        publisher = server.publisher("1.output")
        publisher.begin_window(1)
        publisher.data(1, batch)
        publisher.end_window(1)
        publisher.end_stream()
        stored = server.stats().memory_bytes
        local = [m for ms in server.messages("1.output", -1, None) for m in ms
                 if m.kind == Kind.DATA]
        assert local[0].batch() is batch and local[0].payload is None
        host, port = server.address
        remote = [m for m in subscribe(host, port, "1.output", -1, timeout_s=10)
                  if m.kind == Kind.DATA]
        assert remote[0].batch().equals(batch)
        assert local[0].payload is not None  # served once over Flight: encoded, cached
        assert server.stats().memory_bytes == stored == local[0].nbytes


def test_unencoded_messages_spill_and_read_back_as_published(tmp_path):
    messages = [Message(Kind.BEGIN_WINDOW, 1), Message.data(1, bids(10)),
                Message.data(1, bids(20)), Message(Kind.END_WINDOW, 1, watermark=5)]
    write_block(tmp_path / "block.arrow", messages)
    back = read_block(tmp_path / "block.arrow")
    assert back == messages
    assert [m.nbytes for m in back] == [m.nbytes for m in messages]

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

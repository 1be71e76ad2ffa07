"""Kafka records to Arrow without a broker: a record that does not decode, whatever the
reason (bad JSON, nesting past the recursion limit, an integer past Python's digit limit),
is a ``RecordDecodeError`` naming it, so that it becomes a dead letter, never a crash; more
of them in a batch than ``DEAD_LETTER_MAX_ROWS`` fail the source (a wrong format)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from weir.operators.dead_letters import TooManyDeadLetters
from weir.operators.library.kafka_records import (
    RecordDecodeError,
    decode_setting_aside,
    record_schema,
    records_to_batch,
)

VALUE_SCHEMA = pa.schema([("user", pa.string()), ("amount", pa.int64())])
SCHEMA = record_schema("json", VALUE_SCHEMA, False)
GOOD = b'{"user": "a", "amount": 1}'
DEEP = b'{"user": "x", "amount": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
LONG_INT = b'{"user": "x", "amount": ' + b"9" * 5_000 + b"}"


class Message:
    """What ``records_to_batch`` reads of a confluent-kafka ``Message``."""

    def __init__(self, value: bytes | None, offset: int) -> None:
        self._value, self._offset = value, offset

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return None

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return 0, 0

    def headers(self) -> None:
        return None


def messages(*values: bytes | None) -> list[Message]:
    return [Message(value, offset) for offset, value in enumerate(values)]


@pytest.mark.parametrize(("bad", "says"), [
    (DEEP, "cannot be read as JSON (RecursionError: "),
    (LONG_INT, "cannot be read as JSON (ValueError: Exceeds the limit (4300 digits)"),
    (b'{"user": "x",\n "amount": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
     "cannot be read as JSON (RecursionError: "),  # a newline: read in Python at once
    (b"{not json", "is not JSON (JSONDecodeError: "),
])
def test_a_record_that_cannot_be_read_is_a_record_decode_error_naming_it(bad, says):
    with pytest.raises(RecordDecodeError) as caught:
        records_to_batch(messages(GOOD, bad, GOOD), "json", SCHEMA, False)
    assert str(caught.value).startswith(f"the record at topic 't', partition 0, offset 1 {says}")
    assert len(str(caught.value)) < 600  # the record is not quoted at length


def test_with_dead_letters_unreadable_records_are_set_aside_and_the_rest_go_on():
    aside: list[tuple[pa.RecordBatch, BaseException]] = []
    batch = decode_setting_aside(messages(GOOD, DEEP, GOOD, LONG_INT, None), "json", SCHEMA,
                                 False, lambda rows, error: aside.append((rows, error)))
    assert batch.column("offset").to_pylist() == [0, 2, 4]
    assert batch.column("user").to_pylist() == ["a", "a", None]
    assert [(rows.column("offset").to_pylist(), rows.column("value").to_pylist())
            for rows, _ in aside] == [([1], [DEEP]), ([3], [LONG_INT])]
    assert all(type(error) is RecordDecodeError for _, error in aside)


def test_more_unreadable_records_than_max_rows_fail_the_source():
    with pytest.raises(TooManyDeadLetters, match=r"more than 2 of a batch's 4 rows fail "
                                                 r"\(DEAD_LETTER_MAX_ROWS=2\), the first with "
                                                 "RecordDecodeError: the record at topic 't', "
                                                 "partition 0, offset 0 is not JSON"):
        decode_setting_aside(messages(b"<a/>", b"<b/>", b"<c/>", GOOD), "json", SCHEMA, False,
                             lambda rows, error: None, max_rows=2)

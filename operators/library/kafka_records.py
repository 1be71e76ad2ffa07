"""Kafka records to Arrow: the columns a ``KafkaSource`` emits, with the value decoded.

Values decode as ``bytes`` (as they are), ``utf8`` (text) or ``json`` (each value one
JSON object, its fields read into a declared Arrow schema). Decoding runs in Arrow's C++
for a whole batch; only when a batch fails is it decoded record by record, to name the
record at fault (topic, partition, offset). A record that does not decode is an error,
never skipped, unless the source has dead letters: then it goes to its ``errors`` port as
it came (``decode_setting_aside``).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.json as pajson

from weir.operators.dead_letters import isolate_failures
from weir.operators.operator import PermanentError

__all__ = ["VALUE_FORMATS", "RecordDecodeError", "decode_setting_aside", "json_value",
           "record_schema", "records_to_batch"]

VALUE_FORMATS = ("bytes", "utf8", "json")

_TIMESTAMP = pa.timestamp("ms", tz="UTC")
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


class RecordDecodeError(PermanentError, ValueError):
    """A record's value is not what the source's ``value_format`` says it is (read again
    on every replay: it fails the application at once)."""


def record_schema(value_format: str, value_schema: pa.Schema | None,
                  headers: bool) -> pa.Schema:
    """The emitted schema: key, the value (a ``value`` column, or the JSON schema's
    columns), topic, partition, offset, timestamp, and headers if asked for.

    >>> record_schema("utf8", None, False).names
    ['key', 'value', 'topic', 'partition', 'offset', 'timestamp']
    >>> record_schema("json", pa.schema([("user", pa.string())]), False).names
    ['key', 'user', 'topic', 'partition', 'offset', 'timestamp']
    """
    if value_format not in VALUE_FORMATS:
        raise ValueError(f"value_format must be one of {VALUE_FORMATS}, not {value_format!r}")
    if value_format == "json":
        if value_schema is None or not len(value_schema):
            raise ValueError("value_format='json' needs value_schema: the Arrow schema of the "
                             "JSON objects' fields to read, e.g. pa.schema([('user', "
                             "pa.string()), ('amount', pa.int64())])")
        values = list(value_schema)
    else:
        if value_schema is not None:
            raise ValueError(f"value_schema is for value_format='json', not {value_format!r}")
        values = [pa.field("value", pa.string() if value_format == "utf8" else pa.binary())]
    fields = [pa.field("key", pa.binary()), *values, pa.field("topic", pa.string()),
              pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
              pa.field("timestamp", _TIMESTAMP)]
    if headers:
        fields.append(pa.field("headers", _HEADERS))
    names = [f.name for f in fields]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"value_schema field(s) {duplicates} clash with the record columns "
                         f"{names}; rename them in value_schema")
    return pa.schema(fields)


def records_to_batch(messages: Sequence[Any], value_format: str, schema: pa.Schema,
                     headers: bool) -> pa.RecordBatch:
    """One batch of ``messages`` (confluent-kafka ``Message`` objects, no errors among
    them) in ``schema`` (``record_schema``).

    Raises:
        RecordDecodeError: a value does not decode, naming its topic, partition and offset.
    """
    count = len(messages)
    values = [m.value() for m in messages]
    columns: dict[str, pa.Array] = {"key": pa.array([m.key() for m in messages], pa.binary())}
    if value_format == "bytes":
        columns["value"] = pa.array(values, pa.binary())
    elif value_format == "utf8":
        columns["value"] = _utf8(messages, values)
    else:
        table = _json(messages, values, _value_schema(schema, headers))
        columns.update(zip(table.column_names, table.columns, strict=True))
    columns["topic"] = pa.array([m.topic() for m in messages], pa.string())
    columns["partition"] = pa.array([m.partition() for m in messages], pa.int32())
    columns["offset"] = pa.array([m.offset() for m in messages], pa.int64())
    columns["timestamp"] = pa.array([_timestamp(m) for m in messages], _TIMESTAMP)
    if headers:
        columns["headers"] = pa.array([_headers(m) for m in messages], _HEADERS)
    arrays = [columns[name].combine_chunks() if isinstance(columns[name], pa.ChunkedArray)
              else columns[name] for name in schema.names]
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    assert batch.num_rows == count
    return batch


def decode_setting_aside(messages: Sequence[Any], value_format: str, schema: pa.Schema,
                         headers: bool,
                         set_aside: Callable[[pa.RecordBatch, BaseException], None],
                         max_rows: int | None = None) -> pa.RecordBatch:
    """``records_to_batch``, with the records that do not decode handed to ``set_aside``
    as they came (``value`` as bytes) with their error, instead of failing the batch
    (Kafka Streams' deserialization handler; the bad ones are found by bisection). More
    than ``max_rows`` of them fail the batch (``operators.dead_letters``' breaker: a
    wrong ``value_format`` is not a topic of bad records)."""
    try:
        return records_to_batch(messages, value_format, schema, headers)
    except RecordDecodeError as first:
        bad = isolate_failures(
            len(messages),
            lambda lo, hi: records_to_batch(messages[lo:hi], value_format, schema, headers),
            lambda exc: isinstance(exc, RecordDecodeError), whole_error=first,
            max_rows=max_rows)
    raw = record_schema("bytes", None, headers)
    dropped: set[int] = set()
    for lo, hi, error in bad:
        set_aside(records_to_batch(messages[lo:hi], "bytes", raw, headers), error)
        dropped.update(range(lo, hi))
    good = [m for i, m in enumerate(messages) if i not in dropped]
    return records_to_batch(good, value_format, schema, headers)


def _value_schema(schema: pa.Schema, headers: bool) -> pa.Schema:
    """The JSON fields: the columns between ``key`` and the record columns."""
    tail = 5 if headers else 4
    return pa.schema(list(schema)[1:len(schema) - tail])


def _where(message: Any) -> str:
    return (f"topic {message.topic()!r}, partition {message.partition()}, offset "
            f"{message.offset()}")


def _utf8(messages: Sequence[Any], values: list[bytes | None]) -> pa.Array:
    try:
        return pa.array(values, pa.binary()).cast(pa.string())
    except pa.ArrowInvalid:
        pass
    for message, value in zip(messages, values, strict=True):
        try:
            if value is not None:
                value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordDecodeError(
                f"the record at {_where(message)} is not UTF-8 text ({exc.reason} at byte "
                f"{exc.start}); read the topic with value_format='bytes'") from None
    raise AssertionError("the batch failed to decode but no record failed")


def _json(messages: Sequence[Any], values: list[bytes | None],
          value_schema: pa.Schema) -> pa.Table:
    """The JSON objects' fields, in C++ for the whole batch; a null value (a tombstone)
    is a row of nulls."""
    lines = [b"{}" if v is None else v for v in values]
    if not any(b"\n" in line or b"\r" in line for line in lines):
        try:
            table = pajson.read_json(
                io.BytesIO(b"\n".join(lines)),
                parse_options=pajson.ParseOptions(explicit_schema=value_schema,
                                                  unexpected_field_behavior="ignore"))
            if table.num_rows == len(lines):
                return table.select(value_schema.names)
        except pa.ArrowException:
            pass  # find the record at fault below
    rows = [{} if value is None else _json_row(message, value, value_schema)
            for message, value in zip(messages, values, strict=True)]
    return pa.Table.from_pylist(rows, schema=value_schema)


_UNREADABLE = (ValueError, TypeError, OverflowError, RecursionError, NotImplementedError,
               pa.ArrowException)
"""What decoding one record may raise because of the record: bad JSON or UTF-8, an integer
past Python's digit limit (``ValueError``), nesting past the recursion limit, a value Arrow
cannot convert. Any of them is that record's fault, never a reason to fail the app."""


def _json_row(message: Any, value: bytes, value_schema: pa.Schema) -> dict[str, Any]:
    """One record's JSON object, checked against ``value_schema``."""
    try:
        row = json.loads(value)
    except _UNREADABLE as exc:
        what = "is not JSON" if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError) \
            else "cannot be read as JSON"  # valid, but too deep or an integer too long
        raise RecordDecodeError(f"the record at {_where(message)} {what} "
                                f"({type(exc).__name__}: {_first_line(exc)}); fix the "
                                "producer or read with value_format='bytes'") from None
    if not isinstance(row, dict):
        raise RecordDecodeError(f"the record at {_where(message)} is JSON but not an "
                                f"object ({type(row).__name__}); value_format='json' "
                                "reads objects")
    try:
        pa.Table.from_pylist([row], schema=value_schema)
    except _UNREADABLE as exc:
        raise RecordDecodeError(f"the record at {_where(message)} does not fit "
                                f"value_schema ({type(exc).__name__}: {_first_line(exc)})"
                                ) from None
    return row


def _first_line(exc: BaseException, chars: int = 300) -> str:
    """The error's first line, cut: a record's error may quote the record at length."""
    text = str(exc).strip().split("\n", 1)[0]
    return text if len(text) <= chars else text[:chars - 3] + "..."


def _timestamp(message: Any) -> int | None:
    kind, value = message.timestamp()
    return None if kind == 0 or value < 0 else value  # 0: TIMESTAMP_NOT_AVAILABLE


def _headers(message: Any) -> list[dict[str, Any]]:
    return [{"key": k, "value": v} for k, v in (message.headers() or [])]


def json_value(row: dict[str, Any]) -> bytes:
    """A row as a compact JSON object (what ``KafkaSink`` writes by default)."""
    return json.dumps(row, separators=(",", ":"), default=str).encode()

"""The Flight face of a buffer server: ``do_get`` with a JSON ticket naming the stream,
where to start and (optionally) a partition, answered with envelope batches; every call
must carry the master's secret (inside TLS in a container)."""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
from collections.abc import Callable, Iterator
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from weir.container.stream_messages import (
    ENVELOPE_SCHEMA,
    PARTITION_FILTER_ERROR,
    WINDOW_GAP_ERROR,
    Kind,
    Message,
    PartitionKeyMissing,
    WindowGap,
    to_envelope,
)
from weir.operators.partitioning import PartitionFilter
from weir.proto.contract import AUTH_HEADER, BEARER

__all__ = ["FlightService", "SecretCheck", "Streams", "filtered", "parse_ticket"]


class Streams(Protocol):
    """What the Flight face serves: the buffer server's subscriptions."""

    def messages(self, stream_id: str, from_window: int,
                 partition: PartitionFilter | None = None, *, latest: bool = False,
                 generation: int = 0, cancelled: Callable[[], bool] = ...,
                 who: str = ...) -> Iterator[list[Message]]: ...

_LOGGER = logging.getLogger("weir.container.buffer_server")


class SecretCheck(flight.ServerMiddlewareFactory):
    """Refuses every Flight call (``do_get``, ``list_flights``, any) without the secret."""

    def __init__(self, secret: str) -> None:
        super().__init__()
        self._expected = (BEARER + secret).encode()

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[str]]) -> None:
        for value in headers.get(AUTH_HEADER, ()):
            if isinstance(value, str) and hmac.compare_digest(value.encode(), self._expected):
                return None
        raise flight.FlightUnauthenticatedError(
            "this buffer server needs the master's secret on every call")


class FlightService(flight.FlightServerBase):
    """The Flight face of a buffer server (``Streams``): ``do_get`` only."""

    def __init__(self, owner: Streams, location: str, secret: str | None,
                 tls: tuple[bytes, bytes] | None) -> None:
        super().__init__(
            location, middleware={"auth": SecretCheck(secret)} if secret else None,
            tls_certificates=[flight.CertKeyPair(cert=tls[0], key=tls[1])] if tls else None)
        self._owner = owner

    def do_get(self, context: flight.ServerCallContext,
               ticket: flight.Ticket) -> flight.FlightDataStream:
        stream_id, from_window, partition, latest, generation = parse_ticket(ticket.ticket)
        _LOGGER.debug("subscriber %s: stream %s from window %d%s%s", context.peer(), stream_id,
                      from_window, " or the latest" if latest else "",
                      f", partition {partition}" if partition else "")
        messages = self._owner.messages(stream_id, from_window, partition, latest=latest,
                                        generation=generation, cancelled=context.is_cancelled,
                                        who=context.peer())
        return flight.GeneratorStream(ENVELOPE_SCHEMA, _envelopes(messages))


def _envelopes(messages: Iterator[list[Message]]) -> Iterator[pa.RecordBatch]:
    """A subscription's messages as envelope batches; its errors as Flight errors the
    subscriber tells apart (``container.buffer_client``)."""
    with contextlib.closing(messages):
        try:
            for some in messages:
                yield to_envelope(some)
        except WindowGap as exc:
            raise flight.FlightServerError(f"{WINDOW_GAP_ERROR} {exc}") from exc
        except PartitionKeyMissing as exc:
            raise flight.FlightServerError(str(exc)) from exc


def parse_ticket(raw: bytes) -> tuple[str, int, PartitionFilter | None, bool, int]:
    try:
        request = json.loads(raw)
        stream_id = request["stream"]
        from_window = request.get("from_window", -1)
        latest = request.get("latest", False)
        generation = request.get("generation", 0)
        if not isinstance(stream_id, str) or not isinstance(from_window, int) \
                or not isinstance(latest, bool) or not isinstance(generation, int):
            raise TypeError("'stream' must be a string, 'from_window' and 'generation' "
                            "integers and 'latest' a boolean")
        partition = request.get("partition")
        if partition is not None:
            partition = PartitionFilter.from_json(partition)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise flight.FlightServerError(f"bad buffer-server ticket {raw[:200]!r}: {exc}") from exc
    return stream_id, from_window, partition, latest, generation


def filtered(messages: list[Message], partition: PartitionFilter) -> list[Message]:
    """The partition's rows of each DATA message; markers as they are, empty batches
    dropped (the same batches are dropped on every replay, so positions stay stable)."""
    out: list[Message] = []
    for message in messages:
        if message.kind != Kind.DATA:
            out.append(message)
            continue
        try:
            batch = message.batch()
            batch = batch.filter(pa.array(partition.owns_buckets(buckets(message, batch,
                                                                          partition))))
        except (KeyError, TypeError) as exc:
            raise PartitionKeyMissing(f"{PARTITION_FILTER_ERROR} {exc}") from exc
        if batch.num_rows:
            out.append(Message.data(message.window_id, batch))
    return out


def buckets(message: Message, batch: pa.RecordBatch, partition: PartitionFilter
             ) -> np.ndarray:
    """The batch's hash buckets under the partition's column and mask, hashed once for all
    the partitions that subscribe (cached on the message; racing threads compute the same)."""
    key = (partition.column, partition.mask)
    cache = message.buckets
    if cache is None:
        cache = {}
        object.__setattr__(message, "buckets", cache)  # a cache, not part of its value
    buckets = cache.get(key)
    if buckets is None:
        buckets = cache[key] = partition.buckets_of(batch)
    return buckets

"""gRPC plumbing shared by the master's services, server and client: options, message-size
limits and error mapping."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError

from weir.master.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    MasterError,
    NotFound,
    Unavailable,
)

__all__ = [
    "LOADING_MESSAGE",
    "STOPPED_MESSAGE",
    "UnavailableInterceptor",
    "GRPC_OPTIONS",
    "MAX_MESSAGE_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_SUBMIT_BYTES",
    "SERVER_OPTIONS",
    "RequestGuard",
    "rpc_errors",
]

_LOGGER = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""Largest message the master sends and clients receive: heartbeat answers carry deploy
requests with pickled operators."""

MAX_SUBMIT_BYTES = 64 * 1024 * 1024
"""Largest request the master reads: a submitted DAG with its pickled operators."""

MAX_REQUEST_BYTES = 4 * 1024 * 1024
"""Largest request of every other call (heartbeats, logs, queries): far above a real one
(a heartbeat of a container with dozens of operators is a few kB)."""

_REQUEST_LIMITS = {"/weir.v1.WeirClient/SubmitApplication": MAX_SUBMIT_BYTES}

GRPC_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_SUBMIT_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_http_proxy", 0),  # the master is reached directly, never through a proxy
]
"""Options of clients' channels to the master."""

SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_SUBMIT_BYTES),  # gRPC refuses more unread
    ("grpc.so_reuseport", 0),  # a second master on a busy port must fail, not share it
]


class _Refused:
    """Stands in for a request that is not parsed (too large) or cannot be (malformed);
    its handler refuses it with ``code`` and ``reason``."""

    __slots__ = ("code", "reason")

    def __init__(self, code: grpc.StatusCode, reason: str) -> None:
        self.code, self.reason = code, reason


LOADING_MESSAGE = "the master is loading its journal; retry in a moment"
STOPPED_MESSAGE = "the master stopped:"
"""How the reason a master halted begins (it answers UNAVAILABLE with it)."""


class UnavailableInterceptor(grpc.ServerInterceptor):
    """Answers UNAVAILABLE, unread, while ``reason()`` names why the master cannot serve:
    it is reading its journal back (``LOADING_MESSAGE``), or it stopped because it could
    not write it.

    Kafka's offset manager does the same while it loads its log: callers retry (the
    containers' umbilical client and ``weir`` both do) instead of reading half a state.
    """

    def __init__(self, reason: Callable[[], str]) -> None:
        self._reason = reason

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        reason = self._reason()
        if not reason:
            return continuation(handler_call_details)

        def refuse(requests: Any, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAVAILABLE, reason)

        return grpc.stream_unary_rpc_method_handler(refuse)


class RequestGuard(grpc.ServerInterceptor):
    """Refuses requests above their method's limit, unparsed (RESOURCE_EXHAUSTED), and
    requests that are not valid messages (INVALID_ARGUMENT, with protobuf's reason).

    gRPC's own receive limit is one number for the whole server and must admit a large
    submitted DAG; this holds every other call (a heartbeat above all, which the master
    would otherwise parse and store) to ``MAX_REQUEST_BYTES``. Without it, bytes that do
    not parse would be answered INTERNAL ("Exception deserializing request!"), blaming
    the master for the caller's mistake.
    """

    def __init__(self, limits: dict[str, int] | None = None,
                 default_limit: int = MAX_REQUEST_BYTES) -> None:
        self._limits = dict(_REQUEST_LIMITS if limits is None else limits)
        self._default = default_limit
        self._wrapped: dict[str, tuple[Any, Any]] = {}  # method -> (handler, wrapped)

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or handler.request_streaming or handler.response_streaming:
            return handler
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(method, handler, self._limits.get(method, self._default))
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    @staticmethod
    def _wrap(method: str, handler: Any, limit: int) -> Any:
        parse = handler.request_deserializer
        behaviour = handler.unary_unary

        name = method.rsplit("/", 1)[-1]

        def deserialize(raw: bytes) -> Any:
            if len(raw) > limit:
                return _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{name} request of {len(raw)} bytes is over the master's "
                                f"limit of {limit} bytes")
            try:
                return parse(raw) if parse else raw
            except DecodeError as exc:
                return _Refused(grpc.StatusCode.INVALID_ARGUMENT,
                                f"{name} request of {len(raw)} bytes is not a valid message "
                                f"({exc}); send one built from proto/*.proto")

        def call(request: Any, context: grpc.ServicerContext) -> Any:
            if isinstance(request, _Refused):
                _LOGGER.warning("refused %s from %s: %s", method, context.peer(),
                                request.reason)
                context.abort(request.code, request.reason)
            return behaviour(request, context)

        return grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=deserialize,
            response_serializer=handler.response_serializer)


_CODES: list[tuple[type[MasterError], grpc.StatusCode]] = [
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
]

_F = TypeVar("_F", bound=Callable[..., Any])


def rpc_errors(method: _F) -> _F:
    """Turns the core's errors into gRPC status codes with their one-line message."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except MasterError as exc:
            code = next((c for kind, c in _CODES if isinstance(exc, kind)),
                        grpc.StatusCode.FAILED_PRECONDITION)
            context.abort(code, str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug must still answer the caller
            _LOGGER.exception("%s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL,
                          f"internal error in the master: {type(exc).__name__}: {exc}")

    return wrapper  # type: ignore[return-value]

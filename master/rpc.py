"""gRPC plumbing shared by the master's services, server and client: options and error mapping."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from master.errors import FailedPrecondition, InvalidArgument, MasterError, NotFound

__all__ = ["GRPC_OPTIONS", "MAX_MESSAGE_BYTES", "SERVER_OPTIONS", "rpc_errors"]

_LOGGER = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""Submitted DAGs and deploy requests carry pickled operators: allow large messages."""

GRPC_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_http_proxy", 0),  # the master is reached directly, never through a proxy
]

SERVER_OPTIONS: list[tuple[str, Any]] = [
    *GRPC_OPTIONS,
    ("grpc.so_reuseport", 0),  # a second master on a busy port must fail, not share it
]

_CODES: list[tuple[type[MasterError], grpc.StatusCode]] = [
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
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

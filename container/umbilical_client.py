"""The container's side of the umbilical: gRPC calls with deadlines and retry with backoff,
each carrying the master's secret."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from proto import umbilical_pb2, umbilical_pb2_grpc

__all__ = ["MasterUnreachable", "UmbilicalClient"]

_LOGGER = logging.getLogger(__name__)
_T = TypeVar("_T")
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
# Deploy requests carry pickled operators: allow large answers; never go through a proxy.
# (The master refuses requests above its own limits, with a message naming them.)
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.enable_http_proxy", 0),
]
AUTH_HEADER = "authorization"
"""The master wants ``authorization: Bearer <secret>`` on every call (``master.auth``)."""


class MasterUnreachable(ConnectionError):
    """The master did not answer within the retry window."""


class UmbilicalClient:
    """Calls the master; each call has a deadline and is retried while the master is away.

    Args:
        address: the master's ``host:port``.
        call_timeout_s: deadline of one call.
        retry_window_s: how long a call keeps retrying an unreachable master before giving up.
        secret: the master's secret, sent with every call (a master refuses calls without).
        tls_root_certs: talk TLS, trusting these PEM certificates; plaintext if None.
    """

    def __init__(self, address: str, *, call_timeout_s: float = 5.0,
                 retry_window_s: float = 30.0, secret: str | None = None,
                 tls_root_certs: bytes | None = None) -> None:
        self.address = address
        self.call_timeout_s = call_timeout_s
        self.retry_window_s = retry_window_s
        self._metadata = ((AUTH_HEADER, f"Bearer {secret}"),) if secret else ()
        if tls_root_certs is None:
            self._channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        else:
            self._channel = grpc.secure_channel(
                address, grpc.ssl_channel_credentials(root_certificates=tls_root_certs),
                options=_CHANNEL_OPTIONS)
        self._stub = umbilical_pb2_grpc.StreamingContainerUmbilicalStub(self._channel)

    def _call(self, what: str, fn: Callable[..., _T], request: object) -> _T:
        deadline = time.monotonic() + self.retry_window_s
        delay_s = 0.1
        while True:
            try:
                return fn(request, timeout=self.call_timeout_s, metadata=self._metadata)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code not in _RETRYABLE or time.monotonic() + delay_s > deadline:
                    if code in _RETRYABLE:
                        raise MasterUnreachable(
                            f"master {self.address} did not answer {what} for "
                            f"{self.retry_window_s:.0f} s"
                        ) from None
                    raise
                _LOGGER.debug("%s to %s failed (%s); retrying in %.1f s", what, self.address,
                              code, delay_s)
                time.sleep(delay_s)
                delay_s = min(delay_s * 2, 2.0)

    def get_init_context(self, container_id: str) -> umbilical_pb2.StreamingContainerContext:
        request = umbilical_pb2.GetInitContextRequest(container_id=container_id)
        return self._call("GetInitContext", self._stub.GetInitContext, request)

    def heartbeat(self, heartbeat: umbilical_pb2.ContainerHeartbeat
                  ) -> umbilical_pb2.ContainerHeartbeatResponse:
        return self._call("ProcessHeartbeat", self._stub.ProcessHeartbeat, heartbeat)

    def log(self, container_id: str, msg: str) -> None:
        self._call("Log", self._stub.Log,
                   umbilical_pb2.LogRequest(container_id=container_id, msg=msg))

    def report_error(self, container_id: str, operators: list[int], msg: str) -> None:
        request = umbilical_pb2.ReportErrorRequest(container_id=container_id,
                                                   operators=operators, msg=msg)
        self._call("ReportError", self._stub.ReportError, request)

    def close(self) -> None:
        self._channel.close()

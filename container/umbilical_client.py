"""The container's side of the umbilical: gRPC calls with deadlines and retry with backoff,
each carrying the master's secret."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import grpc

from weir.proto import umbilical_pb2, umbilical_pb2_grpc
from weir.proto.contract import bearer_metadata, grpc_tls_options, pinned_server_name

__all__ = ["MasterUnreachable", "UmbilicalClient"]

_LOGGER = logging.getLogger(__name__)
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
_BUSY = "Concurrent RPC limit exceeded"  # gRPC's RESOURCE_EXHAUSTED of a master at its limit
# Deploy requests carry pickled operators: allow large answers; never go through a proxy.
# (The master refuses requests above its own limits, with a message naming them.)
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.enable_http_proxy", 0),
]


class MasterUnreachable(ConnectionError):
    """The master did not answer within the retry window."""


class UmbilicalClient:
    """Calls the master; each call has a deadline and is retried while the master is away.

    Args:
        address: the master's ``host:port``.
        call_timeout_s: deadline of one call.
        retry_window_s: how long a call keeps retrying an unreachable master before giving up.
        secret: the master's secret, sent with every call (a master refuses calls without).
        tls_root_certs: the PEM certificates the master must prove (TLS) before anything,
            the secret included, is sent.
        address_file: the master's ``master.json`` (its state folder): re-read while the
            master is away, since a restarted master may listen elsewhere.
    """

    def __init__(self, address: str, *, call_timeout_s: float = 5.0,
                 retry_window_s: float = 30.0, secret: str | None = None,
                 tls_root_certs: bytes, address_file: str | None = None) -> None:
        self.address = address
        self.call_timeout_s = call_timeout_s
        self.retry_window_s = retry_window_s
        self.address_file = address_file
        self._metadata = bearer_metadata(secret)
        self._credentials = grpc.ssl_channel_credentials(root_certificates=tls_root_certs)
        self._options = [*_CHANNEL_OPTIONS,
                         *grpc_tls_options(pinned_server_name(tls_root_certs))]
        self._connect(address)

    def _connect(self, address: str) -> None:
        self.address = address
        self._channel = grpc.secure_channel(address, self._credentials, options=self._options)
        self._stub = umbilical_pb2_grpc.StreamingContainerUmbilicalStub(self._channel)

    def _follow_address_file(self) -> None:
        """Reconnects if the master's address file names another address (it restarted)."""
        if not self.address_file:
            return
        try:
            with open(self.address_file, encoding="utf-8") as f:
                address = str(json.load(f)["address"])
        except (OSError, ValueError, KeyError, TypeError):
            return  # not written yet, or being replaced: try again on the next retry
        if address and address != self.address:
            _LOGGER.info("the master moved from %s to %s (its %s); reconnecting",
                         self.address, address, self.address_file)
            self._channel.close()
            self._connect(address)

    def _call(self, what: str, request: Any) -> Any:
        """Calls method ``what`` of the umbilical (looked up on the current channel)."""
        deadline = time.monotonic() + self.retry_window_s
        delay_s = 0.1
        while True:
            try:
                return getattr(self._stub, what)(request, timeout=self.call_timeout_s,
                                               metadata=self._metadata)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED and _BUSY in (
                        exc.details() or ""):
                    code = grpc.StatusCode.UNAVAILABLE  # busy, not refused: try again
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
                self._follow_address_file()
                delay_s = min(delay_s * 2, 2.0)

    def get_init_context(self, container_id: str) -> umbilical_pb2.StreamingContainerContext:
        request = umbilical_pb2.GetInitContextRequest(container_id=container_id)
        return self._call("GetInitContext", request)

    def heartbeat(self, heartbeat: umbilical_pb2.ContainerHeartbeat
                  ) -> umbilical_pb2.ContainerHeartbeatResponse:
        return self._call("ProcessHeartbeat", heartbeat)

    def log(self, container_id: str, msg: str) -> None:
        self._call("Log",
                   umbilical_pb2.LogRequest(container_id=container_id, msg=msg))

    def report_error(self, container_id: str, operators: list[int], msg: str,
                     generation: int = 0) -> None:
        request = umbilical_pb2.ReportErrorRequest(container_id=container_id,
                                                   operators=operators, msg=msg,
                                                   generation=generation)
        self._call("ReportError", request)

    def close(self) -> None:
        self._channel.close()

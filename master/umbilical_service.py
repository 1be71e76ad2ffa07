"""The umbilical gRPC service: containers' calls in, the master core's answers out."""

from __future__ import annotations

import logging

import grpc

from weir.master.core import MasterCore
from weir.master.rpc import rpc_errors
from weir.proto import umbilical_pb2, umbilical_pb2_grpc

__all__ = ["UmbilicalService"]

_LOGGER = logging.getLogger(__name__)


class UmbilicalService(umbilical_pb2_grpc.StreamingContainerUmbilicalServicer):
    """Thin: proto in, ``MasterCore`` call, proto out.

    ``buffer_server_tls``: the master's TLS identity, handed to each container in its
    init context (only a caller that proved the secret, over TLS, gets there).
    """

    def __init__(self, core: MasterCore,
                 buffer_server_tls: umbilical_pb2.TlsIdentity | None = None) -> None:
        self.core = core
        self.buffer_server_tls = buffer_server_tls

    @rpc_errors
    def GetInitContext(self, request: umbilical_pb2.GetInitContextRequest,
                       context: grpc.ServicerContext) -> umbilical_pb2.StreamingContainerContext:
        reply = self.core.init_context(request.container_id)
        if self.buffer_server_tls is not None:
            reply.buffer_server_tls.CopyFrom(self.buffer_server_tls)
        return reply

    @rpc_errors
    def Log(self, request: umbilical_pb2.LogRequest,
            context: grpc.ServicerContext) -> umbilical_pb2.LogResponse:
        self.core.log(request.container_id, request.msg)
        return umbilical_pb2.LogResponse()

    @rpc_errors
    def ReportError(self, request: umbilical_pb2.ReportErrorRequest,
                    context: grpc.ServicerContext) -> umbilical_pb2.ReportErrorResponse:
        self.core.report_error(request.container_id, list(request.operators), request.msg,
                               request.generation)
        return umbilical_pb2.ReportErrorResponse()

    @rpc_errors
    def ProcessHeartbeat(self, request: umbilical_pb2.ContainerHeartbeat,
                         context: grpc.ServicerContext
                         ) -> umbilical_pb2.ContainerHeartbeatResponse:
        return self.core.heartbeat(request)

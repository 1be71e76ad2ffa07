"""The client gRPC service: users' requests in, the master core's answers out."""

from __future__ import annotations

import logging

import grpc

from weir.master.container_logs import log_tail
from weir.master.core import MasterCore
from weir.master.errors import NotFound
from weir.master.rpc import rpc_errors
from weir.proto import client_pb2, client_pb2_grpc

__all__ = ["ClientService"]

_LOGGER = logging.getLogger(__name__)


class ClientService(client_pb2_grpc.WeirClientServicer):
    """Thin: proto in, ``MasterCore`` call, proto out."""

    def __init__(self, core: MasterCore) -> None:
        self.core = core

    @rpc_errors
    def SubmitApplication(self, request: client_pb2.SubmitApplicationRequest,
                          context: grpc.ServicerContext) -> client_pb2.SubmitApplicationResponse:
        app_id = self.core.submit(request.dag, dict(request.attribute_overrides),
                                  from_savepoint=request.from_savepoint,
                                  allow_dropped=request.allow_dropped,
                                  app_id=request.application_id)
        return client_pb2.SubmitApplicationResponse(application_id=app_id)

    @rpc_errors
    def ListApplications(self, request: client_pb2.ListApplicationsRequest,
                         context: grpc.ServicerContext) -> client_pb2.ListApplicationsResponse:
        return client_pb2.ListApplicationsResponse(applications=self.core.list_applications())

    @rpc_errors
    def GetApplicationInfo(self, request: client_pb2.GetApplicationInfoRequest,
                           context: grpc.ServicerContext) -> client_pb2.ApplicationInfo:
        return self.core.application_info(request.application_id, brief=request.brief)

    @rpc_errors
    def ListContainers(self, request: client_pb2.ListContainersRequest,
                       context: grpc.ServicerContext) -> client_pb2.ListContainersResponse:
        return client_pb2.ListContainersResponse(
            containers=self.core.list_containers(request.application_id))

    @rpc_errors
    def ListOperators(self, request: client_pb2.ListOperatorsRequest,
                      context: grpc.ServicerContext) -> client_pb2.ListOperatorsResponse:
        return client_pb2.ListOperatorsResponse(
            operators=self.core.list_operators(request.application_id))

    @rpc_errors
    def GetOperatorStats(self, request: client_pb2.GetOperatorStatsRequest,
                         context: grpc.ServicerContext) -> client_pb2.OperatorInfo:
        return self.core.operator_info(request.application_id, request.operator)

    @rpc_errors
    def KillContainer(self, request: client_pb2.KillContainerRequest,
                      context: grpc.ServicerContext) -> client_pb2.KillContainerResponse:
        replacement = self.core.kill_container(request.container_id)
        return client_pb2.KillContainerResponse(replacement_id=replacement)

    @rpc_errors
    def Repartition(self, request: client_pb2.RepartitionRequest,
                    context: grpc.ServicerContext) -> client_pb2.RepartitionResponse:
        result = self.core.repartition(request.application_id, request.operator,
                                       request.partitions)
        return client_pb2.RepartitionResponse(partitions=result.new,
                                              start_window_id=result.start_window_id,
                                              message=result.describe())

    @rpc_errors
    def GetContainerLog(self, request: client_pb2.ContainerLogRequest,
                        context: grpc.ServicerContext) -> client_pb2.ContainerLogResponse:
        known = {c.id for c in self.core.list_containers(request.application_id)}
        if request.container_id not in known:
            raise NotFound(f"application {request.application_id} has no container "
                           f"{request.container_id!r}; its containers are {sorted(known)}")
        text, truncated, path = log_tail(self.core.launcher, request.container_id,
                                         request.max_bytes)
        return client_pb2.ContainerLogResponse(text=text, truncated=truncated, path=path)

    @rpc_errors
    def ShutdownApplication(self, request: client_pb2.ShutdownApplicationRequest,
                            context: grpc.ServicerContext
                            ) -> client_pb2.ShutdownApplicationResponse:
        self.core.shutdown_application(request.application_id)
        return client_pb2.ShutdownApplicationResponse()

    @rpc_errors
    def TakeSavepoint(self, request: client_pb2.SavepointRequest,
                      context: grpc.ServicerContext) -> client_pb2.SavepointResponse:
        self.core.take_savepoint(request.application_id, request.path, request.stop)
        return client_pb2.SavepointResponse()

    @rpc_errors
    def KillApplication(self, request: client_pb2.KillApplicationRequest,
                        context: grpc.ServicerContext) -> client_pb2.KillApplicationResponse:
        self.core.kill_application(request.application_id, request.reason)
        return client_pb2.KillApplicationResponse()

"""A small client of the master's client API: deadlines on every call, one-line errors.

>>> parse_address("localhost:5151")
('localhost', 5151)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import grpc

from master.rpc import GRPC_OPTIONS
from proto import client_pb2, client_pb2_grpc, plan_pb2

__all__ = ["DEFAULT_MASTER", "WeirClient", "WeirClientError", "default_master", "parse_address"]

_LOGGER = logging.getLogger(__name__)
_T = TypeVar("_T")

DEFAULT_MASTER = "127.0.0.1:5151"
"""Where ``weir`` looks for a master unless told otherwise (``--master``, ``WEIR_MASTER``)."""


class WeirClientError(Exception):
    """A request failed; the message is one line for the user."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


def default_master() -> str:
    return os.environ.get("WEIR_MASTER") or DEFAULT_MASTER


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` as a pair; raises WeirClientError on anything else."""
    host, sep, port = address.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise WeirClientError(f"bad master address {address!r}: expected HOST:PORT")
    return host, int(port)


class WeirClient:
    """Calls a master's client API.

    Args:
        address: the master's ``HOST:PORT``.
        timeout_s: deadline of each call.

    Raises:
        WeirClientError: on a malformed address (here) or any failed call (later).
    """

    def __init__(self, address: str, *, timeout_s: float = 10.0) -> None:
        host, port = parse_address(address)
        self.address = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(self.address, options=GRPC_OPTIONS)
        self._stub = client_pb2_grpc.WeirClientStub(self._channel)

    def _call(self, method: Callable[..., _T], request: Any) -> _T:
        try:
            return method(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def _error(self, exc: grpc.RpcError) -> WeirClientError:
        code = exc.code() if hasattr(exc, "code") else None
        details = (exc.details() if hasattr(exc, "details") else "") or str(code)
        if code == grpc.StatusCode.UNAVAILABLE:
            return WeirClientError(f"no master answers at {self.address}; start one with "
                                   "`weir master` or pass --master", code)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return WeirClientError(f"no answer from the master at {self.address} within "
                                   f"{self.timeout_s:g} s; is it running there? start one "
                                   "with `weir master` or pass --master", code)
        return WeirClientError(details.splitlines()[0] if details else str(code), code)

    def submit(self, dag: plan_pb2.DagDescriptor,
               overrides: Mapping[str, str] | None = None) -> str:
        """Submits a DAG; returns the application id."""
        request = client_pb2.SubmitApplicationRequest(dag=dag,
                                                      attribute_overrides=dict(overrides or {}))
        return self._call(self._stub.SubmitApplication, request).application_id

    def applications(self) -> list[client_pb2.ApplicationInfo]:
        response = self._call(self._stub.ListApplications, client_pb2.ListApplicationsRequest())
        return list(response.applications)

    def application(self, app_id: str) -> client_pb2.ApplicationInfo:
        return self._call(self._stub.GetApplicationInfo,
                          client_pb2.GetApplicationInfoRequest(application_id=app_id))

    def containers(self, app_id: str = "") -> list[client_pb2.ContainerInfo]:
        response = self._call(self._stub.ListContainers,
                              client_pb2.ListContainersRequest(application_id=app_id))
        return list(response.containers)

    def operators(self, app_id: str) -> list[client_pb2.OperatorInfo]:
        response = self._call(self._stub.ListOperators,
                              client_pb2.ListOperatorsRequest(application_id=app_id))
        return list(response.operators)

    def operator_stats(self, app_id: str, operator: str | int) -> client_pb2.OperatorInfo:
        """One operator (by name or physical id) with its recent windows."""
        return self._call(self._stub.GetOperatorStats, client_pb2.GetOperatorStatsRequest(
            application_id=app_id, operator=str(operator)))

    def kill_container(self, container_id: str) -> str:
        """Kills the container; returns the id of the container replacing it ("" if none)."""
        response = self._call(self._stub.KillContainer,
                              client_pb2.KillContainerRequest(container_id=container_id))
        return response.replacement_id

    def shutdown(self, app_id: str) -> None:
        self._call(self._stub.ShutdownApplication,
                   client_pb2.ShutdownApplicationRequest(application_id=app_id))

    def kill(self, app_id: str, reason: str = "") -> None:
        self._call(self._stub.KillApplication,
                   client_pb2.KillApplicationRequest(application_id=app_id, reason=reason))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> WeirClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

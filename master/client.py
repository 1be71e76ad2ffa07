"""A small client of the master's client API: deadlines on every call, the master's secret
on every call, one-line errors.

>>> parse_address("localhost:5151")
('localhost', 5151)
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc

from weir.master import auth
from weir.master.rpc import GRPC_OPTIONS, LOADING_MESSAGE, STOPPED_MESSAGE
from weir.master.tls import open_channel
from weir.proto import client_pb2, client_pb2_grpc, plan_pb2
from weir.proto.contract import SECRET_ENV, bearer_metadata

__all__ = ["DEFAULT_MASTER", "WeirClient", "WeirClientError", "default_master", "parse_address"]

_LOGGER = logging.getLogger(__name__)
_T = TypeVar("_T")
_RUNNING_STATES = ("ACCEPTED", "RUNNING")
_HANDSHAKE_FAILED = "CERTIFICATE_VERIFY_FAILED"  # in gRPC's details: the peer proved nothing
_CALL_DEADLINE = "Deadline Exceeded"  # gRPC's own details: this call's deadline passed (the
# master's DEADLINE_EXCEEDED, a store it waited for, says which in its details)

DEFAULT_MASTER = "127.0.0.1:5151"
"""Where ``weir`` looks for a master unless told otherwise (``--master``, ``WEIR_MASTER``)."""


class _Describable(Protocol):
    """What ``submit`` takes besides a descriptor: a ``weir.operators.Dag``."""

    def to_descriptor(self) -> plan_pb2.DagDescriptor: ...


class WeirClientError(Exception):
    """A request failed; the message is one line for the user."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


def default_master() -> str:
    """``$WEIR_MASTER``; else ``DEFAULT_MASTER`` if a master answers there; else the one
    master of this machine and user that answers on its port (a ``weir run`` in another
    terminal: its embedded master takes any free port); else ``DEFAULT_MASTER``.

    Raises:
        WeirClientError: several of this user's masters answer: which one is meant (a
            submit must not deploy on a benchmark's master) is the user's to say.
    """
    return find_master()[0]


def find_master() -> tuple[str, str]:
    """``default_master()`` and how it was found, in words (for a command that changes
    something to say which master it changes); "" when no master answers (the default
    address, where the call will fail saying so)."""
    configured = os.environ.get("WEIR_MASTER")
    if configured:
        return configured, "from $WEIR_MASTER"
    if _answers(DEFAULT_MASTER):
        return DEFAULT_MASTER, "the default address"
    answering = [a for a in auth.local_master_addresses() if a != DEFAULT_MASTER
                 and _answers(a)]
    if len(answering) > 1:
        raise WeirClientError(
            f"{len(answering)} masters of yours answer on this machine "
            f"({', '.join(answering)}, newest first) and none on {DEFAULT_MASTER}: say which "
            "one with --master HOST:PORT or $WEIR_MASTER")
    if answering:
        return answering[0], "the one master of yours answering on this machine"
    return DEFAULT_MASTER, ""


def _answers(address: str, timeout_s: float = 0.3) -> bool:
    """Whether something accepts connections at ``address`` (a secret file outlives a
    master killed with SIGKILL; its port is then closed)."""
    try:
        host, port = parse_address(address)
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except (OSError, WeirClientError):
        return False


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` as a pair; raises WeirClientError on anything else."""
    host, sep, port = address.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdecimal() or not 0 < int(port) < 65536:
        raise WeirClientError(f"bad master address {address!r}: expected HOST:PORT")
    return host, int(port)


class WeirClient:
    """Calls a master's client API.

    Args:
        address: the master's ``HOST:PORT``.
        timeout_s: deadline of each call.
        secret: the master's secret; by default ``$WEIR_SECRET``, else the secret file
            of a master on this machine (``auth.client_credentials``).
        secret_file: a file holding the master's secret, instead of ``secret``.
        tls_ca: the certificates (PEM file) the master must prove before the secret is
            sent; by default ``$WEIR_TLS_CA``, else the ones in the master's secret file
            (given, or found on this machine); none found is an error.
        loading_wait_s: how long calls retry while a restarted master loads its journal.
        on_loading: told each time a call is retried for that (the CLI prints a line).

    Raises:
        WeirClientError: on a malformed address or unreadable secret file (here) or any
            failed call (later).
    """

    def __init__(self, address: str, *, timeout_s: float = 10.0, secret: str | None = None,
                 secret_file: str | Path | None = None,
                 tls_ca: str | Path | None = None, loading_wait_s: float = 60.0,
                 on_loading: Callable[[str], None] | None = None) -> None:
        host, port = parse_address(address)
        self.loading_wait_s = loading_wait_s
        self.on_loading = on_loading
        self.address = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        self.timeout_s = timeout_s
        try:
            self.credentials = auth.client_credentials(self.address, secret=secret,
                                                       secret_file=secret_file, tls_ca=tls_ca)
            roots = self.credentials.tls_roots
            # without a certificate nothing is sent; calls say why (or that nobody is there)
            self._channel = (open_channel(self.address, roots, GRPC_OPTIONS)
                             if roots is not None else None)
        except (OSError, ValueError) as exc:
            raise WeirClientError(str(exc)) from None
        self._metadata = bearer_metadata(self.credentials.secret)
        self._stub_made = (client_pb2_grpc.WeirClientStub(self._channel)
                           if self._channel is not None else None)

    @property
    def _stub(self) -> client_pb2_grpc.WeirClientStub:
        if self._stub_made is None:
            raise self._no_certificate()
        return self._stub_made

    def _no_certificate(self) -> WeirClientError:
        """Why no call is made: nobody listens there, or nothing proves it is the master."""
        host, port = parse_address(self.address)
        try:
            socket.create_connection((host, port), timeout=min(self.timeout_s, 5.0)).close()
        except OSError:
            return WeirClientError(f"no master answers at {self.address}; start one with "
                                   "`weir master` or pass --master",
                                   grpc.StatusCode.UNAVAILABLE)
        try:
            self.credentials.require_roots(self.address)
        except ValueError as exc:
            return WeirClientError(str(exc))
        raise AssertionError("unreachable: roots are present")

    def _call(self, method: Callable[..., _T], request: Any) -> _T:
        deadline = time.monotonic() + self.loading_wait_s
        while True:
            try:
                return method(request, timeout=self.timeout_s, metadata=self._metadata)
            except grpc.RpcError as exc:
                details = exc.details() if hasattr(exc, "details") else ""
                if details != LOADING_MESSAGE or time.monotonic() >= deadline:
                    raise self._error(exc) from None
                if self.on_loading is not None:
                    self.on_loading(details)
                time.sleep(0.5)

    def _error(self, exc: grpc.RpcError) -> WeirClientError:
        code = exc.code() if hasattr(exc, "code") else None
        details = (exc.details() if hasattr(exc, "details") else "") or str(code)
        if details == LOADING_MESSAGE:
            return WeirClientError(f"the master at {self.address} is still loading its journal "
                                   f"after {self.loading_wait_s:g} s; try again", code)
        if code == grpc.StatusCode.UNAVAILABLE and _HANDSHAKE_FAILED in details:
            return WeirClientError(
                f"the server at {self.address} did not prove the master's certificate (from "
                f"{self.credentials.source or 'the trusted certificates given'}), so the "
                "secret was not sent: is another program, or another master, listening "
                "there?", code)
        if code == grpc.StatusCode.UNAVAILABLE and details.startswith(STOPPED_MESSAGE):
            return WeirClientError(f"the master at {self.address}: {details}", code)
        if code == grpc.StatusCode.UNAVAILABLE:
            return WeirClientError(f"no master answers at {self.address}; start one with "
                                   "`weir master` or pass --master", code)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "Concurrent RPC limit" in details:
            return WeirClientError(f"the master at {self.address} is busy (at its limit of "
                                   "calls in progress); try again", code)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and details == _CALL_DEADLINE:
            return WeirClientError(f"no answer from the master at {self.address} within "
                                   f"{self.timeout_s:g} s; is it running there? start one "
                                   "with `weir master` or pass --master", code)
        if code == grpc.StatusCode.UNAUTHENTICATED:
            have = (f"the secret from {self.credentials.source} was refused"
                    if self.credentials.secret else "no secret for it was found")
            return WeirClientError(f"the master at {self.address} refused the call: {have}; "
                                   f"{SECRET_ENV} or --secret-file give it", code)
        return WeirClientError(details.splitlines()[0] if details else str(code), code)

    def submit(self, dag: plan_pb2.DagDescriptor | _Describable,
               overrides: Mapping[str, str] | None = None, *, from_savepoint: str = "",
               allow_dropped: bool = False) -> str:
        """Submits a DAG (a ``weir.operators.Dag``, or its descriptor); returns the
        application id.

        Args:
            overrides: attributes (``NAME`` or ``OPERATOR.NAME``) over the DAG's own.
            from_savepoint: its operators start from that savepoint's state, matched by
                name.
            allow_dropped: the savepoint's operators that the DAG lacks leave their state
                behind instead of refusing the submit.
        """
        if not isinstance(dag, plan_pb2.DagDescriptor):
            dag = dag.to_descriptor()  # a Dag: the master never imports the SDK's classes
        request = client_pb2.SubmitApplicationRequest(
            dag=dag, attribute_overrides=dict(overrides or {}), from_savepoint=from_savepoint,
            allow_dropped=allow_dropped)
        return self._call(self._stub.SubmitApplication, request).application_id

    def container_log(self, app_id: str, container_id: str, max_bytes: int = 0
                      ) -> client_pb2.ContainerLogResponse:
        """The end of a container's log (the master keeps them with ``--log-dir``)."""
        return self._call(self._stub.GetContainerLog, client_pb2.ContainerLogRequest(
            application_id=app_id, container_id=container_id, max_bytes=max_bytes))

    def take_savepoint(self, app_id: str, path: str, *, stop: bool = False) -> None:
        """Asks for a savepoint of the application at ``path``: while it runs on, or with
        ``stop``, finishing it (then ``wait`` for it). ``savepoint_state`` of its info
        says "writing", "complete", or why it is not."""
        self._call(self._stub.TakeSavepoint, client_pb2.SavepointRequest(
            application_id=app_id, path=path, stop=stop))

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

    def repartition(self, app_id: str, operator: str, partitions: int
                    ) -> client_pb2.RepartitionResponse:
        """Gives a running operator ``partitions`` partitions (new ones start from the old
        ones' minimum recovery checkpoint, with their keyed state)."""
        return self._call(self._stub.Repartition, client_pb2.RepartitionRequest(
            application_id=app_id, operator=operator, partitions=partitions))

    def shutdown(self, app_id: str) -> None:
        self._call(self._stub.ShutdownApplication,
                   client_pb2.ShutdownApplicationRequest(application_id=app_id))

    def wait(self, app_id: str, timeout_s: float, *, interval_s: float = 0.2,
             on_poll: Callable[[client_pb2.ApplicationInfo], None] | None = None
             ) -> client_pb2.ApplicationInfo:
        """Polls until the application ends (FINISHED, FAILED or KILLED); its last info.

        ``on_poll`` sees every info polled on the way (a progress line, a peak figure).

        Raises:
            TimeoutError: still running after ``timeout_s``, naming its state and window.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.application(app_id)
            if on_poll is not None:
                on_poll(info)
            if info.state not in _RUNNING_STATES:
                return info
            if time.monotonic() >= deadline:
                raise TimeoutError(f"application {app_id} is still {info.state} after "
                                   f"{timeout_s:g} s (committed window "
                                   f"{info.committed_window_id})")
            time.sleep(interval_s)

    def kill(self, app_id: str, reason: str = "") -> None:
        self._call(self._stub.KillApplication,
                   client_pb2.KillApplicationRequest(application_id=app_id, reason=reason))

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()

    def __enter__(self) -> WeirClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

"""Test harness: bounded waits, CLI subprocesses, and checks that no process leaked."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import grpc
import psutil

from weir.master.auth import client_credentials
from weir.master.tls import open_channel
from weir.proto.contract import bearer_metadata
from weir.runtime.machine_load import load_stretch

__all__ = ["TAG_ENV", "WeirProcess", "master_channel", "poll_for", "tagged_env",
           "tagged_processes"]

_T = TypeVar("_T")
TAG_ENV = "WEIR_TEST_TAG"
ROOT = Path(__file__).resolve().parent.parent


def poll_for(condition: Callable[[], _T], timeout_s: float, what: str,
             interval_s: float = 0.1) -> _T:
    """Waits until ``condition()`` is truthy; fails naming ``what`` was expected.

    ``timeout_s`` is for an idle machine: it is stretched by the machine's load per core
    (``runtime.machine_load``, up to 4x) as the wait starts, so a suite that shares its
    cores with other work waits longer instead of failing; a wait that succeeds returns
    as soon as it does, so an idle machine loses nothing.
    """
    stretch = load_stretch()
    deadline = time.monotonic() + timeout_s * stretch
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            stretched = f" ({timeout_s * stretch:.0f} s on this busy machine)" \
                if stretch > 1 else ""
            raise AssertionError(f"timed out after {timeout_s} s{stretched} waiting for "
                                 f"{what}")
        time.sleep(interval_s)


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: Any
    compression: Any


class _WithSecret(grpc.UnaryUnaryClientInterceptor):
    def __init__(self, secret: str) -> None:
        self.metadata = bearer_metadata(secret)

    def intercept_unary_unary(self, continuation, details, request):
        call = _CallDetails(details.method, details.timeout,
                            (*(details.metadata or ()), *self.metadata), details.credentials,
                            details.wait_for_ready, details.compression)
        return continuation(call, request)


def free_port() -> int:
    """A TCP port of 127.0.0.1 free right now (a server may still lose it to a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def master_channel(address: str, secret: str, roots: bytes | None = None) -> grpc.Channel:
    """A TLS channel to a master (checked by ``roots``, else the certificate in its secret
    file) that sends its secret with every call, as containers do (for tests that play
    containers with the generated stubs)."""
    roots = roots or client_credentials(address, secret=secret).require_roots(address)
    return grpc.intercept_channel(open_channel(address, roots, []), _WithSecret(secret))


def tagged_env(**extra: str) -> tuple[dict[str, str], str]:
    """An environment whose processes (and their children, JVMs included) carry a tag."""
    tag = uuid.uuid4().hex
    env = {**os.environ, TAG_ENV: tag, "PYSPARK_PYTHON": sys.executable, **extra}
    return env, tag


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Live processes started under ``tag`` (by environment), other than this one.

    Each one's ``info`` holds its name, environment and status as read in this one pass:
    a process may exit between this listing and a later ``name()`` call, which would
    raise ``NoSuchProcess``; read ``proc.info["name"]`` instead.
    """
    found = []
    for proc in psutil.process_iter(["pid", "name", "environ", "status"]):
        info = proc.info
        if proc.pid == os.getpid() or not info["environ"]:
            continue
        if info["environ"].get(TAG_ENV) == tag and info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


class WeirProcess:
    """A ``weir`` CLI subprocess in its own session, always stopped and reaped.

    Its output is collected in a file so a long run never blocks on a full pipe, and
    is printed when a test fails.
    """

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path, log: Path,
                 python: str = sys.executable) -> None:
        self.log = log
        self._log_file = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([python, "-m", "weir", *args], env=env,
                                     cwd=cwd, stdout=self._log_file,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        if not self._log_file.closed:
            self._log_file.flush()
        return self.log.read_text(errors="replace")

    def wait(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"weir did not exit within {timeout_s} s; output:\n"
                                 f"{self.output()}") from None

    def interrupt(self) -> None:
        self.proc.send_signal(signal.SIGINT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        self._log_file.close()

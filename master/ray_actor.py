"""The Ray actor that holds one container process on the node Ray placed it on.

Imported on Ray's worker nodes (Weir must be installed there): only the standard library
and ``weir.proto``/``weir.storage`` helpers. The container dies with the actor (it is
started with ``PARENT_PID_ENV``: ``container.parent_death``), so a node lost or an actor
killed leaves no orphan process or JVM behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from weir.proto.contract import CONTAINER_ID_ENV, PARENT_PID_ENV, SECRET_ENV, TLS_CA_ENV
from weir.storage.private_files import make_private_dir

__all__ = ["ContainerProcess"]

_CREDENTIAL_NAMES = (SECRET_ENV, TLS_CA_ENV)  # never inherited from the Ray worker


class ContainerProcess:
    """``python -m weir.container --master ADDR --id ID`` on this node, its output in an
    owner-only log file here. Runs as a threaded actor: ``wait`` blocks while ``stop`` and
    ``log_tail`` answer."""

    def __init__(self, master_address: str, container_id: str, env: dict[str, str],
                 command: list[str] | None, log_folder: str, credentials: str = "") -> None:
        """``credentials``: the master's (``launcher.credentials_document``), written to
        the container's standard input and never put in its environment."""
        folder = Path(tempfile.gettempdir()) / log_folder
        make_private_dir(str(folder), "the Ray containers' log folder",
                         advice="remove it, or run the Ray node as its owner")
        self.log_path = folder / f"{container_id}.log"
        argv = [*(command or [sys.executable, "-m", "weir.container"]),
                "--master", master_address, "--id", container_id,
                *(["--secret-stdin"] if credentials else [])]
        environment = {**{k: v for k, v in os.environ.items() if k not in _CREDENTIAL_NAMES},
                       **env, CONTAINER_ID_ENV: container_id,
                       PARENT_PID_ENV: str(os.getpid()), "PYTHONUNBUFFERED": "1"}
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                     0o600)
        with os.fdopen(fd, "ab") as log:
            self.process = subprocess.Popen(
                argv, env=environment, stdout=log, stderr=log, start_new_session=True,
                stdin=subprocess.PIPE if credentials else subprocess.DEVNULL)
        if credentials and self.process.stdin is not None:
            with self.process.stdin as pipe:  # read by the container as it starts
                try:
                    pipe.write(credentials.encode())
                except BrokenPipeError:
                    pass  # it already exited: its exit code says why

    def where(self) -> tuple[int, str]:
        """(the container's pid, this node's host name): it has started."""
        return self.process.pid, socket.gethostname()

    def wait(self) -> int:
        """The container's exit code, once it ended."""
        return self.process.wait()

    def stop(self, signum: int = signal.SIGKILL) -> None:
        """Signals the container's process group (it and its JVM), if it still runs."""
        if self.process.poll() is None and self.process.pid > 1:
            try:
                os.killpg(self.process.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def log_tail(self, max_bytes: int) -> tuple[bytes, bool]:
        """The last ``max_bytes`` of the container's output, and whether there is more."""
        with open(self.log_path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - max_bytes))
            return log.read(), size > max_bytes

"""Spark's JVM started without ``fork()``: a container's gRPC threads make a forked child
crash before it can ``exec`` Java.

PySpark starts its gateway JVM with ``subprocess.Popen(..., preexec_fn=...)`` (to keep
Ctrl-C away from Java). ``preexec_fn`` forces a real ``fork()``, which runs gRPC's fork
handlers in the child; with gRPC channels busy in other threads (every container's
heartbeats and Flight streams), grpcio 1.80 and later crash that child now and then, before
``exec`` (grpc/grpc#43055: "epoll_wait error: Bad file descriptor"). PySpark then says
``JAVA_GATEWAY_EXITED``: a spare never warmed, a container failed to start. Measured here
with busy channels: 13 of 300 such children failed; none of 300 without ``preexec_fn``,
where Python uses ``vfork()`` and no fork handler runs.

Without it, Java stays in the container's process group: the master's launcher starts
every container in a session of its own (no terminal's Ctrl-C reaches it) and stops the
whole group, JVM included; a container started by hand at a terminal stops with Ctrl-C
anyway.

>>> install(); import pyspark.java_gateway as gateway; gateway.Popen is _spawn
True
"""

from __future__ import annotations

import subprocess
from typing import Any

__all__ = ["install"]


def _spawn(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` for PySpark's gateway, without its ``preexec_fn``."""
    kwargs.pop("preexec_fn", None)
    return subprocess.Popen(*args, **kwargs)


def install() -> None:
    """Makes PySpark start its gateway JVM through ``_spawn`` (idempotent); call it before
    the first SparkSession of the process."""
    import pyspark.java_gateway as gateway

    gateway.Popen = _spawn  # type: ignore[assignment, attr-defined]

"""Spark's JVM is started without fork(): with gRPC channels busy in other threads (as in
every container), a child forked for ``preexec_fn`` can crash before it execs (grpcio
>= 1.80, grpc/grpc#43055), which PySpark reports as JAVA_GATEWAY_EXITED."""

from __future__ import annotations

import os
import subprocess
import threading
from concurrent import futures

import grpc
import pytest

from weir.runtime.spark.gateway import _spawn, install

pytestmark = pytest.mark.timeout(120)

STARTS = 300


@pytest.fixture
def busy_grpc():
    """A gRPC server and two threads calling it without pause, as a container's
    heartbeats and Flight streams keep gRPC busy."""
    server = grpc.server(futures.ThreadPoolExecutor(4))
    echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("echo.Echo", {"Call": echo}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary("/echo.Echo/Call")
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            call(b"x" * 100, timeout=5)

    threads = [threading.Thread(target=busy, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    yield
    stop.set()
    for thread in threads:
        thread.join(timeout=10)
    channel.close()
    server.stop(grace=None)


def test_the_gateway_starts_every_time_while_grpc_is_busy(busy_grpc):
    def ignore_sigint() -> None:  # what PySpark passes
        pass

    failed = [code for code in (
        _spawn(["true"], stdin=subprocess.PIPE, preexec_fn=ignore_sigint).wait(timeout=30)
        for _ in range(STARTS)) if code != 0]
    assert failed == [], f"{len(failed)} of {STARTS} starts failed: {failed[:5]}"


def test_pyspark_starts_its_gateway_through_it():
    import pyspark.java_gateway as gateway

    install()
    assert gateway.Popen is _spawn
    process = gateway.Popen(["sh", "-c", "ps -o pgid= -p $$"], stdout=subprocess.PIPE,
                            preexec_fn=lambda: None)
    out, _ = process.communicate(timeout=30)
    assert int(out) == os.getpgid(0)  # the container's group: stopped with it

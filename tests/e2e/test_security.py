"""The master's secret and TLS (the user's own certificate) with real container processes."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import threading
import time

import grpc
import psutil
import pytest

from tests.e2e.conftest import container_logs, started_master
from tests.harness import WeirProcess, poll_for
from tests.master.fakes import chain_descriptor
from weir.master import auth
from weir.master.client import WeirClient, WeirClientError
from weir.master.rpc import GRPC_OPTIONS
from weir.master.tls import TlsFiles, open_channel
from weir.operators import Dag
from weir.operators.library import FileSink
from weir.operators.testing import ListSource
from weir.proto import client_pb2, client_pb2_grpc

pytestmark = pytest.mark.timeout(180)


class Marker:
    """Unpickling it creates a file: proof that someone ran the payload."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def test_a_payload_runs_only_when_sent_with_the_secret(master, tmp_path):
    marker = tmp_path / "ran"
    dag = chain_descriptor(2)
    dag.operators[0].payload = pickle.dumps(Marker(str(marker)))
    request = client_pb2.SubmitApplicationRequest(dag=dag, attribute_overrides={
        "CONTAINERS": "1", "MAX_RESTARTS": "1"})
    with open_channel(master.address, master.tls.cert.read_bytes(), []) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            client_pb2_grpc.WeirClientStub(channel).SubmitApplication(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with WeirClient(master.address) as client:
        assert client.applications() == [] and client.containers() == []
        assert not marker.exists()
        # The same request with the secret: a container unpickles it, so the marker is
        # a real test of "never runs" above.
        app_id = client.submit(dag, dict(request.attribute_overrides))
        poll_for(marker.exists, 60, "the container to unpickle the payload")
        with contextlib.suppress(WeirClientError):  # it may have failed already
            client.kill(app_id)


@pytest.fixture
def tls_master(tmp_path, tls_files):
    cert, key = tls_files
    with started_master(tmp_path, stop_grace_ms=2_000,
                        tls=TlsFiles(cert, key)) as server:
        yield server


def test_an_application_runs_with_the_users_own_certificate(tls_master, tmp_path):
    """Containers call the master and each other's buffer servers over TLS, with a
    certificate the user gave (checked by host, not pinned by name)."""
    out = tmp_path / "out"
    dag = Dag("tls", CONTAINERS=2, HEARTBEAT_INTERVAL_MILLIS=200,
              STREAMING_WINDOW_SIZE_MILLIS=100)
    source = dag.add_operator("source", ListSource([[{"x": i} for i in range(k, k + 5)]
                                                    for k in range(0, 50, 5)]), CONTAINER=0)
    sink = dag.add_operator("sink", FileSink(str(out)), CONTAINER=1)
    dag.add_stream("xs", source.output, sink.input)
    with WeirClient(tls_master.address) as client:
        assert client.credentials.tls_roots == tls_master.tls.cert.read_bytes()
        app_id = client.submit(dag.to_descriptor())
        info = client.wait(app_id, 120)
    assert info.state == "FINISHED", f"{info.diagnostics}\n{container_logs(tls_master)}"
    rows = [json.loads(line)["x"] for file in sorted(out.glob("*.jsonl"))
            for line in file.read_text().splitlines()]
    assert sorted(rows) == list(range(50))


def test_unauthenticated_large_requests_cost_the_master_nothing(tmp_path):
    """Eight parallel 60 MB submits without the secret: refused before their bodies are
    read (they took a master 600 MB over its size before), so its memory barely moves."""
    env = {**os.environ, "WEIR_HOME": str(tmp_path / "home")}
    master = WeirProcess(["master", "--port", "0", "--json", "--http-port", "-1",
                          "--launcher", "recording"], env, tmp_path, tmp_path / "master.log")
    try:
        info = poll_for(lambda: _json_block(master.output()), 60, "the master to start")
        roots = auth.read_secret_file(info["secret_file"])[1]["tls_ca_pem"].encode()
        process = psutil.Process(master.proc.pid)
        base = process.memory_info().rss
        peak = [base]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], process.memory_info().rss)
                time.sleep(0.01)

        codes: list[grpc.StatusCode] = []

        def submit() -> None:
            with open_channel(info["address"], roots, GRPC_OPTIONS) as channel:
                call = channel.unary_unary("/weir.v1.WeirClient/SubmitApplication")
                with pytest.raises(grpc.RpcError) as caught:
                    call(b"\x0a" + b"\xff" * 60_000_000, timeout=60)
                codes.append(caught.value.code())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        callers = [threading.Thread(target=submit) for _ in range(8)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(90)
        done.set()
        sampler.join(5)
        master.interrupt()  # a clean stop: its temporary key goes with it
        master.wait(30)
    finally:
        master.stop()
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 8
    assert peak[0] - base < 150 * 1024 * 1024, f"grew by {(peak[0] - base) >> 20} MB"


def _json_block(output: str) -> dict | None:
    lines = output.splitlines()
    if "{" in lines and "}" in lines[lines.index("{"):]:
        start = lines.index("{")
        return json.loads("\n".join(lines[start:lines.index("}", start) + 1]))
    return None

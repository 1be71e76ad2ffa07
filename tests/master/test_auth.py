"""The master's secret: every gRPC call needs it, clients find it, containers get it; TLS;
message-size limits."""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
import tempfile

import grpc
import pytest

from tests.harness import master_channel, poll_for
from tests.master.fakes import chain_descriptor, container_heartbeat
from weir.master import auth, cli
from weir.master.client import WeirClient, WeirClientError
from weir.master.launcher import RecordingLauncher
from weir.master.local_launcher import LocalProcessLauncher
from weir.master.rpc import MAX_REQUEST_BYTES, MAX_SUBMIT_BYTES
from weir.master.server import MasterServer
from weir.master.tls import TlsFiles, make_self_signed, open_channel
from weir.proto import client_pb2, client_pb2_grpc, umbilical_pb2, umbilical_pb2_grpc
from weir.proto.contract import SECRET_ENV, bearer_metadata

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server():
    master = MasterServer(launcher_factory=RecordingLauncher, loop_interval_s=0.05)
    master.start()
    try:
        yield master
    finally:
        master.stop()


class Marker:
    """Unpickling it creates a file: proof that someone ran the payload."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def marker_descriptor(path) -> client_pb2.SubmitApplicationRequest:
    dag = chain_descriptor(2)
    dag.operators[0].payload = pickle.dumps(Marker(str(path)))
    return client_pb2.SubmitApplicationRequest(dag=dag, attribute_overrides={"CONTAINERS": "1"})


def _tls_channel(server: MasterServer) -> grpc.Channel:
    """A channel that checks the master's certificate but sends no secret."""
    return open_channel(server.address, server.tls.cert.read_bytes(), [])


def _refused(call, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, timeout=5, **kwargs)
    return caught.value


@pytest.mark.parametrize("metadata", [None, (("authorization", "Bearer wrong"),),
                                      (("authorization", "not-even-bearer"),)])
def test_calls_without_the_secret_are_refused_on_both_services(server, metadata):
    with _tls_channel(server) as channel:
        client = client_pb2_grpc.WeirClientStub(channel)
        umbilical = umbilical_pb2_grpc.StreamingContainerUmbilicalStub(channel)
        for call, request in [
            (client.ListApplications, client_pb2.ListApplicationsRequest()),
            (client.KillApplication, client_pb2.KillApplicationRequest(application_id="x")),
            (umbilical.GetInitContext, umbilical_pb2.GetInitContextRequest(container_id="c")),
            (umbilical.ProcessHeartbeat, container_heartbeat("app-0001-c0", port=1)),
        ]:
            error = _refused(call, request, metadata=metadata)
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "WEIR_SECRET" in error.details() and "--secret-file" in error.details()
    # with the secret, the same calls are answered
    with master_channel(server.address, server.secret) as channel:
        stub = client_pb2_grpc.WeirClientStub(channel)
        assert stub.ListApplications(client_pb2.ListApplicationsRequest(), timeout=5)


def test_a_pickled_payload_sent_without_the_secret_never_runs(server, tmp_path):
    """The master refuses it unparsed and starts nothing (the e2e test shows a container
    would have run it, had it been sent with the secret)."""
    marker = tmp_path / "ran"
    with _tls_channel(server) as channel:
        stub = client_pb2_grpc.WeirClientStub(channel)
        error = _refused(stub.SubmitApplication, marker_descriptor(marker))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    with WeirClient(server.address, timeout_s=5) as client:
        assert client.applications() == []
    assert server.launcher.launched == []
    assert not marker.exists()
    # the master itself never unpickles payloads, even accepted ones
    with master_channel(server.address, server.secret) as channel:
        stub = client_pb2_grpc.WeirClientStub(channel)
        assert stub.SubmitApplication(marker_descriptor(marker), timeout=5).application_id
    assert server.launcher.launched == ["app-0001-c0"] and not marker.exists()


def test_the_secret_file_is_the_owners_only_and_goes_with_the_master(tmp_path, monkeypatch):
    monkeypatch.setenv(auth.HOME_ENV, str(tmp_path / "home"))
    master = MasterServer(launcher_factory=RecordingLauncher, secret="given-secret")
    address = master.start()
    try:
        path = master.secret_file
        assert path == tmp_path / "home" / f"master-{address.rsplit(':', 1)[1]}.secret"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert json.loads(path.read_text()) == {
            "address": address, "secret": "given-secret",
            "tls_ca_pem": master.tls.cert.read_text(), "dashboard": master.core.dashboard_url,
            "http_token": auth.http_token("given-secret")}
        assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left
        with WeirClient(address, timeout_s=5) as client:  # found with no setup at all
            assert client.credentials.source == str(path)
            assert client.applications() == []
    finally:
        master.stop()
    assert not path.exists()


def test_where_clients_find_the_secret(server, tmp_path, monkeypatch):
    port = int(server.address.rsplit(":", 1)[1])
    found = auth.client_credentials(f"localhost:{port}")
    assert (found.secret, found.source) == (server.secret, str(server.secret_file))
    assert found.tls_roots == server.tls.cert.read_bytes()  # what the master must prove
    # a local master's secret is never sent to another host on the same port
    elsewhere = auth.client_credentials(f"10.1.2.3:{port}")
    assert (elsewhere.secret, elsewhere.tls_roots) == (None, None)
    with pytest.raises(ValueError, match="no certificate to check the master at 10.1.2.3"):
        elsewhere.require_roots(f"10.1.2.3:{port}")
    # a secret given another way still goes only to the master its local file proves
    assert auth.client_credentials(server.address, secret="x").tls_roots == found.tls_roots
    monkeypatch.setenv(SECRET_ENV, "from-env")
    assert auth.client_credentials(server.address).secret == "from-env"
    plain = tmp_path / "plain.secret"
    plain.write_text("from-file\n")
    assert auth.client_credentials(server.address, secret_file=plain).secret == "from-file"
    assert auth.client_credentials(server.address, secret_file=server.secret_file,
                                   secret="explicit").secret == "explicit"
    with WeirClient(server.address, timeout_s=5) as client, pytest.raises(
            WeirClientError, match=r"refused the call: the secret from WEIR_SECRET was refused"
    ) as caught:
        client.applications()
    assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED
    with WeirClient(server.address, timeout_s=5, secret_file=server.secret_file) as client:
        assert client.applications() == []
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(WeirClientError, match="holds no secret"):
        WeirClient(server.address, secret_file=empty)


def test_cli_uses_the_secret_and_says_how_to_give_it(server, tmp_path, monkeypatch, capsys):
    assert cli.main(["--master", server.address, "apps"]) == 0
    assert "no applications" in capsys.readouterr().out
    monkeypatch.setenv(SECRET_ENV, "wrong")
    assert cli.main(["--master", server.address, "apps"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("weir: error: the master at ") and "WEIR_SECRET" in err
    secret = tmp_path / "s"
    secret.write_text(server.secret)
    secret.chmod(0o600)
    assert cli.main(["--master", server.address, "--secret-file", str(secret), "apps"]) == 0


def test_weir_container_is_pointed_at_the_masters_secret_file(server, monkeypatch):
    """It holds the secret and the certificate; the secret is on no command line."""
    calls = []
    monkeypatch.setattr(os, "execv", lambda path, argv: calls.append(argv))
    monkeypatch.setenv(SECRET_ENV, "placeholder")
    monkeypatch.delenv(SECRET_ENV)  # restored (absent) after the test
    cli.main(["--master", server.address, "container", "--id", "c0"])
    assert calls == [[sys.executable, "-m", "weir.container", "--master", server.address,
                      "--id", "c0", "--secret-file", str(server.secret_file)]]
    assert SECRET_ENV not in os.environ


def test_launched_containers_get_the_secret_in_their_environment_only(tmp_path, monkeypatch):
    monkeypatch.setenv("WEIR_TLS_CERT", "/inherited/cert.pem")  # must not reach containers
    tls = make_self_signed(tmp_path / "tls")
    out = tmp_path / "seen.json"
    script = ("import json, os, sys; json.dump({'argv': sys.argv, 'env': {k: v for k, v in "
              "os.environ.items() if k.startswith('WEIR_')}}, open(sys.argv[1], 'w'))")
    launcher = LocalProcessLauncher("127.0.0.1:1", command=[sys.executable, "-c", script,
                                                            str(out)])
    launcher.set_credentials(auth.container_env("s3cret", tls))
    launcher.launch("c0")
    try:
        poll_for(lambda: launcher.exit_code("c0") is not None, 20, "the fake container")
    finally:
        launcher.stop_all(grace_s=1)
    seen = json.loads(out.read_text())
    # the secret and the certificate to check the master by; its key comes over TLS later
    assert seen["env"]["WEIR_SECRET"] == "s3cret"
    assert seen["env"]["WEIR_TLS_CA"] == str(tls.cert) and "WEIR_TLS_CERT" not in seen["env"]
    assert not any("s3cret" in arg for arg in seen["argv"])


def _container_refusal(**env: str | None) -> str:
    """The error of a container started with ``env`` changed (None: unset); it must exit 2."""
    environment = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    result = subprocess.run([sys.executable, "-m", "weir.container", "--master", "127.0.0.1:1",
                             "--id", "c0"], env=environment, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2, result.stderr
    return result.stderr


def test_a_container_without_the_secret_refuses_to_start():
    assert "no secret for master 127.0.0.1:1: set WEIR_SECRET or pass --secret-file" in (
        _container_refusal(WEIR_SECRET=None))


def test_a_container_without_a_certificate_keeps_the_secret_and_refuses_to_start():
    assert "no certificate to check master 127.0.0.1:1 by, so its secret stays here" in (
        _container_refusal(WEIR_SECRET="s3cret", WEIR_TLS_CA=None))


def test_every_master_serves_tls_with_a_certificate_it_made(server):
    """No plaintext port at all; the certificate is pinned by its one name."""
    with grpc.insecure_channel(server.address) as channel:
        stub = client_pb2_grpc.WeirClientStub(channel)
        error = _refused(stub.ListApplications, client_pb2.ListApplicationsRequest(),
                         metadata=bearer_metadata(server.secret))
        assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert b"BEGIN CERTIFICATE" in server.tls.cert.read_bytes()
    assert stat.S_IMODE(server.tls.key.stat().st_mode) == 0o600
    stranger = make_self_signed(server.tls.cert.parent.parent / "stranger")
    with open_channel(server.address, stranger.cert.read_bytes(), []) as channel:
        stub = client_pb2_grpc.WeirClientStub(channel)  # trusts another certificate
        error = _refused(stub.ListApplications, client_pb2.ListApplicationsRequest(),
                         metadata=bearer_metadata(server.secret))
        assert error.code() == grpc.StatusCode.UNAVAILABLE
    folder = server.tls.cert.parent
    server.stop()
    assert not folder.exists()  # a master without a state folder keeps nothing


def test_a_master_keeps_its_certificate_in_its_state_folder(tmp_path):
    first = MasterServer(launcher_factory=RecordingLauncher, state_dir=tmp_path / "m")
    first.start()
    first.stop()
    second = MasterServer(launcher_factory=RecordingLauncher, state_dir=tmp_path / "m")
    second.start()
    try:  # containers that outlived the first still trust the second
        assert second.tls.cert == tmp_path / "m" / "tls" / "cert.pem"
        assert second.tls.cert.read_bytes() == first.tls.cert.read_bytes()
        with WeirClient(second.address, timeout_s=5) as client:
            assert client.applications() == []
    finally:
        second.stop()


def test_oversized_heartbeat_is_refused_and_the_master_goes_on(server):
    big = container_heartbeat("app-0001-c0", port=1)
    big.jvm_name = "x" * (10 * 1024 * 1024)
    with master_channel(server.address, server.secret) as channel:
        umbilical = umbilical_pb2_grpc.StreamingContainerUmbilicalStub(channel)
        client = client_pb2_grpc.WeirClientStub(channel)
        error = _refused(umbilical.ProcessHeartbeat, big)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"over the master's limit of {MAX_REQUEST_BYTES} bytes" in error.details()
        # a DAG larger than that is fine to submit: the limit is per method
        dag = chain_descriptor(2)
        dag.operators[1].attributes["BLOB"] = "y" * (6 * 1024 * 1024)
        request = client_pb2.SubmitApplicationRequest(dag=dag)
        error = _refused(client.SubmitApplication, request)
        assert "unknown attribute 'BLOB'" in error.details()  # parsed and judged
        dag.operators[1].attributes["BLOB"] = "y" * (MAX_SUBMIT_BYTES + 1)
        error = _refused(client.SubmitApplication, client_pb2.SubmitApplicationRequest(dag=dag))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        app_id = client.SubmitApplication(client_pb2.SubmitApplicationRequest(
            dag=chain_descriptor(2), attribute_overrides={"CONTAINERS": "1"}),
            timeout=5).application_id
        reply = umbilical.ProcessHeartbeat(container_heartbeat(f"{app_id}-c0", port=1),
                                           timeout=5)
        assert [d.name for d in reply.deploy_request] == ["source", "sink"]


def test_tls_master_and_client(tls_files, tmp_path):
    cert, key = tls_files
    master = MasterServer(launcher_factory=RecordingLauncher, tls=TlsFiles(cert, key))
    address = master.start()
    try:
        assert master.launcher.credential_env == {"WEIR_SECRET": master.secret,
                                                  "WEIR_TLS_CA": str(cert)}
        with WeirClient(address, timeout_s=5) as client:  # the secret file holds the CA
            assert client.credentials.tls_roots == cert.read_bytes()
            assert client.applications() == []
        with WeirClient(address, timeout_s=5, tls_ca=cert, secret=master.secret) as client:
            client.submit(chain_descriptor(2))
        with grpc.insecure_channel(address) as channel:  # plaintext gets nowhere
            stub = client_pb2_grpc.WeirClientStub(channel)
            error = _refused(stub.ListApplications, client_pb2.ListApplicationsRequest(),
                             metadata=bearer_metadata(master.secret))
            assert error.code() == grpc.StatusCode.UNAVAILABLE
        with grpc.secure_channel(address, grpc.ssl_channel_credentials(cert.read_bytes())
                                 ) as channel:  # TLS without the secret: still refused
            stub = client_pb2_grpc.WeirClientStub(channel)
            error = _refused(stub.ListApplications, client_pb2.ListApplicationsRequest())
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        master.stop()
    with pytest.raises(ValueError, match="needs both"):
        TlsFiles.from_options(str(cert), None)


def test_calls_past_the_concurrency_limit_are_refused_at_once_and_containers_retry():
    """Issue 17, item 8: a flood of calls cannot queue up in the master."""
    import threading

    from weir.container.umbilical_client import UmbilicalClient

    master = MasterServer(launcher_factory=RecordingLauncher, max_concurrent_calls=2,
                          http_port=None)
    master.start()
    release = threading.Event()
    listing, inside = master.core.list_applications, []

    def held_listing():
        inside.append(1)
        release.wait(20)
        return listing()

    master.core.list_applications = held_listing
    try:
        with WeirClient(master.address, timeout_s=30) as client:
            held = [threading.Thread(target=client.applications) for _ in range(2)]
            for thread in held:
                thread.start()
            poll_for(lambda: len(inside) == 2, 10, "the two calls to be in progress")
            with WeirClient(master.address, timeout_s=5) as third, pytest.raises(
                    WeirClientError, match="is busy .at its limit of calls in progress"):
                third.applications()
            umbilical = UmbilicalClient(master.address, secret=master.secret,
                                        tls_root_certs=master.tls.cert.read_bytes(),
                                        retry_window_s=20)
            threading.Timer(1.0, release.set).start()
            with pytest.raises(grpc.RpcError) as caught:  # waited for room, then answered
                umbilical.get_init_context("nobody")
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            umbilical.close()
            for thread in held:
                thread.join(20)
    finally:
        release.set()
        master.stop()


def test_a_killed_masters_temporary_key_is_swept_by_the_next_one(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    left = tmp_path / "weir-tls-999999999-abc"  # no such process
    left.mkdir()
    (left / "key.pem").write_text("a dead master's key")
    with MasterServer(launcher_factory=RecordingLauncher, http_port=None) as master:
        assert not left.exists()
        assert master.tls.cert.parent.parent == tmp_path
        assert master.tls.cert.parent.name.startswith(f"weir-tls-{os.getpid()}-")

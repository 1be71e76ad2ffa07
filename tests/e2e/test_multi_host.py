"""Several hosts: a master and containers started by hand, each in a network namespace of its
own (``tests/netns.py``), so nothing reaches anything over loopback. Data crosses from
host to host through the buffer servers; checkpoints live in a ``file://`` STATE_DIR
that every host sees, so a replacement on another host resumes from them.

Needs root and ``ip netns add``; skipped (naming why) otherwise, unless
``WEIR_REQUIRE_NETNS=1`` makes that a failure.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests import netns
from tests.harness import ROOT, poll_for, tagged_env, tagged_processes
from weir.container.main import buffer_server_hosts
from weir.master.client import WeirClient
from weir.operators.app import load_app
from weir.operators.library import EventGenerator

APP = """
    import pyarrow as pa
    from weir.operators import Dag, Operator, InputPort, OutputPort
    from weir.operators.library import EventGenerator, FileSink

    class SumPerKey(Operator):
        '''Count and sum of value per key and window, in pyarrow (no Spark on these hosts).'''
        input = InputPort()
        output = OutputPort()

        def begin_window(self, window_id):
            self.batches = []

        def process(self, port, batch):
            self.batches.append(batch)

        def end_window(self):
            if self.batches:
                table = pa.Table.from_batches(self.batches).group_by("key").aggregate(
                    [("value", "count"), ("value", "sum")])
                self.output.emit(table.rename_columns(["key", "count", "sum"]))
            self.batches = []

    dag = Dag("multihost", CONTAINERS=2, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, HEARTBEAT_TIMEOUT_MILLIS=4000,
              CHECKPOINT_WINDOW_COUNT=4, STATE_DIR={state!r})
    events = dag.add_operator("events", EventGenerator(**{generator!r}), CONTAINER=0)
    sums = dag.add_operator("sums", SumPerKey(), CONTAINER=1)
    sink = dag.add_operator("sink", FileSink({out!r}), CONTAINER=0)
    dag.add_stream("events", events.output, sums.input)
    dag.add_stream("sums", sums.output, sink.input)
"""

_T = TypeVar("_T")
_PROXY_ENV = ("http_proxy", "https_proxy", "grpc_proxy", "HTTP_PROXY", "HTTPS_PROXY")


class Host:
    """One process run inside a namespace, in its own session, its output in a file."""

    def __init__(self, lab: netns.Lab, host: int, argv: list[str], env: dict[str, str],
                 log: Path) -> None:
        self.log = log
        self._out = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(lab.command(host, argv), env=env, cwd=ROOT,
                                     stdin=subprocess.DEVNULL, stdout=self._out,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        if not self._out.closed:
            self._out.flush()
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILLs the process group (``ip netns exec`` exec'd: the group is the process)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        self._out.close()


class Cluster:
    """A master on host 0 (``--launcher recording``) and containers started by hand on the
    other hosts, as an operator would on separate machines: each host has its own
    ``WEIR_HOME`` (no secret file to find) and gets the master's secret explicitly."""

    def __init__(self, lab: netns.Lab, tmp_path: Path, env: dict[str, str],
                 listen: list[str]) -> None:
        self.lab, self.tmp_path, self.env = lab, tmp_path, env
        self.secret = os.urandom(32).hex()
        self.secret_file = tmp_path / "secret"
        self.secret_file.write_text(self.secret + "\n")
        self.secret_file.chmod(0o600)
        self.processes: list[Host] = []
        self.master = self._start(0, [
            "master", *listen, "--port", "0", "--json",
            "--launcher", "recording", "--state-dir", str(tmp_path / "master-state"),
            "--secret-file", str(self.secret_file)], "master")
        try:
            self.address = poll_for(self._master_address, 60, "the master to start")
        except BaseException:
            self.stop()
            raise
        self.cert = tmp_path / "master-state" / "tls" / "cert.pem"  # the one it made
        # what an operator copies to the other hosts: the master's published secret file
        published = tmp_path / "home-0" / f"master-{self.address.rsplit(':', 1)[1]}.secret"
        self.copied_secret_file = tmp_path / "copied.secret"
        self.copied_secret_file.write_bytes(published.read_bytes())
        self.copied_secret_file.chmod(0o600)

    def _host_env(self, host: int, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in self.env.items() if k not in _PROXY_ENV}
        return {**env, "WEIR_HOME": str(self.tmp_path / f"home-{host}"), **extra}

    def _start(self, host: int, weir_args: list[str], name: str, **env: str) -> Host:
        process = Host(self.lab, host, [sys.executable, "-m", "weir", *weir_args],
                       self._host_env(host, **env), self.tmp_path / f"{name}.log")
        self.processes.append(process)
        return process

    def _master_address(self) -> str | None:
        lines = self.master.output().splitlines()
        if "{" in lines and "}" in lines[lines.index("{"):]:
            start = lines.index("{")
            return json.loads("\n".join(lines[start:lines.index("}", start) + 1]))["address"]
        if self.master.proc.poll() is not None:
            raise AssertionError(f"the master exited:\n{self.master.output()}")
        return None

    def container(self, host: int, container_id: str, *, secret_in_env: bool,
                  listen: bool = False) -> Host:
        """``weir container`` by hand on ``host``, given the secret and the master's
        certificate in ``$WEIR_SECRET`` and ``$WEIR_TLS_CA``, or with ``--secret-file`` (a
        copy of the master's secret file: both in one); its buffer server listens on the
        host's address, given with ``--host`` (``listen``) or found on the route to the
        master."""
        args = ["container", "--master", self.address, "--id", container_id, "-v"]
        if listen:
            args += ["--host", self.lab.addresses[host]]
        if secret_in_env:
            return self._start(host, args, container_id, WEIR_SECRET=self.secret,
                               WEIR_TLS_CA=str(self.cert))
        return self._start(host, [*args, "--secret-file", str(self.copied_secret_file)],
                           container_id)

    def logs(self) -> str:
        return "\n".join(f"--- {p.log.name}\n{p.output()[-4000:]}" for p in self.processes)

    def wait(self, condition: Callable[[], _T], timeout_s: float, what: str,
             interval_s: float = 0.1) -> _T:
        """``poll_for``, with every process's output as it is when the wait fails."""
        try:
            return poll_for(condition, timeout_s, what, interval_s)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None

    def stop(self) -> None:
        for process in reversed(self.processes):  # containers first, the master last
            process.stop()


@pytest.fixture
def lab() -> Iterator[netns.Lab]:
    """Three stand-in hosts; skipped where network namespaces cannot be made."""
    required = os.environ.get("WEIR_REQUIRE_NETNS") == "1"
    reason = netns.unavailable_reason()
    if reason is not None:
        if required:
            pytest.fail(f"WEIR_REQUIRE_NETNS=1 but {reason}")
        pytest.skip(reason)
    try:
        made = netns.Lab(3)
    except netns.NetnsUnavailable as exc:
        if required:
            pytest.fail(f"WEIR_REQUIRE_NETNS=1 but {exc}")
        pytest.skip(str(exc))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def start_cluster(lab, tmp_path, monkeypatch) -> Iterator[Callable[[list[str]], Cluster]]:
    """Starts the master with the given listen options; everything is stopped after."""
    for name in _PROXY_ENV:  # the test's own WeirClient calls the master directly
        monkeypatch.delenv(name, raising=False)
    env, tag = tagged_env()
    started: list[Cluster] = []

    def start(listen: list[str]) -> Cluster:
        started.append(Cluster(lab, tmp_path, env, listen))
        return started[-1]

    try:
        yield start
    finally:
        for cluster in started:
            cluster.stop()
        poll_for(lambda: not tagged_processes(tag), 20, "every process of the test to exit")


def _submit(cluster: Cluster, tmp_path: Path, generator: dict[str, int]) -> tuple[str, Path]:
    out = tmp_path / "shared" / "out"
    app = tmp_path / "multihost_app.py"
    app.write_text(textwrap.dedent(APP.format(
        state=(tmp_path / "shared" / "state").as_uri(), generator=generator, out=str(out))))
    with WeirClient(cluster.address, secret=cluster.secret, tls_ca=cluster.cert) as client:
        return client.submit(load_app(app).to_descriptor()), out


def _published(out: Path) -> dict[str, tuple[int, int]]:
    """Count and sum per key over every window file the sink published."""
    totals: collections.Counter[tuple[str, str]] = collections.Counter()
    for path in sorted(out.glob("window-*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            totals[row["key"], "count"] += row["count"]
            totals[row["key"], "sum"] += row["sum"]
    keys = {key for key, _ in totals}
    return {key: (totals[key, "count"], totals[key, "sum"]) for key in keys}


def _wait_finished(client: WeirClient, cluster: Cluster, app_id: str, timeout_s: float) -> None:
    info = cluster.wait(lambda: (i := client.application(app_id)).state not in (
        "ACCEPTED", "RUNNING") and i, timeout_s, f"{app_id} to end", 0.3)
    assert info.state == "FINISHED", f"{info.state}: {info.diagnostics}\n{cluster.logs()}"


def test_containers_on_other_hosts_run_an_application(start_cluster, lab, tmp_path):
    cluster = start_cluster(["--host", lab.addresses[0]])
    assert cluster.address.startswith(f"{lab.addresses[0]}:")
    generator = {"rate_per_second": 20_000, "keys": 50, "total": 60_000, "batch_rows": 1_000}
    app_id, out = _submit(cluster, tmp_path, generator)
    with WeirClient(cluster.address, secret=cluster.secret, tls_ca=cluster.cert) as client:
        ids = sorted(c.id for c in client.containers(app_id))
        assert len(ids) == 2, ids
        cluster.container(1, ids[0], secret_in_env=True, listen=True)
        cluster.container(2, ids[1], secret_in_env=False)  # the address on its route
        cluster.wait(lambda: all(c.buffer_server_address for c in client.containers(app_id)),
                     60, "both containers to report their buffer servers")
        served = {c.id: c.buffer_server_address.rsplit(":", 1)[0]
                  for c in client.containers(app_id)}
        assert served == {ids[0]: cluster.lab.addresses[1], ids[1]: cluster.lab.addresses[2]}
        _wait_finished(client, cluster, app_id, 120)
    assert _published(out) == EventGenerator(**generator).expected_counts()
    for process in cluster.processes[1:]:  # the containers leave once the app is done
        cluster.wait(lambda p=process: p.proc.poll() is not None, 30,
                     f"{process.log.stem} to exit")


def test_a_replacement_on_another_host_resumes_from_the_shared_state_dir(start_cluster, lab,
                                                                        tmp_path):
    # Listening everywhere, the master hands out the address it is told to advertise.
    cluster = start_cluster(["--host", "0.0.0.0", "--advertise-host", lab.addresses[0]])
    assert cluster.address.startswith(f"{lab.addresses[0]}:")
    generator = {"rate_per_second": 8_000, "keys": 50, "total": 120_000, "batch_rows": 1_000}
    app_id, out = _submit(cluster, tmp_path, generator)
    with WeirClient(cluster.address, secret=cluster.secret, tls_ca=cluster.cert) as client:
        first, second = sorted(c.id for c in client.containers(app_id))
        cluster.container(1, first, secret_in_env=True)
        lost = cluster.container(2, second, secret_in_env=True)
        cluster.wait(lambda: client.application(app_id).committed_window_id >= 0, 60,
                     "a first committed window")
        lost.kill()  # host 2 is gone; its checkpoints are in the shared STATE_DIR
        replacement = cluster.wait(
            lambda: next((c.id for c in client.containers(app_id) if c.replaces == second),
                         None), 30, f"a replacement for {second}", 0.2)
        cluster.container(1, replacement, secret_in_env=False)  # on host 1, not host 2
        _wait_finished(client, cluster, app_id, 180)
        operators = {op.name: op for op in client.operators(app_id)}
    # sums restarted on host 1 from its checkpoint (and the sink downstream with it).
    assert operators["sums"].container_id == replacement
    assert operators["sums"].failure_count >= 1 and operators["sums"].deploy_window_id >= 0
    assert operators["sink"].deploy_window_id >= 0
    assert any((tmp_path / "shared" / "state" / "checkpoints").iterdir())
    assert _published(out) == EventGenerator(**generator).expected_counts()


def test_buffer_server_addresses_default_to_the_route_to_the_master():
    """A local run stays on loopback; a wildcard listener advertises the route's address."""
    assert buffer_server_hosts("127.0.0.1:5151", None, None) == ("127.0.0.1", "127.0.0.1")
    assert buffer_server_hosts("localhost:5151", "0.0.0.0", None) == ("0.0.0.0", "127.0.0.1")
    assert buffer_server_hosts("127.0.0.1:5151", "0.0.0.0", "203.0.113.7") == (
        "0.0.0.0", "203.0.113.7")
    assert buffer_server_hosts("10.9.9.9:5151", "10.1.1.1", None) == ("10.1.1.1", "10.1.1.1")

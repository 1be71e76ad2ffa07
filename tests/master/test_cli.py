"""The ``weir`` CLI: one-line errors for bad input, tables for people, JSON for scripts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import weir
from tests.harness import poll_for
from tests.master.fakes import container_heartbeat, operator_report, window
from weir.master import cli
from weir.master.launcher import RecordingLauncher
from weir.master.server import MasterServer
from weir.operators.windows import make_window_id

pytestmark = pytest.mark.timeout(120)

APP_HEADER = """
from weir.operators import Dag, InputOperator, InputPort, Operator, OutputPort

class Source(InputOperator):
    output = OutputPort()
    def emit_tuples(self):
        return False

class Sink(Operator):
    input = InputPort()

class Merge(Operator):
    left = InputPort()
    right = InputPort()
    output = OutputPort()
"""

APPS = {
    "good": """
dag = Dag("good")
src = dag.add_operator("source", Source())
sink = dag.add_operator("sink", Sink())
dag.add_stream("s", src.output, sink.input)
""",
    "nodag": "x = 1\n",
    "cycle": """
dag = Dag("cycle")
src = dag.add_operator("source", Source())
a = dag.add_operator("a", Merge())
b = dag.add_operator("b", Merge())
dag.add_stream("s1", src.output, a.left)
dag.add_stream("s2", a.output, b.left, b.right)
dag.add_stream("s3", b.output, a.right)
""",
    "unconnected": """
dag = Dag("unconnected")
src = dag.add_operator("source", Source())
m = dag.add_operator("merge", Merge())
dag.add_stream("s1", src.output, m.left)
""",
    "two_streams": """
dag = Dag("two")
a = dag.add_operator("a", Source())
b = dag.add_operator("b", Source())
sink = dag.add_operator("sink", Sink())
dag.add_stream("s1", a.output, sink.input)
dag.add_stream("s2", b.output, sink.input)
""",
    "bad_attribute": """
dag = Dag("bad", NO_SUCH_ATTRIBUTE=1)
""",
}


@pytest.fixture
def apps(tmp_path):
    paths = {}
    for name, body in APPS.items():
        path = tmp_path / f"{name}.py"
        path.write_text(APP_HEADER + textwrap.dedent(body))
        paths[name] = str(path)
    return paths


@pytest.fixture
def master():
    server = MasterServer(launcher_factory=RecordingLauncher, loop_interval_s=0.05)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("weir: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize(("app", "fragment"), [
    ("nodag", "defines no DAG"),
    ("cycle", "has a cycle"),
    ("unconnected", "input port merge.right is not connected"),
    ("two_streams", "is fed by two streams"),
    ("bad_attribute", "unknown attribute 'NO_SUCH_ATTRIBUTE'"),
])
@pytest.mark.parametrize("command", ["submit", "run"])
def test_bad_application_files(capsys, apps, app, fragment, command):
    code, _, err = run(capsys, "--master", "127.0.0.1:1", command, apps[app])
    assert_one_line_error(code, err, fragment)


@pytest.mark.parametrize(("argv", "fragment"), [
    (["-D", "NO_SUCH=1"], "unknown attribute 'NO_SUCH'"),
    (["-D", "sink.NO_SUCH=1"], "unknown attribute 'NO_SUCH'"),
    (["-D", "ghost.CONTAINER=1"], "unknown operator 'ghost'"),
    (["-D", "CONTAINERS=lots"], "CONTAINERS='lots' is invalid"),
    (["-D", "oops"], "bad -D 'oops': expected NAME=VALUE"),
    (["--config", "/no/such/file.conf"], "cannot read config file"),
])
def test_bad_attributes(capsys, apps, argv, fragment):
    code, _, err = run(capsys, "--master", "127.0.0.1:1", "submit", *argv, apps["good"])
    assert_one_line_error(code, err, fragment)


def test_attribute_options_before_the_command_and_only_for_submit_and_run(capsys, apps):
    code, _, err = run(capsys, "--master", "127.0.0.1:1", "-D", "NOPE=1", "submit",
                       apps["good"])
    assert_one_line_error(code, err, "unknown attribute 'NOPE'")
    code, _, err = run(capsys, "-D", "CONTAINERS=2", "apps")
    assert_one_line_error(code, err, "-D and --config apply to submit and run")


@pytest.mark.parametrize("command", ["master", "run"])
def test_a_launchers_options_are_checked_before_anything_starts(capsys, apps, command):
    app = [apps["good"]] if command == "run" else []
    code, _, err = run(capsys, command, *app, "--launcher", "kubernetes")
    assert_one_line_error(code, err, "--launcher kubernetes needs --k8s-image")
    code, _, err = run(capsys, command, *app, "--ray-address", "10.0.0.1:6379")
    assert_one_line_error(code, err, "--ray-address do not apply to --launcher local")


@pytest.mark.parametrize("flag", [("--http-open",), ("--metrics-open",),
                                  ("--http-port", "8080")])
def test_a_dispatcher_refuses_what_it_does_not_serve_yet(capsys, tmp_path, flag):
    code, _, err = run(capsys, "master", "--application-masters", "--port", "0",
                       "--state-dir", str(tmp_path / "d"), *flag)
    assert_one_line_error(code, err, "not served with --application-masters yet")
    assert not (tmp_path / "d").exists()  # refused before anything started


def test_missing_app_file_and_usage_errors(capsys, tmp_path):
    code, _, err = run(capsys, "submit", str(tmp_path / "missing.py"))
    assert_one_line_error(code, err, "does not exist")
    code, _, err = run(capsys, "stats", "app-0001")
    assert_one_line_error(code, err, "required: OPERATOR")
    code, _, err = run(capsys, "frobnicate")
    assert_one_line_error(code, err, "invalid choice")


def test_master_not_answering_and_malformed_address(capsys, apps):
    code, _, err = run(capsys, "--master", "127.0.0.1:1", "submit", apps["good"])
    assert_one_line_error(code, err, "no master answers at 127.0.0.1:1; start one with "
                                     "`weir master` or pass --master")
    code, _, err = run(capsys, "apps", "--master", "127.0.0.1:1")
    assert_one_line_error(code, err, "no master answers at 127.0.0.1:1")
    code, _, err = run(capsys, "--master", "x", "apps")
    assert_one_line_error(code, err, "bad master address 'x': expected HOST:PORT")
    code, _, err = run(capsys, "--master", "x", "submit", apps["good"])
    assert_one_line_error(code, err, "bad master address 'x'")


def test_master_address_from_environment(capsys, monkeypatch):
    monkeypatch.setenv("WEIR_MASTER", "127.0.0.1:1")
    code, _, err = run(capsys, "apps")
    assert_one_line_error(code, err, "no master answers at 127.0.0.1:1")


def test_a_command_that_changes_something_says_which_master_it_found(capsys, monkeypatch,
                                                                       master):
    monkeypatch.setenv("WEIR_MASTER", master.address)
    code, _, err = run(capsys, "kill", "app-0042")
    assert code != 0 and err.splitlines()[0] == (
        f"weir: using the master at {master.address} (from $WEIR_MASTER; --master HOST:PORT "
        "names another)")
    code, _, err = run(capsys, "apps")  # a question changes nothing: no line
    assert code == 0 and err == ""
    code, _, err = run(capsys, "--master", master.address, "kill", "app-0042")
    assert "using the master" not in err  # named: nothing to tell


def test_unknown_application_and_container(capsys, master):
    address = master.address
    code, _, err = run(capsys, "--master", address, "operators", "app-0042")
    assert_one_line_error(code, err, "unknown application 'app-0042'; `weir apps` lists the "
                                     "applications")
    for argv in (["shutdown", "app-0042"], ["kill", "app-0042"], ["stats", "app-0042", "x"]):
        code, _, err = run(capsys, "--master", address, *argv)
        assert_one_line_error(code, err, "unknown application 'app-0042'")
    code, _, err = run(capsys, "--master", address, "kill-container", "app-0042-c0")
    assert_one_line_error(code, err, "unknown container 'app-0042-c0'")


def test_submit_then_tables_and_json(capsys, apps, master, tmp_path):
    config = tmp_path / "weir.conf"
    config.write_text("# test config\nCONTAINERS=1\nHEARTBEAT_INTERVAL_MILLIS = 250  # fast\n")
    code, out, err = run(capsys, "--master", master.address, "submit", "--config", str(config),
                         "-D", "HEARTBEAT_INTERVAL_MILLIS=300", apps["good"])
    assert (code, out.strip(), err) == (0, "app-0001", "")
    info = master.core.application_info("app-0001")
    assert info.attributes["CONTAINERS"] == "1"  # from the file
    assert info.attributes["HEARTBEAT_INTERVAL_MILLIS"] == "300"  # -D wins over the file
    core = master.core
    core.heartbeat(container_heartbeat("app-0001-c0", port=7000))
    base = info.start_window_millis // 1000  # window ids carry the application's epoch
    w5, at5 = make_window_id(base, 5), f"{base}:5"
    core.heartbeat(container_heartbeat("app-0001-c0", port=7000, operators=[
        operator_report(1, windows=[window(w5, 0, 9, 1_000, in_port=None, checkpoint=w5,
                                           checkpoint_ms=12)]),
        operator_report(2, windows=[window(w5, 9, 0, 1_010, out_port=None, checkpoint=w5,
                                           checkpoint_ms=3)])]))

    code, out, _ = run(capsys, "--master", master.address, "apps")
    assert code == 0
    header, row = out.strip().splitlines()
    assert header.split()[:3] == ["ID", "NAME", "STATE"]
    assert row.split()[:3] == ["app-0001", "good", "RUNNING"]
    assert "COMMITTED" in header and "FAILURES" in header and "RECOVERIES" in header
    assert row.split()[5:9] == [at5, at5, "0", "0"]  # window, committed, failures, recoveries

    code, out, _ = run(capsys, "--master", master.address, "containers")
    assert code == 0 and "app-0001-c0" in out and "127.0.0.1:7000" in out and "ACTIVE" in out

    code, out, _ = run(capsys, "--master", master.address, "operators", "app-0001")
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == 3 and "source" in lines[1] and at5 in lines[1]
    assert lines[0].split()[4:9] == ["WINDOW", "CHECKPOINT", "RECOVERY", "CKPT", "MS"]
    assert lines[1].split()[4:9] == [at5, at5, at5, "12/12", "0"]

    code, out, _ = run(capsys, "--master", master.address, "stats", "app-0001", "source")
    assert code == 0 and "source (id 1)" in out and "last 1 windows" in out and at5 in out
    assert "latest checkpoint:" in out
    assert "1 saved over its life (last 12 ms, average 12.0 ms)" in out
    assert "failures:          0 (0 in a row, restart limit 5)" in out

    code, out, _ = run(capsys, "--master", master.address, "--json", "operators", "app-0001")
    data = json.loads(out)
    assert [op["name"] for op in data["operators"]] == ["source", "sink"]
    assert data["operators"][0]["total_tuples_emitted"] == "9"  # int64 as JSON text
    assert data["operators"][0]["checkpoint_window_id"] == str(w5)
    assert data["operators"][1]["recovery_window_id"] == str(w5)

    for argv in (["apps"], ["containers", "--app", "app-0001"], ["stats", "app-0001", "2"]):
        code, out, _ = run(capsys, "--master", master.address, "--json", *argv)
        assert code == 0 and json.loads(out)

    code, out, _ = run(capsys, "--master", master.address, "submit", "--json", apps["good"])
    assert json.loads(out) == {"application_id": "app-0002"}


def test_shutdown_kill_and_kill_container(capsys, apps, master):
    address = master.address
    for _ in range(2):
        assert run(capsys, "--master", address, "submit", apps["good"])[0] == 0
    code, out, _ = run(capsys, "--master", address, "shutdown", "app-0001")
    assert code == 0 and "shutdown requested" in out
    code, out, _ = run(capsys, "--master", address, "kill", "app-0001", "--reason", "test")
    assert code == 0 and master.core.application_info("app-0001").diagnostics == "test"
    code, _, err = run(capsys, "--master", address, "kill", "app-0001")
    assert_one_line_error(code, err, "already KILLED")
    code, out, _ = run(capsys, "--master", address, "kill-container", "app-0002-c0")
    assert code == 0 and master.launcher.killed == ["app-0002-c0"]
    assert out.startswith("container app-0002-c0 killed; app-0002-c2 replaces it")
    assert master.launcher.launched[-1] == "app-0002-c2"
    assert master.core.application_info("app-0002").recoveries == 1


def test_container_command_execs_the_container_module(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "execv", lambda path, argv: calls.append((path, argv)))
    monkeypatch.delenv("WEIR_MASTER", raising=False)
    cli.main(["container", "--id", "app-0001-c0"])
    cli.main(["--master", "10.0.0.1:5000", "container", "--id", "c1"])
    cli.main(["container", "--master", "h:1", "--id", "c2"])
    assert calls == [
        (sys.executable, [sys.executable, "-m", "weir.container", "--master", "127.0.0.1:5151",
                          "--id", "app-0001-c0"]),
        (sys.executable, [sys.executable, "-m", "weir.container", "--master", "10.0.0.1:5000",
                          "--id", "c1"]),
        (sys.executable, [sys.executable, "-m", "weir.container", "--master", "h:1", "--id", "c2"]),
    ]


def _weir(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "weir", *argv], capture_output=True,
                          text=True, timeout=60, **kwargs)


def test_subprocess_errors_have_no_traceback(apps):
    result = _weir("--master", "127.0.0.1:1", "submit", apps["cycle"])
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("weir: error: ") and "has a cycle" in result.stderr
    result = _weir("--master", "nonsense", "apps")
    assert result.returncode == 1 and result.stderr == (
        "weir: error: bad master address 'nonsense': expected HOST:PORT\n")


def test_weir_master_serves_until_sigint_and_reports_busy_port(master):
    busy_port = master.address.rsplit(":", 1)[1]
    result = _weir("master", "--port", busy_port)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("weir: error: cannot listen on 127.0.0.1:" + busy_port)
    assert len(result.stderr.strip().splitlines()) == 1

    proc = subprocess.Popen([sys.executable, "-m", "weir", "master", "--port", "0",
                             "--launcher", "recording"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        address = proc.stdout.readline().strip()
        assert address.startswith("127.0.0.1:")
        assert _weir("--master", address, "apps").stdout.startswith("no applications")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
    poll_for(lambda: proc.poll() is not None, 5, "weir master to exit")



def test_attribute_options_are_offered_only_where_an_application_is_submitted():
    from weir.master.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert "--config" in sub["run"].format_help() and "-D NAME=VALUE" in sub["submit"].format_help()
    for name in ("apps", "operators", "master", "top"):
        assert "--config" not in sub[name].format_help(), name


def test_weir_run_ends_saying_the_savepoint_it_took(capsys):
    import argparse

    from weir.master.cli_processes import _print_run_result
    from weir.proto import client_pb2

    info = client_pb2.ApplicationInfo(id="app-0001", name="wc", state="FINISHED",
                                      submitted_ms=1_000, finished_ms=15_100,
                                      savepoint_path="/sp/v1", savepoint_state="complete")
    _print_run_result(argparse.Namespace(json=False), info, [])
    out = capsys.readouterr().out
    assert out.splitlines()[-2:] == ["app-0001 wc: FINISHED after 14.1 s",
                                     "savepoint complete at /sp/v1"]


def test_version_and_the_http_options_as_the_help_tells_them():
    version = _weir("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"weir {weir.__version__}"
    text = " ".join(_weir("master", "--help").stdout.split())
    assert "JSON API to anyone who reaches the port, without the read-only HTTP token" in text
    assert "without the master's secret" not in text  # what it said: the secret is never sent


def test_weir_run_refuses_a_column_the_source_does_not_have_before_starting_anything(
        capsys, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "events").mkdir()
    pq.write_table(pa.table({"ts": pa.array([0], pa.timestamp("ms")), "user": ["a"]}),
                   tmp_path / "events" / "part-0.parquet")
    app = tmp_path / "typo.py"
    app.write_text(
        "from weir.operators import Dag\n"
        "from weir.operators.library import EventTimeWindows, ParquetSource\n"
        "from weir.operators.testing import CollectSink\n"
        "dag = Dag('typo')\n"
        f"src = dag.add_operator('events', ParquetSource({str(tmp_path / 'events')!r}),\n"
        "                       EVENT_TIME_COLUMN='ts')\n"
        "w = dag.add_operator('w', EventTimeWindows.tumbling('ts', size_ms=1000, keys='usr'))\n"
        "sink = dag.add_operator('sink', CollectSink())\n"
        "dag.add_stream('rows', src.output, w.input)\n"
        "dag.add_stream('out', w.output, sink.input)\n")
    code, out, err = run(capsys, "run", str(app), "--log-dir", str(tmp_path / "logs"))
    assert_one_line_error(code, err, "operator 'w': keys names column 'usr', which 'events' "
                                     "does not emit", "did you mean 'user'?")
    assert not (tmp_path / "logs").exists()  # no launcher, so no container, was started


def test_the_client_submits_a_dag_as_it_is_or_as_its_descriptor(master, apps):
    from weir.master.client import WeirClient
    from weir.operators.app import load_app

    dag = load_app(apps["good"])
    with WeirClient(master.address) as client:
        first = client.submit(dag)
        second = client.submit(dag.to_descriptor(), {"sink.QUEUE_CAPACITY": "64"})
        assert {a.id for a in client.applications()} >= {first, second}
        assert client.application(first).name == client.application(second).name == dag.name

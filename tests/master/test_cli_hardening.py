"""The CLI and the master facing bad input (issue 29, items 4, 12, 15, 17): savepoint paths
are the caller's, bad manifests and paths are clear refusals (never INTERNAL), an app file
that exits is an error, ports are 0..65535."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.master.test_cli import APP_HEADER, APPS, assert_one_line_error, run
from weir.master import cli
from weir.master.client import WeirClient, WeirClientError
from weir.master.launcher import RecordingLauncher
from weir.master.server import MasterServer
from weir.operators.app import load_app
from weir.storage.private_files import make_private_dir, write_private_file
from weir.storage.savepoints import MANIFEST, Manifest, SavedOperator, SavedPartition

pytestmark = pytest.mark.timeout(120)

WINDOW = (1_700_000_000 << 32) + 7


@pytest.fixture
def master():
    server = MasterServer(launcher_factory=RecordingLauncher, loop_interval_s=0.05)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def app_file(tmp_path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(APP_HEADER + textwrap.dedent(body))
    return str(path)


def savepoint_of_good(folder, good: str, window: int = WINDOW) -> str:
    """A complete savepoint the "good" app (source -> sink) at ``good`` matches, at
    ``folder``."""
    classes = {op.name: op.class_name for op in load_app(good).to_descriptor().operators}
    operators = [SavedOperator("source", classes["source"], [SavedPartition(1, WINDOW)]),
                 SavedOperator("sink", classes["sink"], [SavedPartition(2, WINDOW)])]
    make_private_dir(str(folder))
    write_private_file(str(folder / MANIFEST),
                       Manifest(window, "good", "app-0001", operators).to_json().encode())
    return str(folder)


def good_descriptor(tmp_path):
    return load_app(app_file(tmp_path, "good", APPS["good"])).to_descriptor()


# -- item 12: relative savepoint paths are the caller's ---------------------------------------
def test_weir_savepoint_sends_a_relative_path_made_absolute_here(capsys, master, tmp_path,
                                                                 monkeypatch):
    good = app_file(tmp_path, "good", APPS["good"])
    code, out, _ = run(capsys, "--master", master.address, "submit", good)
    app_id = out.strip()
    assert code == 0
    monkeypatch.chdir(tmp_path)
    run(capsys, "--master", master.address, "savepoint", app_id, "saved/v1", "--wait", "0")
    assert master.core.application_info(app_id).savepoint_path == str(tmp_path / "saved/v1")


def test_weir_submit_from_a_relative_savepoint_sends_it_made_absolute_here(
        capsys, master, tmp_path, monkeypatch):
    good = app_file(tmp_path, "good", APPS["good"])
    savepoint_of_good(tmp_path / "sp", good)
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "--master", master.address, "submit", good,
                         "--from-savepoint", "sp")
    assert code == 0, err
    info = master.core.application_info(out.strip())
    assert info.from_savepoint == str(tmp_path / "sp")
    assert f"at {tmp_path / 'sp'}, window" in err


@pytest.mark.parametrize(("argv", "attribute", "expected"), [
    (["savepoint", "app-1", "s3://KEY:SECRET@bucket/sp"], "path", "s3://KEY:SECRET@bucket/sp"),
    (["savepoint", "app-1", "/abs/sp/../v1"], "path", "/abs/sp/../v1"),
    (["savepoint", "app-1", "./v1"], "path", "<cwd>/v1"),
    (["submit", "a.py", "--from-savepoint", "gs://b/sp"], "from_savepoint", "gs://b/sp"),
    (["submit", "a.py", "--from-savepoint", "../sp"], "from_savepoint", "<parent>/sp"),
    (["submit", "a.py"], "from_savepoint", None),
])
def test_uris_and_absolute_paths_are_sent_as_they_are(monkeypatch, tmp_path, argv, attribute,
                                                     expected):
    seen = []
    for name in ("cmd_savepoint", "cmd_submit"):
        monkeypatch.setattr(cli, name, lambda args: seen.append(args) or 0)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--master", "127.0.0.1:1", *argv]) == 0
    wanted = expected and expected.replace("<cwd>", str(tmp_path)).replace(
        "<parent>", str(tmp_path.parent))
    assert getattr(seen[0], attribute) == wanted


# -- items 4 and 15: bad manifests and paths are refusals, never INTERNAL --------------------
@pytest.mark.parametrize(("content", "fragment"), [
    (None, "'window' is 1208925819614629174706176, not an integer in 0..2**63-1"),
    (b"[]", "is [], not a JSON object"),
    (b"null", "is None, not a JSON object"),
    (b"\xff{}", "is not UTF-8 text"),
])
def test_a_bad_manifest_is_refused_at_submit_and_apps_still_answer(capsys, master, tmp_path,
                                                                  content, fragment):
    good = app_file(tmp_path, "good", APPS["good"])
    path = savepoint_of_good(tmp_path / "sp", good, window=2**80)
    if content is not None:
        write_private_file(f"{path}/{MANIFEST}", content)
    with WeirClient(master.address) as client:
        with pytest.raises(WeirClientError) as raised:
            client.submit(load_app(good).to_descriptor(), from_savepoint=path)
        assert fragment in str(raised.value) and "INTERNAL" not in str(raised.value)
    code, out, err = run(capsys, "--master", master.address, "apps")
    assert code == 0, err
    with pytest.raises(SystemExit) as exited:  # the CLI reads it first, and says why
        cli.main(["--master", master.address, "submit", good, "--from-savepoint", path])
    assert exited.value.code == 2 and fragment in capsys.readouterr().err


@pytest.mark.parametrize(("path", "fragment"), [
    ("foo://bucket/sp", "unknown scheme 'foo'"),
    ("/tmp/sp\0x", "holds a NUL character"),
])
def test_a_bad_savepoint_path_is_a_clear_refusal(capsys, master, tmp_path, path, fragment):
    with WeirClient(master.address) as client:
        with pytest.raises(WeirClientError) as raised:
            client.submit(good_descriptor(tmp_path), from_savepoint=path)
        assert fragment in str(raised.value) and "INTERNAL" not in str(raised.value)
        app_id = client.submit(good_descriptor(tmp_path))
        with pytest.raises(WeirClientError) as raised:
            client.take_savepoint(app_id, path)
        assert fragment in str(raised.value) and "INTERNAL" not in str(raised.value)
    code, _, err = run(capsys, "--master", master.address, "savepoint", app_id, path)
    assert_one_line_error(code, err, fragment)
    assert "internal error" not in err


# -- item 17: an app that exits; ports ---------------------------------------------------------
@pytest.mark.parametrize(("body", "fragment"), [
    ("raise SystemExit(0)\n", "exited (SystemExit(0)) while building the DAG"),
    ("import sys\nsys.exit()\n", "exited (SystemExit(None)) while building the DAG"),
    ("raise SystemExit(3)\n", "exited (SystemExit(3))"),
    ("def build_dag():\n    raise SystemExit(0)\n", "exited (SystemExit(0))"),
    ("class Stop(BaseException):\n    pass\nraise Stop('no')\n", "failed while building the "
                                                               "DAG: Stop: no"),
])
@pytest.mark.parametrize("command", ["submit", "run"])
def test_an_app_that_exits_while_building_its_dag_is_an_error_naming_it(
        capsys, tmp_path, body, fragment, command):
    path = app_file(tmp_path, "exits", body)
    code, out, err = run(capsys, "--master", "127.0.0.1:1", command, path)
    assert_one_line_error(code, err, path, fragment)
    assert code != 0 and out == ""


@pytest.mark.parametrize("argv", [
    ["master", "--port", "70000"],
    ["master", "--port", "-1"],
    ["master", "--port", "x"],
    ["master", "--http-port", "65536"],
    ["master", "--http-port", "-2"],
    ["run", "app.py", "--http-port", "70000"],
])
def test_a_port_outside_0_to_65535_is_refused(capsys, argv):
    code, _, err = run(capsys, *argv)
    assert_one_line_error(code, err, "port")
    assert code == 2 and ("is outside" in err or "invalid port 'x'" in err)


def test_ports_at_the_bounds_are_taken():
    parser = cli.build_parser()
    assert parser.parse_args(["master", "--port", "65535"]).port == 65535
    assert parser.parse_args(["master", "--port", "0", "--http-port", "-1"]).http_port == -1
    assert parser.parse_args(["run", "a.py", "--http-port", "65535"]).http_port == 65535


def test_a_full_manifest_round_trips_through_the_checks():
    text = Manifest(WINDOW, "good", "app-0001", [
        SavedOperator("source", "Source", [SavedPartition(1, -1)])],
        streams=[{"name": "s", "source": "source.output", "sinks": ["sink.input"]}],
        attributes={"CONTAINERS": "1"}, created_ms=1).to_json()
    assert Manifest.from_json(text).to_json() == text
    assert json.loads(text)["window"] == WINDOW

"""The monitoring commands: ``weir app``, ``containers ID``, ``top``, ``--json`` on each."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

from tests.master.fakes import ManualClock
from tests.master.monitoring import WINDOWS, submit_known_app
from weir.master import cli, cli_processes, live_view
from weir.master.launcher import RecordingLauncher
from weir.master.server import MasterServer
from weir.proto import client_pb2

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def known():
    """A master (no containers launched) with one application of known figures."""
    clock = ManualClock()
    server = MasterServer(launcher_factory=RecordingLauncher, clock=clock, loop_interval_s=0.05)
    server.start()
    try:
        yield server, submit_known_app(server.core, clock)
    finally:
        server.stop()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_app_shows_totals_latency_operators_and_metrics(capsys, known):
    server, app_id = known
    code, out, err = run(capsys, "--master", server.address, "app", app_id)
    assert code == 0, err
    assert f"{app_id} (chain)" in out and "RUNNING" in out
    assert f"tuples processed: {WINDOWS * 150:,} (300.0/s)" in out
    assert "latency:          50 ms along source -> relay1 -> sink" in out
    assert "dropped=500" in out  # the relay's user metric
    code, out, _ = run(capsys, "--master", server.address, "app", app_id, "--json")
    data = json.loads(out)
    assert data["latency_ms"] == 50.0 and data["critical_path"] == ["source", "relay1", "sink"]
    relay = next(op for op in data["logical_operators"] if op["name"] == "relay1")
    assert relay["metrics"] == {"dropped": 500.0}


def test_every_query_command_has_json(capsys, known):
    server, app_id = known
    for argv in (["apps"], ["app", app_id], ["containers", app_id], ["operators", app_id],
                 ["stats", app_id, "relay1"], ["top", app_id, "--count", "1"]):
        code, out, err = run(capsys, "--master", server.address, "--json", *argv)
        assert code == 0, (argv, err)
        assert json.loads(out), argv
    code, out, _ = run(capsys, "--master", server.address, "containers", app_id)
    assert code == 0 and f"{app_id}-c0" in out and "testhost" in out


def test_stats_shows_port_rates_window_latency_and_metrics(capsys, known):
    server, app_id = known
    code, out, _ = run(capsys, "--master", server.address, "stats", app_id, "relay1")
    assert code == 0
    assert "BYTES/S" in out and "800 B/s" in out
    assert "metrics:" in out and "dropped=500" in out
    lines = [line for line in out.splitlines() if "dropped=" in line and "ms" in line]
    assert len(lines) == 10 and all(" 20 ms " in line for line in lines)


def test_top_refreshes_until_count_and_json_is_one_document_per_line(capsys, known):
    server, app_id = known
    code, out, _ = run(capsys, "--master", server.address, "top", app_id, "--count", "2",
                       "--interval", "0.05")
    assert code == 0 and out.count(f"{app_id} chain RUNNING") == 2 and "relay1" in out
    code, out, _ = run(capsys, "--master", server.address, "--json", "top", app_id,
                       "--count", "3", "--interval", "0.05")
    documents = [json.loads(line) for line in out.splitlines()]
    assert len(documents) == 3
    assert documents[-1]["application"]["total_tuples_processed"] == str(WINDOWS * 150)
    assert [op["name"] for op in documents[0]["operators"]] == ["source", "relay1", "sink"]


def test_top_stops_on_ctrl_c_and_refuses_unknown_apps(capsys, known):
    server, _ = known
    calls = []

    def read() -> live_view.Snapshot:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return live_view.Snapshot(client_pb2.ApplicationInfo(id="a"), [], [])

    out = io.StringIO()
    assert live_view.run_top(read, out=out, sleep=lambda s: None) == 0
    assert len(calls) == 3 and out.getvalue().count("ID  NAME") == 2  # two refreshes shown
    code, _, err = run(capsys, "--master", server.address, "top", "app-9999", "--count", "1")
    assert code == 1 and "unknown application" in err


def test_progress_line_is_live_on_a_terminal_and_periodic_otherwise():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    app = client_pb2.ApplicationInfo(id="app-0001", state="RUNNING", current_window_id=7,
                                     committed_window_id=-1, tuples_processed_per_second=1500)
    tty = Tty()
    line = live_view.ProgressLine(tty)
    line.show(app)
    line.show(app)
    line.clear()
    text = tty.getvalue()
    assert "\n" not in text and text.count("1,500.0 tuples/s") == 2
    assert text.endswith(" \r")  # cleared for the final report
    plain = io.StringIO()
    line = live_view.ProgressLine(plain, every_s=60)
    line.show(app)
    line.show(app)  # too soon: nothing
    app.state = "FINISHED"
    line.show(app)  # a new state: a line at once
    assert plain.getvalue().count("\n") == 2 and "\r" not in plain.getvalue()
    quiet = io.StringIO()
    live_view.ProgressLine(quiet, quiet=True).show(app)
    assert quiet.getvalue() == ""


def test_progress_says_what_it_waits_for_before_the_first_window():
    app = client_pb2.ApplicationInfo(id="app-0001", state="RUNNING", current_window_id=-1,
                                     containers_active=1, containers_planned=2)
    assert live_view.progress_text(app) == "app-0001 RUNNING: no window yet, starting " \
                                           "containers (1/2 up)"
    app.containers_active = 2
    assert "no window yet, operators setting up (a container that runs Spark starts it " \
           "first" in live_view.progress_text(app)
    app.current_window_id = 7
    assert "no window yet" not in live_view.progress_text(app)


def test_weir_master_serves_http_on_the_port_asked_and_can_go_without():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "weir", "master", "--port", "0", "--json",
                             "--launcher", "recording", "--http-port", str(port),
                             "--metrics-open"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        lines = []
        while not lines or lines[-1].strip() != "}":
            lines.append(proc.stdout.readline())
            assert lines[-1], "weir master printed no JSON"
        started = json.loads("".join(lines))
        assert started["dashboard"] == f"http://127.0.0.1:{port}/"
        with urllib.request.urlopen(started["dashboard"] + "metrics", timeout=10) as response:
            assert b"process_cpu_seconds_total" in response.read()  # open: no secret needed
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        proc.stdout.close()
    off = cli.build_parser().parse_args(["master", "--http-port", "-1"])
    assert cli_processes._http_options(off) == {"http_port": None, "http_open": False,
                                                "metrics_open": False}

"""``weir logs``: the end of an application's container logs, from the master that keeps
them (``--log-dir``), through the client API."""

from __future__ import annotations

import pytest

from weir.master import cli
from weir.master.client import WeirClient
from weir.master.launcher import RecordingLauncher
from weir.master.server import MasterServer
from weir.operators import Dag
from weir.operators.library import EventGenerator
from weir.operators.testing import CollectSink

pytestmark = pytest.mark.timeout(180)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_weir_logs_shows_each_containers_log_and_one_on_request(master, capsys):
    dag = Dag("logged", CONTAINERS=2, STREAMING_WINDOW_SIZE_MILLIS=100,
              HEARTBEAT_INTERVAL_MILLIS=200)
    source = dag.add_operator("source", EventGenerator(rate_per_second=500, keys=3,
                                                       total=200), CONTAINER=0)
    sink = dag.add_operator("sink", CollectSink(), CONTAINER=1)
    dag.add_stream("events", source.output, sink.input)
    with WeirClient(master.address) as client:
        app_id = client.submit(dag)
        assert client.wait(app_id, 120).state == "FINISHED"
        ids = sorted(c.id for c in client.containers(app_id))
    for container_id in ids:  # something the container wrote, to find again
        with open(master.log_dir / f"{container_id}.log", "a") as log:
            log.write(f"marker of {container_id}\n" + "x" * 200 + "\nlast line\n")
    code, out, _ = run(capsys, "--master", master.address, "logs", app_id)
    assert code == 0
    for container_id in ids:
        assert f"==> {container_id} ({master.log_dir / (container_id + '.log')}) <==" in out
        assert f"marker of {container_id}" in out
    code, out, _ = run(capsys, "--master", master.address, "logs", app_id, ids[1],
                       "--bytes", "120")
    assert code == 0 and "==>" not in out  # one container: no header
    assert out.splitlines()[0] == f"[... the start of the log is in {master.log_dir}/" \
                                  f"{ids[1]}.log]"
    assert out.endswith("last line\n") and "marker" not in out  # from a line's start
    code, _, err = run(capsys, "--master", master.address, "logs", app_id, ids[0],
                       "--bytes", str(5 << 20))  # more than the master hands out: refused
    assert code == 1 and "max_bytes must be 0 (the default, 65,536) to 4,194,304" in err
    code, _, err = run(capsys, "--master", master.address, "logs", app_id, "app-0999-c0")
    assert code == 1 and f"application {app_id} has no container 'app-0999-c0'" in err


def test_a_master_without_a_log_folder_says_how_to_keep_logs(capsys):
    server = MasterServer(launcher_factory=RecordingLauncher, loop_interval_s=0.05)
    server.start()
    try:
        dag = Dag("unlogged", CONTAINERS=1)
        source = dag.add_operator("source", EventGenerator(rate_per_second=10, keys=1))
        sink = dag.add_operator("sink", CollectSink())
        dag.add_stream("events", source.output, sink.input)
        with WeirClient(server.address) as client:
            app_id = client.submit(dag)
            (container,) = client.containers(app_id)
        code, _, err = run(capsys, "--master", server.address, "logs", app_id, container.id)
        assert code == 1 and "this master keeps no container logs" in err
        assert "start it with --log-dir DIR" in err
    finally:
        server.stop()

"""A second run on the STATE_DIR of a first run that was killed several times: it deploys
above the fences the first run left there, so no deployment of it is refused as stale.

Issue 36: every run started its generations at 1, so the first run's fences (at 3 after two
kills) refused the second run's first deploys; with MAX_RESTARTS=1 it failed.
"""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

from tests.e2e.conftest import container_logs
from tests.e2e.test_exactly_once import write_input
from tests.e2e.test_master_restart import COUNT_WORDS
from tests.e2e.test_recovery import wait_finished, where_it_stands
from tests.e2e.wordcount import published_counts
from tests.harness import poll_for
from weir.master.client import WeirClient
from weir.operators.app import load_app

APP = COUNT_WORDS + """
    dag = Dag("second-run", CONTAINERS=2, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, HEARTBEAT_TIMEOUT_MILLIS=4000,
              CHECKPOINT_WINDOW_COUNT=2, STATE_DIR={state!r}, MAX_RESTARTS={restarts})
    source = dag.add_operator("source", DirectorySource({inbox!r}, delete_consumed=True,
                                                        bytes_per_window=4000), CONTAINER=0)
    count = dag.add_operator("count", CountWords(), CONTAINER=1)
    sink = dag.add_operator("sink", FileSink({out!r}, exactly_once=True), CONTAINER=1)
    dag.add_stream("lines", source.output, count.input)
    dag.add_stream("counts", count.output, sink.input)
"""


def _submit(client: WeirClient, tmp_path: Path, run: str, restarts: int) -> str:
    app = tmp_path / f"{run}.py"
    app.write_text(textwrap.dedent(APP.format(
        state=str(tmp_path / "state"), inbox=str(tmp_path / f"{run}-inbox"),
        out=str(tmp_path / f"{run}-out"), restarts=restarts)))
    return client.submit(load_app(app).to_descriptor())


def _sink_container(client: WeirClient, app_id: str) -> tuple[str, int] | None:
    """The sink's container and its pid, once that container has registered."""
    op = next(o for o in client.operators(app_id) if o.name == "sink")
    container = next((c for c in client.containers(app_id) if c.id == op.container_id), None)
    if container is None or not container.process_name:
        return None
    return container.id, int(container.process_name.split("@")[0])


def _kill_sink_container(client: WeirClient, app_id: str) -> None:
    """SIGKILLs the sink's container, then waits until its replacement committed a window."""
    container_id, pid = poll_for(lambda: _sink_container(client, app_id), 60,
                                 "the sink's container to register")
    committed = client.application(app_id).committed_window_id
    os.kill(pid, signal.SIGKILL)
    poll_for(lambda: (_sink_container(client, app_id) or (container_id,))[0] != container_id
             and client.application(app_id).committed_window_id > committed, 60,
             f"the sink's container to be replaced\n{where_it_stands(client, app_id)}")


def test_a_second_run_on_a_killed_runs_state_dir_deploys_without_a_refusal(master, tmp_path):
    # ~390 kB at 4,000 bytes a window: ~20 s of input, through which two kills land (each
    # waits for its replacement to commit: a few seconds, no Spark)
    first_expected = write_input(tmp_path / "first-inbox", files=30)
    second_expected = write_input(tmp_path / "second-inbox", files=10)
    client = WeirClient(master.address)
    first = _submit(client, tmp_path, "first", restarts=8)
    poll_for(lambda: client.application(first).committed_window_id >= 0, 60,
             f"a first committed window\n{where_it_stands(client, first)}")
    for _ in range(2):
        _kill_sink_container(client, first)
    wait_finished(client, master, first, 180)
    fenced_at = max(o.generation for o in client.operators(first))
    assert fenced_at >= 3, where_it_stands(client, first)
    assert published_counts(tmp_path / "first-out")[0] == first_expected

    second = _submit(client, tmp_path, "second", restarts=1)
    wait_finished(client, master, second, 180)
    operators = client.operators(second)
    assert all(o.failure_count == 0 for o in operators), (
        f"a deployment of the second run was refused\n{where_it_stands(client, second)}")
    assert min(o.generation for o in operators) > fenced_at
    assert "fenced off" not in container_logs(master)
    assert published_counts(tmp_path / "second-out")[0] == second_expected

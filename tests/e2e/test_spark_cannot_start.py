"""Spark that cannot start is a state and an error, never a silent wait, through real
processes: with a Java that says it is 17 but cannot start Spark's JVM, each spare exits
saying so and is replaced (until the master gives spares up), and the working
container's operator fails with the warm-up's error, so the application fails naming it.
With no Java at all, the submit is refused at once in one sentence saying what to
install: nothing starts, nothing is retried."""

from __future__ import annotations

import stat
import textwrap
from pathlib import Path

import pytest

from tests.e2e.conftest import container_logs
from tests.harness import poll_for
from weir.master.client import WeirClient, WeirClientError
from weir.operators.app import load_app

pytestmark = pytest.mark.timeout(300)

APP = """
    from weir.operators import Dag
    from weir.operators.library import EventGenerator, FileSink, WindowedCount

    dag = Dag("no-java", CONTAINERS=2, SPARE_CONTAINERS=1, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, HEARTBEAT_TIMEOUT_MILLIS=5000, MAX_RESTARTS=3,
              STATE_DIR={state!r}, SPARK_MASTER="local[1]", SPARK_WARMUP_ROWS=1000)
    source = dag.add_operator("source", EventGenerator(rate_per_second=1000, keys=5,
                                                       total=100_000), CONTAINER=0)
    count = dag.add_operator("count", WindowedCount(key="key", value="value"), CONTAINER=1)
    sink = dag.add_operator("sink", FileSink({out!r}), CONTAINER=1)
    dag.add_stream("events", source.output, count.input)
    dag.add_stream("counts", count.output, sink.input)
"""


def broken_java(folder: Path) -> str:
    """A JAVA_HOME whose java tells its version (17) but starts nothing else."""
    binary = folder / "bin" / "java"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\nif [ \"$1\" = -version ]; then\n"
                      "  echo 'openjdk version \"17.0.9\" 2023-10-17' >&2; exit 0\nfi\n"
                      "echo 'this Java cannot start a JVM' >&2\nexit 1\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return str(folder)


def test_a_spark_that_cannot_start_fails_spares_and_operators_visibly(
        master, tmp_path, monkeypatch):
    # containers inherit it; the master's check at submit finds a Java 17 there
    monkeypatch.setenv("JAVA_HOME", broken_java(tmp_path / "broken-java"))
    app_file = tmp_path / "no_java.py"
    app_file.write_text(textwrap.dedent(APP.format(state=str(tmp_path / "state"),
                                                   out=str(tmp_path / "out"))))
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app_file).to_descriptor())

        def a_spare_replaced_saying_why() -> list[str]:
            errors = [f.message for f in client.application(app_id).recent_failures]
            replaced = [c for c in client.containers(app_id) if c.spare and c.replaced_by]
            said = [e for e in errors if "Spark did not start in this spare" in e]
            return said if replaced and said else []

        said = poll_for(a_spare_replaced_saying_why, 180,
                        f"a spare that exits saying why, replaced\n{container_logs(master)}")
        assert "JAVA_GATEWAY_EXITED" in said[0] or "Java gateway" in said[0], said[0]
        assert not [c for c in client.containers(app_id) if c.state == "SPARE"]

        info = client.wait(app_id, 180)
        assert info.state == "FAILED", info.diagnostics
        count = next(o for o in client.operators(app_id) if o.name == "count")
        assert "Spark could not start or warm up" in count.error, count.error
        assert "Spark could not start or warm up" in info.diagnostics, info.diagnostics


def test_without_java_the_submit_is_refused_at_once_saying_what_to_install(
        master, tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java-here"))  # containers inherit it
    app_file = tmp_path / "no_java.py"
    app_file.write_text(textwrap.dedent(APP.format(state=str(tmp_path / "state"),
                                                   out=str(tmp_path / "out"))))
    with WeirClient(master.address) as client:
        with pytest.raises(WeirClientError) as refused:
            client.submit(load_app(app_file).to_descriptor())
        message = str(refused.value)
        assert "Spark needs Java" in message and "install Java 17 or newer" in message
        assert "\n" not in message  # one sentence
        assert client.applications() == [] and not list(master.log_dir.glob("*.log"))

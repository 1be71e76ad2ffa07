"""`weir run` as a user runs it: a subprocess that must leave no process behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import textwrap

import psutil
import pytest

from tests.harness import WeirProcess, poll_for, tagged_env, tagged_processes

PLAIN_APP = """
    import pyarrow as pa
    from weir.operators import Dag, Operator, InputPort, OutputPort
    from weir.operators.testing import ListSource
    from weir.operators.library import FileSink

    class Double(Operator):
        input = InputPort()
        output = OutputPort()

        def process(self, port, batch):
            if {fail!r}:
                raise ValueError("cannot double this")
            self.output.emit(pa.record_batch({{"x": pa.compute.multiply(batch.column("x"), 2)}}))

    dag = Dag("plain", HEARTBEAT_INTERVAL_MILLIS=200, STREAMING_WINDOW_SIZE_MILLIS=100)
    src = dag.add_operator("src", ListSource([[{{"x": i}} for i in range(k, k + 5)]
                                              for k in range(0, 50, 5)]))
    double = dag.add_operator("double", Double())
    out = dag.add_operator("out", FileSink({out!r}), CONTAINER=1)
    dag.add_stream("a", src.output, double.input)
    dag.add_stream("b", double.output, out.input)
"""

SPARK_FOREVER_APP = """
    from weir.operators import Dag
    from weir.operators.library import EventGenerator, WindowedCount, ConsoleSink

    dag = Dag("forever", HEARTBEAT_INTERVAL_MILLIS=200, SPARK_MASTER="local[1]",
              SPARK_SHUFFLE_PARTITIONS=1, SPARK_WARMUP_ROWS=0)
    gen = dag.add_operator("gen", EventGenerator(rate_per_second=2_000, keys=10))
    count = dag.add_operator("count", WindowedCount(key="key", value="value"))
    sink = dag.add_operator("sink", ConsoleSink(limit=1), CONTAINER=1)
    dag.add_stream("events", gen.output, count.input)
    dag.add_stream("counts", count.output, sink.input)
"""


@pytest.fixture
def weir(tmp_path):
    """Starts `weir ARGS` tagged; on teardown stops it and what it started.

    A `weir` that exited by itself must have left no process. One the test left running
    (it failed midway) is killed; its containers would wait out their master-retry window
    (30 s) before exiting, so they are killed too (the tag proves they are this test's).
    """
    started: list[WeirProcess] = []

    def start(*args: str) -> WeirProcess:
        env, tag = tagged_env()
        proc = WeirProcess(list(args), env, tmp_path, tmp_path / f"weir-{len(started)}.log")
        proc.tag = tag
        started.append(proc)
        return proc

    yield start
    for proc in started:
        exited_by_itself = proc.proc.poll() is not None
        proc.stop()
        if not exited_by_itself:
            for leftover in tagged_processes(proc.tag):
                with contextlib.suppress(psutil.Error):
                    leftover.kill()
        poll_for(lambda proc=proc: not tagged_processes(proc.tag), 15,
                 f"every process of that weir run to exit; output:\n{proc.output()}")


def write(tmp_path, source: str, **values: object) -> str:
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent(source.format(**values)))
    return str(app)


def test_run_succeeds_prints_stats_and_leaves_no_process(weir, tmp_path):
    app = write(tmp_path, PLAIN_APP, fail=False, out=str(tmp_path / "out"))
    proc = weir("run", app, "--json")
    assert proc.wait(120) == 0, proc.output()
    result = json.loads(proc.output()[proc.output().index("{"):])
    assert result["application"]["state"] == "FINISHED"
    emitted = {op["name"]: int(op.get("total_tuples_emitted", 0)) for op in result["operators"]}
    assert emitted == {"src": 50, "double": 50, "out": 0}
    values = sorted(json.loads(line)["x"] for f in (tmp_path / "out").glob("*.jsonl")
                    for line in f.read_text().splitlines())
    assert values == [2 * i for i in range(50)]
    assert not tagged_processes(proc.tag), "containers outlived a finished weir run"


def test_run_of_failing_operator_exits_non_zero_naming_the_error(weir, tmp_path):
    app = write(tmp_path, PLAIN_APP, fail=True, out=str(tmp_path / "out"))
    proc = weir("run", app)
    assert proc.wait(120) == 1, proc.output()
    output = proc.output()
    assert "FAILED" in output
    # the result names the error in one line; the full tracebacks are in the containers'
    # log, which (without --log-dir) is the terminal weir run shares with them
    result = output[output.rindex("app-0001 plain: FAILED"):]
    assert "ValueError: cannot double this (at app.py:" in result
    assert "Traceback" not in result


def test_ctrl_c_stops_containers_and_spark_jvms(weir, tmp_path):
    proc = weir("run", write(tmp_path, SPARK_FOREVER_APP))

    def java_running() -> bool:
        return any("java" in (p.info["name"] or "") for p in tagged_processes(proc.tag))

    poll_for(java_running, 120, f"Spark's JVM to start in a container:\n{proc.output()}")
    poll_for(lambda: "-- sink" in proc.output(), 120,
             f"a first window result:\n{proc.output()}")
    proc.interrupt()
    assert proc.wait(60) == 130, proc.output()
    assert "interrupted" in proc.output()
    poll_for(lambda: not tagged_processes(proc.tag), 15,
             f"every container and JVM to exit after Ctrl-C:\n{proc.output()}")


def test_a_master_whose_terminal_closes_stops_and_removes_its_secret(weir, tmp_path):
    proc = weir("master", "--port", "0", "--json")
    started = poll_for(lambda: "}" in proc.output() and proc.output(), 60,
                       "the master to start")
    secret_file = json.loads(started[started.index("{"):started.index("}") + 1])["secret_file"]
    assert os.path.exists(secret_file)
    proc.proc.send_signal(signal.SIGHUP)  # what closing its terminal sends
    assert proc.wait(30) == 0, proc.output()
    assert not os.path.exists(secret_file), "the secret file outlived the master"


SLOW_APP = """
    from weir.operators import Dag
    from weir.operators.testing import ListSource
    from weir.operators.library import ConsoleSink

    dag = Dag("slow", HEARTBEAT_INTERVAL_MILLIS=200, STREAMING_WINDOW_SIZE_MILLIS=100)
    src = dag.add_operator("src", ListSource([[{{"x": i}}] for i in range(3_000)]))
    sink = dag.add_operator("sink", ConsoleSink(limit=1), CONTAINER=1)
    dag.add_stream("a", src.output, sink.input)
"""


def test_other_weir_commands_find_a_running_weir_run_without_flags(weir, tmp_path):
    """`weir run`'s embedded master takes any free port; `weir apps` and `weir operators`
    in another terminal find it through its secret file, with no --master."""
    run = weir("run", write(tmp_path, SLOW_APP))

    def listed() -> str | None:
        apps = weir("apps", "--json")
        apps.wait(30)
        return apps.output() if '"app-0001"' in apps.output() else None

    found = poll_for(listed, 90, f"weir apps to list weir run's application:\n{run.output()}",
                     interval_s=0.5)
    assert '"slow"' in found
    operators = weir("operators", "app-0001")
    assert operators.wait(30) == 0, operators.output()
    assert "src" in operators.output() and "sink" in operators.output()
    run.interrupt()  # Ctrl-C: weir run stops its application and containers
    assert run.wait(60) == 130, run.output()

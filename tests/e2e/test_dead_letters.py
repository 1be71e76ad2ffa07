"""Dead letters through real processes: a Python operator and a Spark job each fail on 3
known rows of 100,000; the application finishes with exactly those rows on the
dead-letter outputs and every other row processed once, although the container running
both operators is SIGKILLed mid-run."""

from __future__ import annotations

import collections
import json
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import container_logs
from tests.e2e.test_exactly_once import chaos_seed, live_container_pids
from tests.e2e.test_recovery import wait_finished
from tests.harness import poll_for
from weir.master.client import WeirClient
from weir.operators.app import load_app

pytestmark = pytest.mark.timeout(420)

ROWS, PER_WINDOW = 100_000, 1_000
BAD_PYTHON = (7, 41_234, 99_999)
BAD_SPARK = (3, 50_000, 77_777)

APP = """
    import pyarrow as pa
    from weir.operators import Dag, Operator, InputPort, OutputPort
    from weir.operators.library import FileSink
    from weir.operators.spark import SparkSql
    from weir.operators.testing import ListSource

    BAD = {bad_python!r}

    class Validate(Operator):
        '''Passes batches on whole; raises on a batch holding an id it refuses.'''
        input = InputPort()
        output = OutputPort()

        def process(self, port, batch):
            bad = [i for i in batch.column("id").to_pylist() if i in BAD]
            if bad:
                raise ValueError(f"id {{bad[0]}} is refused")
            self.output.emit(batch)

    windows = [pa.record_batch({{"id": list(range(w, w + {per_window}))}})
               for w in range(0, {rows}, {per_window})]
    dag = Dag("dead-letters", CONTAINERS=3, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, HEARTBEAT_TIMEOUT_MILLIS=3000,
              CHECKPOINT_WINDOW_COUNT=4, STATE_DIR={state!r}, SPARK_MASTER="local[1]",
              SPARK_SHUFFLE_PARTITIONS=1, SPARK_WARMUP_ROWS=0, MAX_RESTARTS=8)
    source = dag.add_operator("source", ListSource(windows), CONTAINER=0)
    validate = dag.add_operator("validate", Validate(), CONTAINER=1, ON_ERROR="DEAD_LETTER")
    double = dag.add_operator("double", SparkSql(
        "SELECT id, CASE WHEN id IN {bad_spark!r} THEN raise_error(concat('bad id ', id)) "
        "ELSE id * 2 END AS twice FROM input"), CONTAINER=1, ON_ERROR="DEAD_LETTER")
    out = dag.add_operator("out", FileSink({out!r}, exactly_once=True), CONTAINER=2)
    dead_python = dag.add_operator("dead_python", FileSink({dead_python!r},
                                   exactly_once=True), CONTAINER=2)
    dead_spark = dag.add_operator("dead_spark", FileSink({dead_spark!r},
                                  exactly_once=True), CONTAINER=2)
    dag.add_stream("ids", source.output, validate.input)
    dag.add_stream("valid", validate.output, double.input)
    dag.add_stream("doubled", double.output, out.input)
    dag.add_stream("refused", validate.errors, dead_python.input)
    dag.add_stream("failed", double.errors, dead_spark.input)
"""


def rows_in(folder: Path) -> list[dict]:
    return [json.loads(line) for file in sorted(folder.glob("*.jsonl"))
            for line in file.read_text().splitlines()]


def test_bad_rows_become_dead_letters_exactly_once_through_a_sigkill(master, tmp_path):
    rng, note = chaos_seed()
    app = tmp_path / "dead_letters_app.py"
    app.write_text(textwrap.dedent(APP.format(
        bad_python=set(BAD_PYTHON), bad_spark=BAD_SPARK, rows=ROWS, per_window=PER_WINDOW,
        state=str(tmp_path / "state"), out=str(tmp_path / "out"),
        dead_python=str(tmp_path / "dead-python"), dead_spark=str(tmp_path / "dead-spark"))))
    started = time.monotonic()
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        poll_for(lambda: client.application(app_id).committed_window_id >= 0, 90,
                 f"a first committed window\n{container_logs(master)}")
        time.sleep(rng.uniform(0.5, 3.0))
        workers = next(o for o in client.operators(app_id) if o.name == "double").container_id
        pid = live_container_pids(client, app_id).get(workers)
        assert pid is not None and client.application(app_id).state == "RUNNING", \
            f"the run ended before the kill; {note}"
        os.kill(pid, signal.SIGKILL)
        wait_finished(client, master, app_id, timeout_s=300)
        metrics = {o.name: dict(o.metrics)
                   for o in client.application(app_id).logical_operators}
    print(f"\ndead letters: 100,000 rows, 6 bad, one SIGKILL: {time.monotonic() - started:.1f} s")

    done = collections.Counter(r["id"] for r in rows_in(tmp_path / "out"))
    assert max(done.values()) == 1, f"a row processed twice; {note}"
    assert set(done) == set(range(ROWS)) - set(BAD_PYTHON) - set(BAD_SPARK), note
    assert all(r["twice"] == 2 * r["id"] for r in rows_in(tmp_path / "out"))

    refused = rows_in(tmp_path / "dead-python")
    assert sorted(r["id"] for r in refused) == sorted(BAD_PYTHON), note
    assert {r["weir_error"] for r in refused} == {f"ValueError: id {i} is refused"
                                                  for i in BAD_PYTHON}
    assert {(r["weir_operator"], r["weir_port"]) for r in refused} == {("validate", "input")}
    failed = rows_in(tmp_path / "dead-spark")
    assert sorted(r["id"] for r in failed) == sorted(BAD_SPARK), note
    assert all(f"bad id {r['id']}" in r["weir_error"] for r in failed), failed
    assert {(r["weir_operator"], r["weir_port"]) for r in failed} == {("double", "input")}

    assert metrics["validate"]["dead_letters"] == 3 and metrics["double"]["dead_letters"] == 3

"""Dynamic repartitioning end to end: a running word count whose Spark counter keeps a total
per word (keyed state) goes from 2 to 4 partitions by hand (``weir repartition``) while a
container holding new partitions is killed; the totals it publishes still equal Python's
counts, so every word's total moved to its new partition, and nothing was counted twice
or lost."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import container_logs
from tests.e2e.wordcount import words_of, write_wordcount_app
from tests.harness import poll_for
from weir.master.client import WeirClient, WeirClientError
from weir.operators.app import load_app

pytestmark = pytest.mark.timeout(420)

LINES = 2_000


def published_totals(out) -> dict[str, int]:
    """Each word's highest published total."""
    totals: dict[str, int] = {}
    for file in sorted(out.glob("*.jsonl")):
        for line in file.read_text().splitlines():
            row = json.loads(line)
            totals[row["word"]] = max(totals.get(row["word"], 0), row["count"])
    return totals


def repartition_when_ready(client: WeirClient, app_id: str, operator: str,
                           partitions: int, timeout_s: float = 60.0) -> None:
    """Asks for a repartition, again while a checkpoint or a deploy is under way."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.repartition(app_id, operator, partitions)
            return
        except WeirClientError as exc:
            assert "not RUNNING" not in str(exc) and time.monotonic() < deadline, exc
            time.sleep(0.5)


def weir(master, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "weir", "--master", master.address, *argv],
                          capture_output=True, text=True, timeout=60)


def test_two_to_four_partitions_mid_run_with_a_container_kill_keeps_every_total(
        master, tmp_path):
    app, lines = write_wordcount_app(
        tmp_path, "repartitioned", LINES,
        'CONTAINERS=3, STREAMING_WINDOW_SIZE_MILLIS=300, HEARTBEAT_INTERVAL_MILLIS=200, '
        'CHECKPOINT_WINDOW_COUNT=4, HEARTBEAT_TIMEOUT_MILLIS=5000, '
        'SPARK_MASTER="local[1]", SPARK_SHUFFLE_PARTITIONS=1, SPARK_WARMUP_ROWS=0',
        count='PARTITIONS=2, PARTITION_KEY="word", APPLICATION_WINDOW_COUNT=4',
        lines_per_window=50, pinned=False)
    app_text = open(app).read().replace("WindowedCount", "RunningCount")
    open(app, "w").write(app_text)
    expected = collections.Counter(words_of(lines))
    out = tmp_path / "out"

    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        poll_for(lambda: len(list(out.glob("*.jsonl"))) >= 2, 180,
                 "the sink to publish its first windows\n" + container_logs(master))
        old_ids = [op.id for op in client.operators(app_id) if op.name.startswith("count#")]
        state_dir = Path(client.application(app_id).attributes["STATE_DIR"])
        # by hand, as a user would; retried while a checkpoint or deploy is under way
        deadline = time.monotonic() + 60
        while (done := weir(master, "repartition", app_id, "count", "4")).returncode:
            assert "not RUNNING" not in done.stderr and time.monotonic() < deadline, \
                done.stderr + container_logs(master)
            time.sleep(0.5)
        assert "2 -> 4 partitions" in done.stdout, done.stdout
        operators = {op.name: op for op in client.operators(app_id)}
        new = [operators[f"count#{i}"] for i in range(4)]
        assert min(op.id for op in new) > max(old_ids)
        # kill a container that must build new partitions, before they run
        victim = new[3].container_id
        assert client.kill_container(victim)
        with pytest.raises(WeirClientError, match="being \\(re\\)deployed|not ACTIVE"):
            client.repartition(app_id, "count", 3)

        info = client.wait(app_id, 300)
        assert info.state == "FINISHED", f"{info.diagnostics}\n{container_logs(master)}"
        operators = {op.name: op for op in client.operators(app_id)}

    assert published_totals(out) == dict(expected)
    assert info.repartitions == 1 and info.recoveries >= 1
    partitions = [operators[f"count#{i}"] for i in range(4)]
    assert all(op.logical_name == "count" and op.state == "SHUTDOWN" for op in partitions)
    assert len({op.container_id for op in partitions}) >= 2
    assert all(op.total_tuples_processed > 0 for op in partitions)
    assert "count#4" not in operators and operators["count#unifier"].id > max(old_ids)
    # the old partitions' checkpoints went once the new ones had their own
    assert len(old_ids) == 3 and not any((state_dir / "checkpoints" / str(i)).exists()
                                         for i in old_ids)
    assert all((state_dir / "checkpoints" / str(op.id)).exists() for op in partitions)


LISTENER_APP = '''
from weir.operators import Dag, InputPort, Operator, OutputPort
from weir.operators.library import FileSink, TextFileSource
from weir.operators.scaling import ThroughputScaler
import pyarrow as pa


class Totals(Operator):
    """A running count per line in plain Python: the totals are keyed state."""

    KEYED_STATE = ("totals",)
    input = InputPort()
    output = OutputPort()

    def __init__(self):
        self.totals = {}

    def begin_window(self, window_id):
        self._seen = set()

    def process(self, port, batch):
        for key in batch.column("line").to_pylist():
            self.totals[key] = self.totals.get(key, 0) + 1
            self._seen.add(key)

    def end_window(self):
        keys = sorted(self._seen)
        if keys:
            self.output.emit(pa.table({"line": keys,
                                       "count": [self.totals[k] for k in keys]}))


dag = Dag("scaled", CONTAINERS=3, STREAMING_WINDOW_SIZE_MILLIS=100,
          HEARTBEAT_INTERVAL_MILLIS=200, THROUGHPUT_CALCULATION_INTERVAL_MILLIS=1000)
source = dag.add_operator("source", TextFileSource(TEXT, lines_per_window=20),
                          PARTITIONS=2)
totals = dag.add_operator("totals", Totals(), PARTITION_KEY="line",
                          stats_listener=ThroughputScaler(high=50, max_partitions=2,
                                                          cooldown_s=1))
files = dag.add_operator("files", FileSink(OUT))
dag.add_stream("keys", source.output, totals.input)
dag.add_stream("totals", totals.output, files.input)
'''


def test_a_stats_listener_scales_a_busy_operator_out_while_it_runs(master, tmp_path):
    """Its input comes from 2 source partitions, so the new partitions are fed by new
    unifiers of the source, each taking its partition's share."""
    keys = [f"key{(n * 7) % 97}" for n in range(6000)]
    (tmp_path / "keys.txt").write_text("\n".join(keys) + "\n")
    app = tmp_path / "scaled_app.py"
    app.write_text(LISTENER_APP.replace("TEXT", repr(str(tmp_path / "keys.txt")))
                   .replace("OUT", repr(str(tmp_path / "out"))))

    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(str(app)).to_descriptor())
        info = client.wait(app_id, 180)
        assert info.state == "FINISHED", f"{info.diagnostics}\n{container_logs(master)}"
        operators = {op.name: op for op in client.operators(app_id)}

    assert info.repartitions == 1, info.last_repartition
    assert "1 -> 2 partitions" in info.last_repartition
    assert "stats listener ThroughputScaler" in info.last_repartition
    assert {"totals#0", "totals#1", "totals#unifier", "source#unifier@totals#0.input",
            "source#unifier@totals#1.input"} <= set(operators)
    totals: dict[str, int] = {}
    for file in (tmp_path / "out").glob("*.jsonl"):
        for line in file.read_text().splitlines():
            row = json.loads(line)
            totals[row["line"]] = max(totals.get(row["line"], 0), row["count"])
    assert totals == dict(collections.Counter(keys))

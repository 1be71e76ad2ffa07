"""Savepoints through real processes: a running word count (RunningCount, totals in its
on-disk store) is stopped with a savepoint while its DirectorySource is mid-way; a changed
version of the app (an extra operator, a renamed sink) resumes from it, and the last total
of every word is the reference over the whole input. Apps that do not match are refused
with the per-operator diff."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.e2e.conftest import container_logs
from tests.e2e.test_exactly_once import write_input
from tests.e2e.test_recovery import wait_finished
from tests.harness import poll_for
from weir.master.client import WeirClient, WeirClientError
from weir.operators.app import load_app
from weir.storage.savepoints import read_manifest

pytestmark = pytest.mark.timeout(420)

HEAD = """
    import pyarrow as pa
    import pyarrow.compute as pc
    from weir.operators import Dag, Operator, InputPort, OutputPort
    from weir.operators.library import (DirectorySource, FileSink, RunningCount, Tokenize,
                                   WindowedCount)

    class Clean(Operator):
        '''Drops one-letter words (the extra operator of the new version).'''
        input = InputPort()
        output = OutputPort()

        def process(self, port, batch):
            self.output.emit(batch.filter(pc.greater(pc.utf8_length(batch["word"]), 1)))

    dag = Dag("counts", CONTAINERS=2, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, CHECKPOINT_WINDOW_COUNT=4, STATE_DIR={state!r},
              SPARK_MASTER="local[1]", SPARK_SHUFFLE_PARTITIONS=1, SPARK_WARMUP_ROWS=1000)
    source = dag.add_operator("source", DirectorySource({inbox!r}, delete_consumed=True,
                                                        bytes_per_window=1500), CONTAINER=0)
    tokenize = dag.add_operator("tokenize", Tokenize(), CONTAINER=0)
"""
V1 = HEAD + """
    count = dag.add_operator("count", RunningCount(key="word"), CONTAINER=1)
    sink = dag.add_operator("sink", FileSink({out!r}, exactly_once=True), CONTAINER=1)
    dag.add_stream("lines", source.output, tokenize.input)
    dag.add_stream("words", tokenize.output, count.input)
    dag.add_stream("totals", count.output, sink.input)
"""
V2 = HEAD + """
    clean = dag.add_operator("clean", Clean(), CONTAINER=0)
    count = dag.add_operator("count", RunningCount(key="word"), CONTAINER=1)
    published = dag.add_operator("published", FileSink({out!r}, exactly_once=True),
                                 CONTAINER=1)
    dag.add_stream("lines", source.output, tokenize.input)
    dag.add_stream("words", tokenize.output, clean.input)
    dag.add_stream("clean", clean.output, count.input)
    dag.add_stream("totals", count.output, published.input)
"""
V3 = V1.replace('RunningCount(key="word")', 'WindowedCount(key="word")')


def write_app(path: Path, text: str, **values: str) -> str:
    path.write_text(textwrap.dedent(text.format(**values)))
    return str(path)


def last_totals(*folders: Path) -> dict[str, int]:
    """Each word's newest published total, over the runs in order."""
    totals: dict[str, int] = {}
    for folder in folders:
        for file in sorted(folder.glob("*.jsonl")):
            for line in file.read_text().splitlines():
                row = json.loads(line)
                totals[row["word"]] = row["count"]
    return totals


def test_a_stopped_word_count_resumes_from_its_savepoint_in_a_new_version(master, tmp_path):
    expected = write_input(tmp_path / "inbox", files=4)
    inbox, savepoint = tmp_path / "inbox", str(tmp_path / "savepoint")
    files_at_start = len(list(inbox.iterdir()))
    values = {"state": str(tmp_path / "state1"), "inbox": str(inbox)}
    slow = V1.replace("bytes_per_window=1500", "bytes_per_window=500")  # about 20 s of input
    v1 = write_app(tmp_path / "v1.py", slow, out=str(tmp_path / "out1"), **values)
    with WeirClient(master.address) as client:
        first = client.submit(load_app(v1).to_descriptor())
        poll_for(lambda: len(list(inbox.iterdir())) < files_at_start, 90,
                 f"a first file read and committed\n{container_logs(master)}")
        client.take_savepoint(first, savepoint, stop=True)
        wait_finished(client, master, first, timeout_s=120)
        # the manifest is written just after the last part, outside the master's lock: the
        # application may say FINISHED a moment before its savepoint says complete
        poll_for(lambda: client.application(first).savepoint_state != "writing", 30,
                 f"the savepoint's manifest\n{container_logs(master)}")
        info = client.application(first)
        assert info.savepoint_state == "complete", info
        assert info.savepoint_path == savepoint
        left = len(list(inbox.iterdir()))
        assert 0 < left < files_at_start, f"the source was not mid-way: {left} files left"
        manifest = read_manifest(savepoint)
        assert [op.name for op in manifest.operators] == ["source", "tokenize", "count",
                                                          "sink"]
        assert manifest.application_id == first and manifest.window > 0

        # an app whose counter changed class, or that drops the sink unasked, is refused
        v3 = write_app(tmp_path / "v3.py", V3, out=str(tmp_path / "out3"),
                       state=str(tmp_path / "state3"), inbox=str(inbox))
        with pytest.raises(WeirClientError) as refused:
            client.submit(load_app(v3).to_descriptor(), from_savepoint=savepoint)
        assert "class changed count: weir.operators.library.running_count.RunningCount -> " \
               "weir.operators.library.transforms.WindowedCount" in str(refused.value)
        v2 = write_app(tmp_path / "v2.py", V2, out=str(tmp_path / "out2"),
                       state=str(tmp_path / "state2"), inbox=str(inbox))
        with pytest.raises(WeirClientError) as refused:
            client.submit(load_app(v2).to_descriptor(), from_savepoint=savepoint)
        for line in ("kept count", "new clean (starts fresh)",
                     "new published (starts fresh)", "dropped sink (its state is not used)",
                     "--allow-dropped"):
            assert line in str(refused.value)

        second = client.submit(load_app(v2).to_descriptor(), from_savepoint=savepoint,
                               allow_dropped=True)
        info = wait_finished(client, master, second, timeout_s=180)
        assert info.from_savepoint == savepoint

    assert list(inbox.iterdir()) == []
    one_letter = {w for w in expected if len(w) == 1}
    assert not one_letter  # the words are long: Clean keeps every one, so totals add up
    assert last_totals(tmp_path / "out1", tmp_path / "out2") == dict(expected)


def test_a_savepoint_taken_while_the_word_count_runs_on_resumes_in_a_new_version(
        master, tmp_path):
    """Without a stop: the savepoint holds every operator's checkpoint of one window while
    the application goes on to the end of its input; the new version resumes at that
    window (its output starts after it) and its last totals are the whole input's."""
    expected = write_input(tmp_path / "inbox")
    inbox, savepoint = tmp_path / "inbox", str(tmp_path / "savepoint")
    keep = {"inbox": str(inbox)}
    v1 = write_app(tmp_path / "v1.py", V1.replace("delete_consumed=True", "delete_consumed=False"),
                   out=str(tmp_path / "out1"), state=str(tmp_path / "state1"), **keep)
    v2 = write_app(tmp_path / "v2.py", V2.replace("delete_consumed=True", "delete_consumed=False"),
                   out=str(tmp_path / "out2"), state=str(tmp_path / "state2"), **keep)
    with WeirClient(master.address) as client:
        first = client.submit(load_app(v1).to_descriptor())
        poll_for(lambda: client.application(first).committed_window_id >= 0, 90,
                 f"a first committed window\n{container_logs(master)}")
        client.take_savepoint(first, savepoint)
        poll_for(lambda: client.application(first).savepoint_state != "writing", 60,
                 f"the savepoint\n{container_logs(master)}")
        info = client.application(first)
        assert info.savepoint_state == "complete", info
        window = read_manifest(savepoint).window
        assert info.state == "RUNNING" or info.committed_window_id > window
        wait_finished(client, master, first, timeout_s=120)
        second = client.submit(load_app(v2).to_descriptor(), from_savepoint=savepoint,
                               allow_dropped=True)
        wait_finished(client, master, second, timeout_s=180)

    assert last_totals(tmp_path / "out1") == dict(expected)
    assert last_totals(tmp_path / "out2") == dict(expected)
    resumed = [json.loads(line)["window_id"] for file in (tmp_path / "out2").glob("*.jsonl")
               for line in file.read_text().splitlines()]
    assert resumed and min(resumed) > window  # nothing at or before the savepoint again

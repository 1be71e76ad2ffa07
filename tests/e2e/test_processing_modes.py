"""Every processing mode keeps its promise when the reader's container dies and then, while
it recovers, the container of its upstream: AT_LEAST_ONCE and EXACTLY_ONCE publish every
count exactly once (exactly-once sink), AT_MOST_ONCE never counts a word twice.

The case is issue 16's: the counter's container was killed, and 5 s later the source's;
in EXACTLY_ONCE the source restarted from its newest checkpoint, past the windows the
counter (restarting from an older one) still needed, and 15 % of the words were lost
while the application reported FINISHED.
"""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import container_logs
from tests.e2e.test_exactly_once import assert_exactly_once, write_input
from tests.e2e.test_recovery import pid_of, wait_finished
from tests.e2e.wordcount import published_counts
from tests.harness import poll_for
from weir.master.client import WeirClient
from weir.operators.app import load_app

FILES = 16  # about 20 s of input at 2,000 bytes a window: both kills land while it is read

APP = """
    from weir.operators import Dag
    from weir.operators.library import DirectorySource, FileSink, Tokenize, WindowedCount

    dag = Dag("modes", CONTAINERS=3, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, HEARTBEAT_TIMEOUT_MILLIS=3000,
              CHECKPOINT_WINDOW_COUNT=1, PROCESSING_MODE={mode!r}, STATE_DIR={state!r},
              SPARK_MASTER="local[1]", SPARK_SHUFFLE_PARTITIONS=1, SPARK_WARMUP_ROWS=0,
              MAX_RESTARTS=8)
    source = dag.add_operator("source", DirectorySource({inbox!r}, move_consumed_to={done!r},
                                                        bytes_per_window=2000), CONTAINER=0)
    tokenize = dag.add_operator("tokenize", Tokenize(), CONTAINER=0)
    count = dag.add_operator("count", WindowedCount(key="word"), CONTAINER=1,
                             APPLICATION_WINDOW_COUNT=2, CHECKPOINT_WINDOW_COUNT=2)
    sink = dag.add_operator("sink", FileSink({out!r}, exactly_once=True), CONTAINER=2)
    dag.add_stream("lines", source.output, tokenize.input)
    dag.add_stream("words", tokenize.output, count.input)
    dag.add_stream("counts", count.output, sink.input)
"""


@pytest.mark.parametrize("mode", ["AT_LEAST_ONCE", "EXACTLY_ONCE", "AT_MOST_ONCE"])
def test_the_counter_then_its_source_killed_5s_apart_keeps_the_modes_promise(
        master, tmp_path: Path, mode: str):
    expected = write_input(tmp_path / "inbox", files=FILES)
    app = tmp_path / "modes_app.py"
    app.write_text(textwrap.dedent(APP.format(
        mode=mode, state=str(tmp_path / "state"), inbox=str(tmp_path / "inbox"),
        done=str(tmp_path / "consumed"), out=str(tmp_path / "out"))))
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        poll_for(lambda: client.application(app_id).committed_window_id >= 0, 90,
                 f"a first committed window\n{container_logs(master)}")
        _, counter = pid_of(client, app_id, "count")
        os.kill(counter, signal.SIGKILL)
        time.sleep(5)
        source = next(o for o in client.operators(app_id) if o.name == "source")
        assert source.state == "ACTIVE", f"the source ended before the second kill: {source}"
        _, source_pid = pid_of(client, app_id, "source")
        os.kill(source_pid, signal.SIGKILL)
        wait_finished(client, master, app_id, timeout_s=240)
        operators = {o.name: o for o in client.operators(app_id)}
        assert operators["count"].failure_count >= 1 and operators["source"].failure_count >= 1
    if mode == "AT_MOST_ONCE":
        counted, _ = published_counts(tmp_path / "out")
        twice = {w: n for w, n in counted.items() if n > expected[w]}
        assert not twice, f"counted more often than they occur: {dict(list(twice.items())[:5])}"
    else:
        assert_exactly_once(tmp_path, expected, f"{mode}, count's then source's container "
                                                "killed 5 s apart")
    assert len(os.listdir(tmp_path / "consumed")) == FILES  # every input file was read

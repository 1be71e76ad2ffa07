"""The progress watchdog through real processes: an operator that takes long to activate
holds the committed window back while the source emits; the application shows STALLED
with that operator named, then progressing again once it runs, and ends exactly."""

from __future__ import annotations

import textwrap

import pytest

from tests.e2e.conftest import container_logs
from tests.harness import poll_for
from weir.master.client import WeirClient
from weir.operators.app import load_app

pytestmark = pytest.mark.timeout(240)

APP = """
    import time
    from weir.operators import Dag, Operator, InputPort, OutputPort
    from weir.operators.library import EventGenerator, FileSink

    class SlowToActivate(Operator):
        '''Passes its rows on; its activation takes {activate_s} s (a JVM, say).'''
        input = InputPort()
        output = OutputPort()

        def activate(self, context):
            time.sleep({activate_s})

        def process(self, port, batch):
            self.output.emit(batch)

    dag = Dag("stall", CONTAINERS=1, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, CHECKPOINT_WINDOW_COUNT=2,
              STALL_TIMEOUT_MILLIS=2000, STATE_DIR={state!r})
    source = dag.add_operator("source", EventGenerator(rate_per_second=2000, keys=5,
                                                       total=40_000))
    slow = dag.add_operator("slow", SlowToActivate())
    sink = dag.add_operator("sink", FileSink({out!r}))
    dag.add_stream("events", source.output, slow.input)
    dag.add_stream("passed", slow.output, sink.input)
"""


def test_an_application_held_back_by_one_operator_says_so_then_goes_on(master, tmp_path):
    app_file = tmp_path / "stall.py"
    app_file.write_text(textwrap.dedent(APP.format(
        activate_s=8, state=str(tmp_path / "state"), out=str(tmp_path / "out"))))
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app_file).to_descriptor())
        stalled = poll_for(lambda: (i := client.application(app_id)).stalled_since_ms and i,
                           60, f"the application to show a stall\n{container_logs(master)}")
        assert stalled.state == "RUNNING"
        said = [f.message for f in stalled.recent_failures if f.message.startswith("stalled:")]
        assert said and "furthest behind: operator 'slow'" in said[0], said
        poll_for(lambda: client.application(app_id).stalled_since_ms == 0, 60,
                 f"the stall to end once 'slow' runs\n{container_logs(master)}")
        messages = [f.message for f in client.application(app_id).recent_failures]
        assert any(m.startswith("progressing again") for m in messages), messages
        info = client.wait(app_id, 120)
        assert info.state == "FINISHED", info.diagnostics
        assert info.stalled_since_ms == 0
    written = sum(len(f.read_text().splitlines()) for f in (tmp_path / "out").glob("*.jsonl"))
    assert written == 40_000  # every event once: the stall lost nothing

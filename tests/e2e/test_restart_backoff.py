"""Restarts in a row wait longer each time (RESTART_BACKOFF_MILLIS), and `weir app` says so.

Issue 36: with the state disk full the application spent all its restarts back to back, so
a few seconds of a lasting fault ended it for good. Real master, real containers: an
operator that fails in every window is restarted at once the first time, then after 1.5 s,
then 3 s, then the application fails.
"""

from __future__ import annotations

import textwrap
import time

import pytest

from tests.e2e.conftest import container_logs
from tests.harness import poll_for
from weir.master import cli
from weir.master.client import WeirClient
from weir.operators.app import load_app

pytestmark = pytest.mark.timeout(240)

BACKOFF_MS = 1_500

APP = f"""
    from weir.operators import Dag, Operator, InputPort
    from weir.operators.library import EventGenerator

    class DiskFull(Operator):
        '''Fails in its first window, every time, like a write to a full disk.'''
        input = InputPort()

        def process(self, port, batch):
            raise OSError(28, "No space left on device")

    dag = Dag("backoff", CONTAINERS=2, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, MAX_RESTARTS=3,
              RESTART_BACKOFF_MILLIS={BACKOFF_MS}, RESTART_BACKOFF_MAX_MILLIS=10000)
    source = dag.add_operator("source", EventGenerator(rate_per_second=1_000, keys=10),
                              CONTAINER=0)
    full = dag.add_operator("full", DiskFull(), CONTAINER=1)
    dag.add_stream("events", source.output, full.input)
"""


def test_restarts_in_a_row_back_off_and_weir_app_shows_the_wait(master, tmp_path, capsys):
    app_file = tmp_path / "backoff_app.py"
    app_file.write_text(textwrap.dedent(APP))
    client = WeirClient(master.address)
    app_id = client.submit(load_app(app_file).to_descriptor())

    waiting = poll_for(lambda: (i := client.application(app_id)).restart_at_ms
                       > time.time() * 1000 + 300 and i, 120,
                       f"a delayed restart\n{container_logs(master)}", 0.05)
    assert waiting.restart_delay_ms == BACKOFF_MS  # the second restart in a row
    assert cli.main(["--master", master.address, "app", app_id]) == 0
    shown = capsys.readouterr().out
    assert "restart:" in shown and f"backoff {BACKOFF_MS / 1000:.1f} s" in shown, shown

    info = client.wait(app_id, 120)
    assert info.state == "FAILED", info.diagnostics
    assert "failed 4 times in a row" in info.diagnostics
    assert "No space left on device" in info.diagnostics
    failed = sorted(f.time_ms for f in client.application(app_id).recent_failures
                    if f.kind == "container" and "'full'" in f.message)
    assert len(failed) == 4, failed
    gaps = [later - earlier for earlier, later in zip(failed, failed[1:], strict=False)]
    # each restart deploys only after its delay, and fails after that: never sooner
    assert gaps[1] >= BACKOFF_MS and gaps[2] >= 2 * BACKOFF_MS, gaps

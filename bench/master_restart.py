"""The master's journal and restart: what journaling costs per heartbeat, and how long a
master killed with SIGKILL takes to be back and to have its application moving again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from bench.played_containers import PlayedContainer, chain_dag
from weir.master.client import WeirClient
from weir.master.core import MasterCore
from weir.master.launcher import RecordingLauncher
from weir.master.persistence import ApplicationJournal

_ROOT = Path(__file__).resolve().parent.parent


def journal_cost(containers: int = 100, operators_per_container: int = 10,
                 rounds: int = 20, interval_ms: int = 1000) -> dict[str, Any]:
    """Heartbeats straight into a ``MasterCore`` (no gRPC), without and with the journal.

    The difference per heartbeat is the journal's cost: the check whether anything that
    recovery needs changed (every heartbeat) and the writes and fsyncs when it did
    (checkpoints, committed window, states).
    """
    seconds: dict[str, float] = {}
    figures: dict[str, Any] = {}
    for label in ("without", "with"):
        with tempfile.TemporaryDirectory(prefix="weir-journal-bench-") as folder:
            journal = ApplicationJournal(folder) if label == "with" else None
            core = MasterCore(RecordingLauncher(), journal=journal)
            app_id = core.submit(chain_dag("bench-journal", containers, operators_per_container,
                                      interval_ms, 60_000), {})
            played = [PlayedContainer(c.id, i, max(1, interval_ms // 500), 4096)
                      for i, c in enumerate(core.list_containers(app_id))]
            for container in played:
                container.init(core.init_context(container.id))
            heartbeats, elapsed = 0, 0.0
            for _ in range(rounds):
                now_ms = time.time_ns() // 1_000_000
                for container in played:
                    message = container.heartbeat(now_ms)
                    started = time.perf_counter()
                    response = core.heartbeat(message)
                    elapsed += time.perf_counter() - started
                    heartbeats += 1
                    container.deploy(response.deploy_request, now_ms, time.monotonic())
            seconds[label] = elapsed / heartbeats
            if journal is not None:
                figures = {"journal_records": journal.writes,
                           "journal_records_per_heartbeat": round(journal.writes / heartbeats, 4),
                           "journal_write_ms_per_record": round(
                               1000 * journal.write_seconds / max(1, journal.writes), 3)}
                journal.close()
    return {"containers": containers, "operators": containers * operators_per_container,
            "heartbeats_per_run": containers * rounds,
            "heartbeat_ms_without_journal": round(seconds["without"] * 1000, 4),
            "heartbeat_ms_with_journal": round(seconds["with"] * 1000, 4),
            "journal_ms_per_heartbeat": round((seconds["with"] - seconds["without"]) * 1000, 4),
            **figures}


_APP = """
    import pyarrow as pa
    from weir.operators import Dag, Operator, InputPort, OutputPort
    from weir.operators.library import EventGenerator

    class Totals(Operator):
        input = InputPort()
        output = OutputPort()

        def __init__(self):
            self.events = 0

        def process(self, port, batch):
            self.events += batch.num_rows

    dag = Dag("bench-master-restart", CONTAINERS=2, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, HEARTBEAT_TIMEOUT_MILLIS=10000,
              CHECKPOINT_WINDOW_COUNT=5, STATE_DIR={state!r})
    source = dag.add_operator("source", EventGenerator(rate_per_second=50_000, keys=100),
                              CONTAINER=0)
    totals = dag.add_operator("totals", Totals(), CONTAINER=1)
    dag.add_stream("events", source.output, totals.input)
"""


def _start_master(work: Path) -> tuple[subprocess.Popen[bytes], str, float]:
    """``weir master --state-dir``; returns it, its address and the seconds it took."""
    started = time.monotonic()
    popen = subprocess.Popen(
        [sys.executable, "-m", "weir", "master", "--port", "0", "--json", "--state-dir",
         str(work / "master-state"), "--http-port", "0", "--log-dir", str(work / "logs")],
        cwd=work, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**os.environ, "WEIR_HOME": str(work / "home")})
    assert popen.stdout is not None
    text = ""
    while not text.rstrip().endswith("}"):
        line = popen.stdout.readline().decode()
        if not line:
            raise RuntimeError("the master exited before printing its address")
        text += line
    return popen, json.loads(text)["address"], time.monotonic() - started


def restart() -> dict[str, Any]:
    """SIGKILLs a master in the middle of an application; measures its way back."""
    from weir.operators.app import load_app

    with tempfile.TemporaryDirectory(prefix="weir-restart-bench-") as folder:
        work = Path(folder)
        app = work / "app.py"
        app.write_text(textwrap.dedent(_APP.format(state=str(work / "state"))))
        first, address, _ = _start_master(work)
        second = None
        secret = (work / "master-state" / "secret").read_text().strip()
        cert = work / "master-state" / "tls" / "cert.pem"  # kept across the restart
        try:
            with WeirClient(address, secret=secret, tls_ca=cert) as client:
                app_id = client.submit(load_app(app).to_descriptor())
                _wait(lambda: client.application(app_id).committed_window_id >= 0, 120)
                time.sleep(2.0)
                committed = client.application(app_id).committed_window_id
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            killed = time.monotonic()
            second, address, start_s = _start_master(work)
            with WeirClient(address, secret=secret, tls_ca=cert) as client:
                answering_s = time.monotonic() - killed
                _wait(lambda: client.application(app_id).committed_window_id > committed, 120)
                moving_s = time.monotonic() - killed
                operators = client.operators(app_id)
                redeployed = sum(op.failure_count for op in operators)
                client.kill(app_id, "benchmark over")
        finally:
            for master in (second, first):
                if master is not None and master.poll() is None:
                    master.send_signal(signal.SIGTERM)
                    master.wait(30)
    return {"master_back_seconds": round(answering_s, 2),
            "master_process_start_seconds": round(start_s, 2),
            "committed_window_moving_again_seconds": round(moving_s, 2),
            "operators_redeployed": redeployed}


def _wait(condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not reached within {timeout_s} s")
        time.sleep(0.1)


def run() -> dict[str, Any]:
    return {"journal": journal_cost(), "restart": restart()}


if __name__ == "__main__":
    print(json.dumps(run()))

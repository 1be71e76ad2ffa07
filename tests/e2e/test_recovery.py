"""Recovery end to end: a container killed mid-run, the application carries on and loses nothing."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time

import pytest

from tests.e2e.conftest import container_logs
from tests.harness import poll_for
from weir.master.client import WeirClient
from weir.operators.app import load_app
from weir.operators.library import EventGenerator

EVENTS, KEYS, RATE = 120_000, 50, 15_000

APP = """
    import pyarrow as pa
    from weir.operators import Dag, Operator, InputPort, OutputPort
    from weir.operators.library import EventGenerator, FileSink

    class RunningTotals(Operator):
        '''Per key: events and value sum so far (state), emitted every window.'''
        input = InputPort()
        output = OutputPort()

        def __init__(self):
            self.totals = {{}}

        def process(self, port, batch):
            grouped = pa.table(batch).group_by("key").aggregate(
                [("value", "sum"), ("key", "count")])
            for key, total, count in zip(grouped["key"].to_pylist(),
                                         grouped["value_sum"].to_pylist(),
                                         grouped["key_count"].to_pylist()):
                c, s = self.totals.get(key, (0, 0))
                self.totals[key] = (c + count, s + total)

        def end_window(self):
            keys = sorted(self.totals)
            self.output.emit(pa.record_batch({{
                "key": keys, "count": [self.totals[k][0] for k in keys],
                "sum": [self.totals[k][1] for k in keys]}}))

    dag = Dag("totals", CONTAINERS=3, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, HEARTBEAT_TIMEOUT_MILLIS=3000,
              CHECKPOINT_WINDOW_COUNT=5, STATE_DIR={state!r}, PROCESSING_MODE={mode!r})
    source = dag.add_operator("source", EventGenerator(rate_per_second={rate}, keys={keys},
                                                       total={events}), CONTAINER=0)
    totals = dag.add_operator("totals", RunningTotals(), CONTAINER=1)
    sink = dag.add_operator("sink", FileSink({out!r}), CONTAINER=2)
    dag.add_stream("events", source.output, totals.input)
    dag.add_stream("totals", totals.output, sink.input)
"""


def expected() -> dict[str, list[int]]:
    counts = EventGenerator(keys=KEYS, total=EVENTS).expected_counts()
    return {k: [c, s] for k, (c, s) in counts.items()}


def final_totals(out_dir) -> dict[str, list[int]]:
    files = sorted(out_dir.glob("*.jsonl"))
    assert files, "the sink wrote nothing"
    rows = [json.loads(line) for line in files[-1].read_text().splitlines()]
    return {r["key"]: [r["count"], r["sum"]] for r in rows}


def start(master, tmp_path, mode: str = "AT_LEAST_ONCE") -> tuple[WeirClient, str]:
    app = tmp_path / "totals_app.py"
    app.write_text(textwrap.dedent(APP.format(state=str(tmp_path / "state"), rate=RATE,
                                              keys=KEYS, events=EVENTS, mode=mode,
                                              out=str(tmp_path / "out"))))
    client = WeirClient(master.address)
    return client, client.submit(load_app(app).to_descriptor())


def wait_finished(client: WeirClient, master, app_id: str, timeout_s: float = 120):
    try:
        info = client.wait(app_id, timeout_s)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{where_it_stands(client, app_id)}\n"
                             f"{container_logs(master)}") from None
    assert info.state == "FINISHED", f"{info.diagnostics}\n{container_logs(master)}"
    return info


def where_it_stands(client: WeirClient, app_id: str) -> str:
    """The application's committed window and every operator's state and windows."""
    app = client.application(app_id)
    lines = [f"{app_id} {app.state}, committed window {app.committed_window_id}"]
    lines += [f"  {o.name} ({o.id}) {o.state} in {o.container_id}: window "
              f"{o.current_window_id}, recovery {o.recovery_window_id}, deployed from "
              f"{o.deploy_window_id}, checkpoint {o.checkpoint_window_id}, failures "
              f"{o.failure_count}" for o in client.operators(app_id)]
    return "\n".join(lines)


def pid_of(client: WeirClient, app_id: str, operator: str) -> tuple[str, int]:
    op = next(o for o in client.operators(app_id) if o.name == operator)
    container = next(c for c in client.containers(app_id) if c.id == op.container_id)
    return container.id, int(container.process_name.split("@")[0])


@pytest.mark.parametrize("victim", ["source", "totals", "sink"])
def test_sigkill_of_a_container_loses_nothing(master, tmp_path, victim):
    client, app_id = start(master, tmp_path)
    with client:
        poll_for(lambda: client.application(app_id).committed_window_id >= 0, 60,
                 f"a first committed window\n{container_logs(master)}")
        container_id, pid = pid_of(client, app_id, victim)
        os.kill(pid, signal.SIGKILL)
        wait_finished(client, master, app_id)
        assert final_totals(tmp_path / "out") == expected()
        operators = {o.name: o for o in client.operators(app_id)}
        assert operators[victim].failure_count >= 1
        containers = {c.id: c for c in client.containers(app_id)}
        assert containers[container_id].state == "KILLED"
        assert len(containers) == 4, "one new container replaces the lost one"


def test_sigstop_is_detected_within_the_heartbeat_timeout(master, tmp_path):
    client, app_id = start(master, tmp_path)
    with client:
        poll_for(lambda: client.application(app_id).committed_window_id >= 0, 60,
                 f"a first committed window\n{container_logs(master)}")
        container_id, pid = pid_of(client, app_id, "totals")
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            poll_for(lambda: next(c for c in client.containers(app_id)
                                  if c.id == container_id).state == "KILLED", 10,
                     "the silent container to be declared lost", 0.05)
            detected_s = time.monotonic() - stopped
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        assert detected_s < 3.0 + 1.5, f"lost after {detected_s:.1f} s, timeout 3 s"
        wait_finished(client, master, app_id)
        assert final_totals(tmp_path / "out") == expected()


def test_at_most_once_skips_what_was_missed_and_never_counts_twice(master, tmp_path):
    client, app_id = start(master, tmp_path, mode="AT_MOST_ONCE")
    with client:
        poll_for(lambda: client.application(app_id).committed_window_id >= 0, 60,
                 f"a first committed window\n{container_logs(master)}")
        _, pid = pid_of(client, app_id, "totals")
        os.kill(pid, signal.SIGKILL)
        wait_finished(client, master, app_id)
    got, want = final_totals(tmp_path / "out"), expected()
    assert set(got) <= set(want)
    assert all(got[k][0] <= want[k][0] for k in got), "an event was counted twice"
    assert sum(c for c, _ in got.values()) < sum(c for c, _ in want.values()), \
        "the windows missed while the operator was down are not replayed"

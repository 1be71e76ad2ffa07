"""A push source end to end: lines sent over TCP to a real container that is killed mid-run;
every acknowledged line reaches the sink exactly once."""

from __future__ import annotations

import json
import os
import signal
import socket
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.conftest import container_logs
from tests.harness import poll_for
from weir.master.client import WeirClient
from weir.operators.app import load_app

END = "END-OF-TEST"
CHUNK = 10  # lines per send

APP = """
    from weir.operators import Dag, InputPort, Operator, OutputPort
    from weir.operators.library import FileSink, TcpLineSource

    class Relay(Operator):
        '''Passes lines on: a pure-Python operator between the source and the sink.'''
        input = InputPort()
        output = OutputPort()

        def process(self, port, batch):
            self.output.emit(batch)

    dag = Dag("push", CONTAINERS=2, STREAMING_WINDOW_SIZE_MILLIS=200,
              HEARTBEAT_INTERVAL_MILLIS=200, HEARTBEAT_TIMEOUT_MILLIS=3000,
              CHECKPOINT_WINDOW_COUNT=5, STATE_DIR={state!r})
    source = dag.add_operator("source", TcpLineSource(port={port}, end_line={end!r},
                                                      segment_bytes=4096), CONTAINER=0,
                              CRASH_AT={crash_at!r})
    relay = dag.add_operator("relay", Relay(), CONTAINER=1)
    sink = dag.add_operator("sink", FileSink({out!r}), CONTAINER=1)
    dag.add_stream("lines", source.output, relay.input)
    dag.add_stream("relayed", relay.output, sink.input)
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Sender(threading.Thread):
    """Sends numbered lines in chunks and keeps which ones were acknowledged.

    A dropped connection is reopened (bounded retries); its unacknowledged lines are not
    sent again: they may reach the sink at most once.
    """

    def __init__(self, port: int, connect_timeout_s: float = 60.0) -> None:
        super().__init__(name="test-sender", daemon=True)
        self.port = port
        self.connect_timeout_s = connect_timeout_s
        self.acked: list[str] = []
        self.unacked: list[str] = []
        self.connections = 0
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self._next = 0

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                self._session()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def connect(self) -> socket.socket:
        deadline = time.monotonic() + self.connect_timeout_s
        while True:
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                self.connections += 1
                return sock
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _session(self) -> None:
        """One connection: send chunks, wait for each chunk's ACK, until stopped or dropped."""
        sock = self.connect()
        sent: list[str] = []  # lines of this connection, in order
        acked = 0
        replies = b""
        try:
            while not self.stopping.is_set():
                chunk = [f"line-{n:07d}" for n in range(self._next, self._next + CHUNK)]
                self._next += CHUNK
                sent += chunk
                sock.sendall("".join(f"{line}\n" for line in chunk).encode())
                while acked < len(sent):
                    while b"\n" not in replies:
                        data = sock.recv(4096)
                        if not data:
                            raise ConnectionError("closed by the source")
                        replies += data
                    reply, replies = replies.split(b"\n", 1)
                    word, count = reply.decode().split()
                    assert word == "ACK", reply
                    self.acked += sent[acked:int(count)]
                    acked = int(count)
                time.sleep(0.01)
        except OSError:
            pass  # the container died: what was not acknowledged is not sent again
        finally:
            self.unacked += sent[acked:]
            sock.close()

    def send_end(self, timeout_s: float = 60.0) -> None:
        """Sends the end line until it is acknowledged."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with self.connect() as sock:
                    sock.sendall(f"{END}\n".encode())
                    if sock.makefile("rb").readline().decode().startswith("ACK 1"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the end line was not acknowledged within {timeout_s} s")
            time.sleep(0.2)


def sink_lines(out: Path) -> Counter[str]:
    return Counter(json.loads(row)["line"] for path in sorted(out.glob("*.jsonl"))
                   for row in path.read_text().splitlines())


@pytest.mark.parametrize("crash", ["sigkill", "crash_at_wal_appended"])
def test_every_acknowledged_line_is_processed_exactly_once_across_a_crash(master, tmp_path,
                                                                          crash):
    """``sigkill``: the test kills the source's container once 300 lines are acknowledged
    and a window is committed; ``crash_at_wal_appended``: the container kills itself with
    the 40th WAL append not yet synced (``CRASH_AT=wal.appended@40``), sending starts after
    a committed window."""
    port, out, state = free_port(), tmp_path / "out", tmp_path / "state"
    app = tmp_path / "push_app.py"
    crash_at = "wal.appended@40" if crash == "crash_at_wal_appended" else ""
    app.write_text(textwrap.dedent(APP.format(state=str(state), port=port, end=END,
                                              out=str(out), crash_at=crash_at)))
    sender = Sender(port)
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        if crash != "sigkill":
            # crash only once the source has a checkpoint: a ReplayableSource restarted
            # without one cannot replay its window log yet (the runner numbers its first
            # window from the clock, not from the log)
            poll_for(lambda: client.application(app_id).committed_window_id >= 0, 60,
                     f"a committed window\n{container_logs(master)}")
        sender.start()
        try:
            if crash == "sigkill":
                poll_for(lambda: client.application(app_id).committed_window_id >= 0
                         and len(sender.acked) >= 300, 60,
                         f"a committed window and 300 acknowledged lines\n"
                         f"{container_logs(master)}")
                source = next(o for o in client.operators(app_id) if o.name == "source")
                container = next(c for c in client.containers(app_id)
                                 if c.id == source.container_id)
                os.kill(int(container.process_name.split("@")[0]), signal.SIGKILL)
            else:
                poll_for(lambda: sender.connections >= 2 or sender.error, 60,
                         f"the crash at the 40th WAL append\n{container_logs(master)}")
            acked_at_kill = len(sender.acked)
            poll_for(lambda: sender.connections >= 2 and len(sender.acked) >= acked_at_kill + 300
                     or sender.error, 90,
                     f"the sender to reconnect and send on\n{container_logs(master)}")
        finally:
            sender.stopping.set()
            sender.join(30)
        assert sender.error is None, f"sender: {sender.error!r}"
        sender.send_end()
        info = client.wait(app_id, 120)
        assert info.state == "FINISHED", f"{info.diagnostics}\n{container_logs(master)}"
        operators = {o.name: o for o in client.operators(app_id)}
        assert operators["source"].failure_count >= 1
        source_id = operators["source"].id

    got = sink_lines(out)
    twice = {line: n for line, n in got.items() if n > 1}
    assert not twice, f"lines reached the sink more than once: {sorted(twice)[:10]}"
    missing = set(sender.acked) - set(got)
    assert not missing, f"{len(missing)} acknowledged lines are missing: {sorted(missing)[:10]}"
    assert set(got) <= set(sender.acked) | set(sender.unacked), "a line nobody sent"
    assert END not in got
    if crash != "sigkill":  # the chunk being appended was neither synced nor acknowledged
        assert sender.unacked and not set(sender.unacked) & set(got)
    segments = sorted(state.glob(f"runs/*/operators/{source_id}/wal/*.log"))
    assert int(segments[0].name[:20]) > 0, "committed WAL segments were deleted"
    print(f"{len(sender.acked)} lines acknowledged ({acked_at_kill} before the kill), "
          f"{len(sender.unacked)} sent but not acknowledged, "
          f"{sum(1 for line in sender.unacked if line in got)} of those processed; "
          f"{sender.connections} connections; WAL segments left: {len(segments)}", flush=True)

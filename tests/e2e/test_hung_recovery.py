"""Recoveries that used to hang (issue 52), through real processes: a second failure while
an operator is stuck in its setup, and a state disk that fills up and is freed again.
Both times the application gets going again by itself and its totals are exact."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import container_logs
from tests.e2e.test_recovery import (
    APP as TOTALS_APP,
)
from tests.e2e.test_recovery import (
    EVENTS,
    KEYS,
    expected,
    final_totals,
    pid_of,
    wait_finished,
    where_it_stands,
)
from tests.harness import poll_for
from weir.master.client import WeirClient
from weir.operators.app import load_app

pytestmark = pytest.mark.timeout(300)

STUCK_ONCE = """
    import os, time

    class StuckOnce(RunningTotals):
        '''RunningTotals whose setup() hangs once, in the deployment that takes the marker
        file (as a setup stuck restoring state or starting a JVM would).'''

        def __init__(self, marker, entered):
            super().__init__()
            self.marker, self.entered = marker, entered

        def setup(self, context):
            try:
                os.rename(self.marker, self.entered)
            except FileNotFoundError:
                return  # no marker, or another deployment took it
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                time.sleep(0.1)
"""


def totals_app(tmp_path: Path, state_dir: Path, totals: str = "RunningTotals()",
               extra_classes: str = "", **attributes: object) -> Path:
    """The recovery suite's running totals (source -> totals -> sink, one container each),
    with ``totals`` as the middle operator and these DAG attributes added."""
    text = textwrap.dedent(TOTALS_APP.format(
        state=str(state_dir), rate=15_000, keys=KEYS, events=EVENTS, mode="AT_LEAST_ONCE",
        out=str(tmp_path / "out")))
    text = text.replace("RunningTotals(), CONTAINER=1", f"{totals}, CONTAINER=1")
    text = text.replace('dag = Dag("totals", ', "dag = Dag(\"totals\", " + "".join(
        f"{name}={value!r}, " for name, value in attributes.items()))
    text = text.replace("\ndag = ", textwrap.dedent(extra_classes) + "\ndag = ", 1)
    path = tmp_path / "totals_app.py"
    path.write_text(text)
    return path


def placed(client: WeirClient, app_id: str, operator: str) -> tuple[str, int] | None:
    """(container id, pid) of the operator's container once its process has called in."""
    op = next(o for o in client.operators(app_id) if o.name == operator)
    container = next(c for c in client.containers(app_id) if c.id == op.container_id)
    pid = container.process_name.split("@")[0]
    return (container.id, int(pid)) if pid and container.state == "ACTIVE" else None


def failures(client: WeirClient, app_id: str) -> list[str]:
    return [f.message for f in client.application(app_id).recent_failures]


def test_a_second_failure_while_an_operator_is_stuck_in_setup_is_recovered(master, tmp_path):
    """The source's container is killed; the totals are redeployed and their setup hangs;
    the source's replacement is killed too, so the totals are redeployed into the same
    container while the stuck deployment holds it. Within SETUP_TIMEOUT_MILLIS (stretched
    by the load) the master restarts that container, and the run ends exact."""
    marker, entered = tmp_path / "stuck-marker", tmp_path / "stuck-entered"
    app = totals_app(tmp_path, tmp_path / "state",
                     totals=f"StuckOnce({str(marker)!r}, {str(entered)!r})",
                     extra_classes=STUCK_ONCE, SETUP_TIMEOUT_MILLIS=4000, MAX_RESTARTS=8)
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        poll_for(lambda: client.application(app_id).committed_window_id >= 0, 90,
                 f"a first committed window\n{container_logs(master)}")
        totals_container, _ = pid_of(client, app_id, "totals")
        marker.touch()  # the totals' next setup hangs
        source_container, pid = pid_of(client, app_id, "source")
        os.kill(pid, signal.SIGKILL)
        poll_for(entered.exists, 90, f"the totals' setup to hang\n{container_logs(master)}")
        replacement = poll_for(lambda: (c := placed(client, app_id, "source"))
                               and c[0] != source_container and c, 90,
                               f"the source's replacement\n{where_it_stands(client, app_id)}")
        os.kill(replacement[1], signal.SIGKILL)  # the second failure, during the hang
        poll_for(lambda: (c := placed(client, app_id, "totals")) and c[0] != totals_container,
                 120,
                 f"the stuck container to be replaced\n{where_it_stands(client, app_id)}\n"
                 f"{container_logs(master)}")
        said = "\n".join(failures(client, app_id))
        assert ("in setup() for" in said or "has not stopped within" in said), said
        wait_finished(client, master, app_id, 180)
        containers = {c.id: c for c in client.containers(app_id)}
        assert containers[totals_container].state == "KILLED"
    assert final_totals(tmp_path / "out") == expected()


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A 16 MB tmpfs of our own (root only): a state disk that can be filled and freed.
    ``WEIR_REQUIRE_MOUNT=1`` (CI) makes a machine that cannot mount one a failure."""
    path = tmp_path / "disk"
    path.mkdir(mode=0o700)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs",
                              str(path)], capture_output=True, text=True, timeout=30)
    if mounted.returncode:
        reason = f"cannot mount a tmpfs: {mounted.stderr.strip() or mounted.returncode}"
        if os.environ.get("WEIR_REQUIRE_MOUNT") == "1":
            pytest.fail(f"WEIR_REQUIRE_MOUNT=1 but {reason}")
        pytest.skip(reason)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def fill(disk: Path) -> Path:
    """Writes a file on ``disk`` until no byte more fits; returns it."""
    filler = disk / "filler"
    block = b"\0" * (1 << 20)
    with open(filler, "wb") as out:
        while True:
            try:
                out.write(block)
                out.flush()
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    with contextlib.suppress(OSError), open(filler, "ab") as out:  # the last bytes
        while out.write(b"\0" * 4096):
            out.flush()
    return filler


def test_a_state_disk_that_fills_up_and_is_freed_again_is_recovered_from(
        master, tmp_path, small_disk):
    """Checkpoints and fences fail with ENOSPC while the disk is full; the operators back
    off and retry; once it is freed the application goes on by itself and ends exact."""
    app = totals_app(tmp_path, small_disk / "state", MAX_RESTARTS=50,
                     RESTART_BACKOFF_MILLIS=300, RESTART_BACKOFF_MAX_MILLIS=2000)
    with WeirClient(master.address) as client:
        app_id = client.submit(load_app(app).to_descriptor())
        poll_for(lambda: client.application(app_id).committed_window_id >= 0, 90,
                 f"a first committed window\n{container_logs(master)}")
        filler = fill(small_disk)
        full = poll_for(lambda: (i := client.application(app_id)).operator_failures >= 3 and i,
                        90, f"failures of a full disk\n{where_it_stands(client, app_id)}")
        assert full.state == "RUNNING"
        assert any("No space left on device" in m for m in failures(client, app_id))
        filler.unlink()  # the disk is freed: nothing but the master's retries follows
        wait_finished(client, master, app_id, 180)
    assert final_totals(tmp_path / "out") == expected()

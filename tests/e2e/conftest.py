"""End-to-end fixtures: a real master in this process, real container subprocesses."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from tests.harness import TAG_ENV, poll_for, tagged_env, tagged_processes
from weir.master.local_launcher import LocalProcessLauncher
from weir.master.server import MasterServer


@contextlib.contextmanager
def started_master(tmp_path, launcher: type[LocalProcessLauncher] = LocalProcessLauncher,
                   stop_grace_ms: int = 5_000, **options: Any) -> Iterator[MasterServer]:
    """A started master whose containers (``launcher``) log to ``tmp_path/containers``.

    Containers carry a tag in their environment (the launcher's, not this process's: a
    server the test starts meanwhile, PostgreSQL say, must not carry it); after the master
    stopped, none of them (nor Spark's JVMs) may be left: one still frozen (SIGSTOP) is
    woken to exit.
    """
    env, tag = tagged_env()
    tagged = {TAG_ENV: tag, "PYSPARK_PYTHON": env["PYSPARK_PYTHON"]}
    log_dir = tmp_path / "containers"
    server = MasterServer("127.0.0.1", 0,
                          lambda address: launcher(address, log_dir=log_dir, env=tagged),
                          container_stop_grace_ms=stop_grace_ms, **options)
    server.start()
    server.log_dir = log_dir
    try:
        yield server
    finally:
        server.stop()
        for process in tagged_processes(tag):
            with contextlib.suppress(psutil.Error):  # it may exit between listing and signal
                process.send_signal(signal.SIGCONT)
        poll_for(lambda: not tagged_processes(tag), 20, "every container and JVM to exit")


@pytest.fixture
def master(tmp_path):
    """A started master running its containers as local processes."""
    with started_master(tmp_path) as server:
        yield server


def container_logs(server: MasterServer) -> str:
    """Every container's log, for failure messages."""
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
                     for p in sorted(server.log_dir.glob("*.log")))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test that used a master gets its containers' logs in its report (so a
    timeout says what the containers were doing, whatever raised it)."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, MasterServer) and getattr(value, "log_dir", None):
            report.sections.append(("container logs", container_logs(value)))

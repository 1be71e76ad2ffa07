"""The master a control-plane bench measures: ``weir master --launcher recording`` as a
subprocess on 127.0.0.1, optionally with every thread profiled or every garbage collection
logged; always stopped after."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import psutil

__all__ = ["HOST", "MasterProcess", "master_process"]

_LOGGER = logging.getLogger(__name__)

_ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"

# Runs `weir master` instrumented: argv[1], if not empty, receives cProfile stats of every
# thread (cProfile alone sees only the main thread, where the master does nothing), on each
# thread's CPU clock so that waits (queues, locks, the GIL) count for nothing, and calls
# only once they returned (a blocked worker's pending call is left out); argv[2], if
# not empty, receives every garbage collection as JSON [epoch s, generation, pause s].
_INSTRUMENTED_MASTER = """
import cProfile, gc, json, pstats, sys, threading, time
profile_path, gc_path = sys.argv[1], sys.argv[2]
profiles, collections, started = [], [], [0.0]
def _start(*_):
    profile = cProfile.Profile(time.thread_time)
    profiles.append(profile)
    profile.enable()
def _collected(phase, info):
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        collections.append((time.time(), info["generation"], time.perf_counter() - started[0]))
if profile_path:
    threading.setprofile(_start)
if gc_path:
    gc.callbacks.append(_collected)
from weir.master.cli import main
try:
    code = main(sys.argv[3:])
finally:
    threading.setprofile(None)
    class Completed:  # calls still running in other threads would get bogus times
        def __init__(self, profile):
            self.profile = profile
        def create_stats(self):
            self.profile.snapshot_stats()
            self.stats = self.profile.stats
    total = None
    for profile in profiles:
        try:
            stats = pstats.Stats(Completed(profile))
        except TypeError:
            continue
        total = stats if total is None else total.add(stats)
    if total is not None:
        total.dump_stats(profile_path)
    if gc_path:
        with open(gc_path, "w") as file:
            json.dump(collections, file)
sys.exit(code)
"""


@dataclasses.dataclass
class MasterProcess:
    popen: subprocess.Popen[bytes]
    address: str
    stderr: IO[bytes]
    process: psutil.Process

    def stderr_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError, ValueError):
            self.stderr.flush()
            self.stderr.seek(0)
            return "\n".join(self.stderr.read().decode(errors="replace").splitlines()[-lines:])
        return ""


@contextlib.contextmanager
def master_process(profile_path: str | None, gc_path: str | None,
                   start_timeout_s: float = 30.0, state_dir: str | None = None,
                   application_masters: bool = False) -> Iterator[MasterProcess]:
    """A `weir master --launcher recording` subprocess on 127.0.0.1; always stopped after.

    Plain ``python -m weir`` unless asked to profile it or to log its collections.
    ``state_dir``: its ``--state-dir`` (its journal: every change it answers is written
    first); ``application_masters``: a dispatcher there, each application in a master
    process of its own (its folder, and journal, under ``state_dir/apps``).
    """
    args = ["master", "--host", HOST, "--port", "0", "--launcher", "recording",
            *(("--state-dir", state_dir) if state_dir else ()),
            *(("--application-masters",) if application_masters else ())]
    argv = [sys.executable, "-m", "weir", *args]
    if profile_path or gc_path:
        argv = [sys.executable, "-c", _INSTRUMENTED_MASTER, profile_path or "", gc_path or "",
                *args]
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy",
                                                                    "all_proxy", "grpc_proxy")}
    with tempfile.TemporaryFile() as stderr:
        popen = subprocess.Popen(argv, cwd=_ROOT, env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=stderr)
        try:
            address = _read_address(popen, start_timeout_s)
            master = MasterProcess(popen, address, stderr, psutil.Process(popen.pid))
            if not address.startswith(f"{HOST}:"):
                raise RuntimeError(f"the master listens on {address}, not on {HOST}")
            yield master
        except BaseException:
            if popen.poll() is not None:
                stderr.seek(0)
                _LOGGER.error("master exited with %s: %s", popen.returncode,
                              stderr.read().decode(errors="replace")[-2000:])
            raise
        finally:
            _stop(popen, grace_s=30.0 if profile_path else 10.0)


def _read_address(popen: subprocess.Popen[bytes], timeout_s: float) -> str:
    """The first line the master prints: its bound ``host:port``."""
    assert popen.stdout is not None
    deadline = time.monotonic() + timeout_s
    data = b""
    with selectors.DefaultSelector() as selector:
        selector.register(popen.stdout, selectors.EVENT_READ)
        while b"\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the master printed no address within {timeout_s:g} s")
            if not selector.select(min(left, 0.5)):
                if popen.poll() is not None:
                    raise RuntimeError(f"the master exited with code {popen.returncode}")
                continue
            chunk = os.read(popen.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"the master exited with code {popen.wait(5.0)}")
            data += chunk
    return data.split(b"\n", 1)[0].decode().strip()


def _stop(popen: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; never waits unbounded."""
    try:
        if popen.poll() is None:
            popen.terminate()
            try:
                popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                _LOGGER.warning("master pid %d ignored SIGTERM for %.0f s; killing it",
                                popen.pid, grace_s)
                popen.kill()
                popen.wait(5.0)
    finally:
        if popen.stdout is not None:
            popen.stdout.close()

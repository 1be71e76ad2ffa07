"""Spark's JVMs start from a class-data-sharing archive of Spark's classes (AppCDS).

Most of a Spark JVM's start and of its first job is loading and linking classes, the
same ones every time. Measured on the 2-core machine, idle, ``local[2]``, a fresh JVM
each (two runs of each): the SparkSession took 5.5-6.0 s and its first small job
5.1-5.5 s with the JVM's defaults; 2.9-3.0 s and 2.4-2.7 s with an archive of the
classes an earlier JVM loaded. Nothing else changes: same Spark, same compilers, same jobs.

The archive is made once per machine, Java and PySpark (a JVM will not map an archive of
other classes; a mismatched one is left unused, silently), by a small Spark session in
a process of its own whose JVM writes the classes it loaded as it exits
(``-XX:ArchiveClassesAtExit``). It is renamed into place only once that process ended
well, in a folder of this user's that nobody else may write: a JVM maps it as code. Until
it exists, and if it cannot be made, JVMs start without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from weir.storage.private_files import check_private_file, make_private_dir

__all__ = ["ArchiveMaker", "archive_path", "java_options", "make_archive"]

_LOGGER = logging.getLogger(__name__)

SILENT = "-Xlog:cds=off -Xlog:cds+dynamic=off"
"""A JVM says nothing of an archive it cannot use (another Java's): it runs without."""

MAKE_TIMEOUT_S = 240.0
_STALE_LOCK_S = MAKE_TIMEOUT_S + 60  # a maker that died left its lock: taken over after

# What the archive learns: a session, a grouped count through a window's input, Arrow back.
# The JVM writes the archive as it exits, after this process let go of it: wait for that,
# then put it in place. The training finishes its job (the rename, the lock and partial
# file removed) even when the process that started it has ended meanwhile (a short
# `weir run`).
_TRAINING = """
import os, sys
from pathlib import Path
partial, archive, lock = (Path(name) for name in sys.argv[1:4])
try:
    from pyspark import SparkContext
    from weir.runtime.spark.bridge import SparkSessionBridge
    from weir.runtime.spark.warm_up import run_warm_up_jobs
    bridge = SparkSessionBridge(master="local[1]", shuffle_partitions=1,
                                app_name="weir-cds", log_level="ERROR")
    run_warm_up_jobs(bridge, 2_000, 1)
    jvm = SparkContext._gateway.proc
    bridge.stop()
    SparkContext._gateway.shutdown()
    jvm.stdin.close()
    code = jvm.wait(180)
    if code == 0 and partial.is_file() and partial.stat().st_size:
        os.chmod(partial, 0o600)
        os.replace(partial, archive)
    raise SystemExit(code)
finally:
    partial.unlink(missing_ok=True)
    lock.unlink(missing_ok=True)
"""


def cache_folder() -> Path:
    """``$XDG_CACHE_HOME/weir`` (``~/.cache/weir``), owner-only (``storage.private_files``:
    refused if another user made it or others may write in it)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = base / "weir"
    make_private_dir(str(folder), "Weir's cache folder")
    return folder


_PATHS: dict[str, Path] = {}  # "archive": archive_path's answer in this process


def archive_path() -> Path:
    """Where this Java's and PySpark's archive lives (whether or not it exists yet); asked
    of ``java -version`` once per process.

    Raises:
        OSError: no cache folder, or no ``java`` to ask its version.
        UntrustedPath: the cache folder is another user's or others may write in it.
    """
    if "archive" in _PATHS:
        return _PATHS["archive"]
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True,
                          timeout=30, check=False).stderr
    key = hashlib.sha256(f"{java}|{pyspark.__version__}|{pyspark.__file__}".encode())
    path = _PATHS["archive"] = (cache_folder()
                                / f"spark-{pyspark.__version__}-{key.hexdigest()[:12]}.jsa")
    return path


def java_options() -> str:
    """The JVM options that start Spark from the archive, or "" when there is none yet, or
    when it is not this user's alone (refused, and said)."""
    try:
        archive = archive_path()
        if not archive.is_file():
            return ""
        check_private_file(str(archive), "Spark's class-data archive")
    except (OSError, subprocess.SubprocessError, ImportError) as exc:
        _LOGGER.warning("Spark's JVM starts without a class-data archive: %s", exc)
        return ""
    return f"-XX:SharedArchiveFile={archive} {SILENT}"


def make_archive(timeout_s: float = MAKE_TIMEOUT_S,
                 on_start: Callable[[subprocess.Popen[bytes]], None] | None = None) -> str:
    """Makes the archive now unless it exists or another process is making it; returns
    what happened, in a few words. ``on_start`` gets the training process (to stop it).

    One maker at a time: a lock file made with ``O_EXCL`` beside the archive (a lock older
    than a maker may live is taken over)."""
    try:
        archive = archive_path()
    except (OSError, subprocess.SubprocessError, ImportError) as exc:
        return f"no class-data archive for Spark's JVMs: {exc}"
    if archive.is_file():
        return f"Spark's JVMs start from the class-data archive {archive}"
    lock = archive.with_suffix(".lock")
    if not _claim(lock):
        return f"another process is making the class-data archive {archive}"
    try:
        _remove_stale_partials(archive.parent)
        return _train(archive, timeout_s, on_start)
    finally:
        lock.unlink(missing_ok=True)


def _remove_stale_partials(folder: Path) -> None:
    """Partial archives older than a maker may live: left by a training killed outright."""
    for path in folder.glob(".partial-*.jsa"):
        with contextlib.suppress(OSError):
            if time.time() - path.lstat().st_mtime > _STALE_LOCK_S:
                path.unlink()


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """Kills a training and its JVM: the session it leads, which we started."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)


def _claim(lock: Path) -> bool:
    for _ in range(2):
        try:
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            return True
        except FileExistsError:
            with contextlib.suppress(OSError):
                if time.time() - lock.lstat().st_mtime < _STALE_LOCK_S:
                    return False
                lock.unlink()
    return False


def _train(archive: Path, timeout_s: float,
           on_start: Callable[[subprocess.Popen[bytes]], None] | None) -> str:
    """One small Spark session whose JVM writes the archive as it exits."""
    fd, partial = tempfile.mkstemp(prefix=".partial-", suffix=".jsa", dir=archive.parent)
    os.close(fd)
    os.unlink(partial)  # the JVM creates it
    env = {**os.environ, "SPARK_SUBMIT_OPTS": f"-XX:ArchiveClassesAtExit={partial} {SILENT}"}
    try:  # a session of its own: a Ctrl-C meant for `weir run` leaves it to finish
        maker = subprocess.Popen(
            [sys.executable, "-c", _TRAINING, partial, str(archive),
             str(archive.with_suffix(".lock"))], env=env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if on_start is not None:
            on_start(maker)
        try:
            code = maker.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(maker)
            return f"the class-data archive was not made in {timeout_s:.0f} s"
        if code == 0 and archive.is_file():  # the training put it in place
            return f"Spark's JVMs start from the class-data archive {archive}"
        return f"the class-data archive was not made (exit code {code})"
    except OSError as exc:  # no python to start, no room for the file: said, not lost
        return f"the class-data archive was not made: {exc}"
    finally:
        Path(partial).unlink(missing_ok=True)


class ArchiveMaker:
    """``make_archive`` in a background thread, so that the next JVMs on this machine start
    from the archive; ``note`` says how it went, ``stop`` ends a training still running."""

    def __init__(self) -> None:
        self.note = ""
        self._thread: threading.Thread | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="spark-class-archive",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.note = make_archive(on_start=self._started)
        made = self.note.startswith(("Spark's JVMs start", "another process"))
        # a failure costs speed only (JVMs start without it), but it is said, not hidden
        _LOGGER.log(logging.INFO if made else logging.WARNING, "%s", self.note)

    def _started(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process

    def join(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s``; whether the maker is done."""
        if self._thread is not None:
            self._thread.join(timeout_s)
            return not self._thread.is_alive()
        return True

    def stop(self, timeout_s: float = 15.0) -> None:
        """Kills a training still running (no archive is made) and waits for the thread."""
        if self._process is not None and self._process.poll() is None:
            _kill_group(self._process)
        self.join(timeout_s)

"""The tests' Spark JVMs start from a class-data archive, with the quick compiler only.

A run of the suite starts well over a hundred Spark JVMs (one per container that runs a
Spark operator, again after every kill), each short-lived and small. Measured on the
2-core machine, idle, a ``local[1]`` session and its first three small jobs: 10.3 s with
the JVM's defaults, 4.3 s with a class-data-sharing archive of Spark's classes (made once
per machine, ``-XX:ArchiveClassesAtExit``), the C1 compiler only and the serial collector.
Spark's own ``SPARK_SUBMIT_OPTS`` carries the options to every JVM spark-submit starts:
the containers' (they inherit this process's environment) and the local runner's.
Nothing else changes: same Spark, same jobs. Production keeps the JVM's defaults (C2
matters to long runs).

The archive is made in the background while the first tests run, in a folder of this
user's that nobody else may write (a JVM maps it as code); until it is ready, and if it
cannot be made, the JVMs start without it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from weir.storage.private_files import check_private_file, make_private_dir

__all__ = ["SparkJvmOptions"]

_QUICK = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1"
_SILENT_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # a mismatched archive is just unused
_MAKE_TIMEOUT_S = 240

# What the archive learns: a session, a grouped count through a window's input, Arrow back.
# The JVM writes the archive as it exits, after this process let go of it: wait for that.
_TRAINING = """
from pyspark import SparkContext
from weir.runtime.spark.bridge import SparkSessionBridge
from weir.runtime.spark.warm_up import run_warm_up_jobs
bridge = SparkSessionBridge(master="local[1]", shuffle_partitions=1, app_name="cds")
run_warm_up_jobs(bridge, 2_000, 1)
jvm = SparkContext._gateway.proc
bridge.stop()
SparkContext._gateway.shutdown()
jvm.stdin.close()
raise SystemExit(jvm.wait(180))
"""


def _cache_folder() -> Path:
    """``~/.cache/weir-tests`` (or XDG's), owner-only (``storage.private_files``: refused
    if another user made it or others may write in it)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = base / "weir-tests"
    make_private_dir(str(folder), "the tests' cache folder")
    return folder


def _archive_name() -> str:
    """One archive per Java and PySpark (a JVM refuses an archive of other classes)."""
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True,
                          timeout=30, check=False).stderr
    key = hashlib.sha256(f"{java}|{pyspark.__version__}|{pyspark.__file__}".encode())
    return f"spark-{pyspark.__version__}-{key.hexdigest()[:12]}.jsa"


class SparkJvmOptions:
    """Sets ``SPARK_SUBMIT_OPTS`` for the session: the quick options at once, the archive
    once it exists (made by a background process if it does not)."""

    def __init__(self) -> None:
        self._previous = os.environ.get("SPARK_SUBMIT_OPTS")
        self._maker: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self.note = ""

    def start(self) -> None:
        if self._previous is not None:  # the developer chose: leave it
            self.note = "SPARK_SUBMIT_OPTS set by the caller: left as it is"
            return
        os.environ["SPARK_SUBMIT_OPTS"] = _QUICK
        try:
            archive = _cache_folder() / _archive_name()
        except (OSError, RuntimeError, ImportError, subprocess.SubprocessError) as exc:
            # no home folder, no java, no pyspark: the JVMs start without the archive
            self.note = f"no class-data archive for Spark's JVMs: {exc}"
            return
        if archive.is_file():
            try:
                check_private_file(str(archive), "the class-data archive")
            except OSError as exc:
                self.note = f"no class-data archive for Spark's JVMs: {exc}"
                return
            self._use(archive)
            return
        self._thread = threading.Thread(target=self._make, args=(archive,),
                                        name="spark-cds-archive", daemon=True)
        self._thread.start()

    def _use(self, archive: Path) -> None:
        os.environ["SPARK_SUBMIT_OPTS"] = f"-XX:SharedArchiveFile={archive} {_SILENT_CDS} {_QUICK}"
        self.note = f"Spark's JVMs start from the class-data archive {archive}"

    def _make(self, archive: Path) -> None:
        """Runs one small Spark session whose JVM writes the archive as it exits; the file
        is renamed into place only once that process ended well."""
        fd, partial = tempfile.mkstemp(prefix=".partial-", suffix=".jsa", dir=archive.parent)
        os.close(fd)
        os.unlink(partial)
        env = {**os.environ, "SPARK_SUBMIT_OPTS": f"-XX:ArchiveClassesAtExit={partial} "
                                                   f"{_SILENT_CDS} {_QUICK}"}
        root = Path(__file__).resolve().parent.parent
        try:
            self._maker = subprocess.Popen([sys.executable, "-c", _TRAINING], env=env, cwd=root,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            code = self._maker.wait(timeout=_MAKE_TIMEOUT_S)
            if code == 0 and Path(partial).is_file() and Path(partial).stat().st_size:
                os.replace(partial, archive)
                self._use(archive)
            else:
                self.note = f"the class-data archive was not made (exit code {code})"
        except subprocess.TimeoutExpired:
            self._maker.kill()
            self._maker.wait(10)
            self.note = f"the class-data archive was not made in {_MAKE_TIMEOUT_S} s"
        except OSError as exc:  # no python to start, no room for the file: said, not lost
            self.note = f"the class-data archive was not made: {exc}"
        finally:
            Path(partial).unlink(missing_ok=True)

    def stop(self) -> None:
        """Stops a maker still running and puts ``SPARK_SUBMIT_OPTS`` back."""
        if self._maker is not None and self._maker.poll() is None:
            self._maker.kill()
        if self._thread is not None:
            self._thread.join(15)
        if self._previous is None:
            os.environ.pop("SPARK_SUBMIT_OPTS", None)

"""The tests' Spark JVMs run with the quick compiler only, from Spark's class-data archive.

A run of the suite starts well over a hundred Spark JVMs (one per container that runs a
Spark operator, again after every kill), each short-lived and small. Measured on the
2-core machine, idle, a ``local[1]`` session and its first three small jobs: 10.3 s with
the JVM's defaults, 4.3 s with a class-data-sharing archive of Spark's classes, the C1
compiler only and the serial collector. The archive is the runtime's own
(``runtime.spark.class_archive``: every bridge maps it once it exists), made here in the
background while the first tests run; Spark's ``SPARK_SUBMIT_OPTS`` carries the quick
options to every JVM spark-submit starts: the containers' (they inherit this process's
environment) and the local runner's. Production keeps the JVM's compilers (C2 matters to
long runs).
"""

from __future__ import annotations

import os

from weir.runtime.spark.class_archive import ArchiveMaker

__all__ = ["SparkJvmOptions"]

_QUICK = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1"


class SparkJvmOptions:
    """Sets ``SPARK_SUBMIT_OPTS`` to the quick options for the session and has the archive
    made if it does not exist yet."""

    def __init__(self) -> None:
        self._previous = os.environ.get("SPARK_SUBMIT_OPTS")
        self._maker = ArchiveMaker()

    @property
    def note(self) -> str:
        if self._previous is not None:
            return "SPARK_SUBMIT_OPTS set by the caller: left as it is"
        return self._maker.note

    def start(self) -> None:
        if self._previous is not None:  # the developer chose: leave it
            return
        os.environ["SPARK_SUBMIT_OPTS"] = _QUICK
        self._maker.start()

    def stop(self) -> None:
        """Stops a maker still running and puts ``SPARK_SUBMIT_OPTS`` back."""
        self._maker.stop()
        if self._previous is None:
            os.environ.pop("SPARK_SUBMIT_OPTS", None)

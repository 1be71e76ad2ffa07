"""Spark's own logging, kept quiet: its JVM logs warnings and errors only, on stderr, and
PySpark does not repeat an analysis error as JSON with the JVM's stack trace."""

from __future__ import annotations

import logging
from pathlib import Path

__all__ = ["quiet_query_context_loggers", "write_log4j_config"]

_LOG4J_TEMPLATE = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
"""


def write_log4j_config(folder: Path, log_level: str) -> Path:
    """Writes the log4j2 file for ``log_level`` (WARN, ERROR or INFO) into ``folder`` (a
    private one: a file another user planted would configure the JVM); returns it."""
    level = {"WARN": "warn", "ERROR": "error", "INFO": "info"}.get(log_level.upper(), "warn")
    path = folder / f"log4j2-{level}.properties"
    path.write_text(_LOG4J_TEMPLATE.format(level=level))
    return path


def quiet_query_context_loggers() -> None:
    """PySpark logs every analysis error once more, as JSON with the whole JVM stack trace,
    on stderr: the operator's error already carries the message (its traceback goes to the
    container log), so that copy only buries it."""
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:  # PySpark before 4.0 has no such loggers
        return
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)

"""Attribute names, types, defaults and where they apply; unknown names are errors.

Attributes can be set in the DAG code, in a config file or with ``-D NAME=VALUE``; every
value travels as text and is parsed here, so all three paths share one check.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import Any

from weir.operators.faults import parse_crash_points

__all__ = [
    "ATTRIBUTES",
    "Attribute",
    "InvalidAttribute",
    "MAX_SPARES",
    "ProcessingMode",
    "Scope",
    "check_together",
    "parse_attributes",
    "resolve",
]


class Scope(enum.Flag):
    DAG = enum.auto()
    OPERATOR = enum.auto()
    BOTH = DAG | OPERATOR


class InvalidAttribute(ValueError):
    """An unknown attribute name or a value of the wrong type."""


@dataclasses.dataclass(frozen=True)
class Attribute:
    name: str
    parse: Callable[[str], Any]
    default: Any
    scope: Scope
    doc: str


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(f"{value} is not a positive integer")
    return value


def _within(low: int, high: int, unit: str = "") -> Callable[[str], int]:
    """A parser of integers from ``low`` to ``high``: a value the runtime cannot honour
    (a window of 2^70 ms, a 1 ms heartbeat timeout) is refused at submit, saying the range."""
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise ValueError(f"{value} is outside {low:,}..{high:,}{unit}")
        return value
    return parse


MAX_TEXT_CHARS = 4096
"""The longest text attribute (a URL, a path, a column name)."""


def _text(text: str) -> str:
    value = str(text)
    if len(value) > MAX_TEXT_CHARS:
        raise ValueError(f"{len(value):,} characters is longer than {MAX_TEXT_CHARS:,}")
    if "\0" in value:
        raise ValueError("a NUL character is not allowed")
    return value


_HOUR_MS = 3_600_000
_DAY_MS = 24 * _HOUR_MS
_MANY = 1_000_000  # windows, rows, restarts: more is a typo, not a plan


MAX_COUNT = 1024
"""The most containers an application, or partitions an operator, may ask for: a typo
(3000000) must be an error at submit, not a master that tries to plan it."""


def _count(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_COUNT:
        raise ValueError(f"{value} is more than {MAX_COUNT}, the most an application may ask "
                         "for")
    return value


MAX_SPARES = 16
"""The most spare containers an application may keep: each is a process with a warm JVM
(about 1 GB), so more than a few is a typo, not a plan."""


def _spare_count(text: str) -> int:
    value = int(text)
    if not 0 <= value <= MAX_SPARES:
        raise ValueError(f"{value} is not a number of spares: set 0 (none) to {MAX_SPARES} "
                         "(each spare keeps a process with a warm Spark JVM)")
    return value


def _cores(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1024:  # also refuses nan
        raise ValueError(f"{text} is not a number of cores: set 0 (no request) to 1,024")
    return value


class ProcessingMode(enum.StrEnum):
    """What an operator promises about a window after a failure (``PROCESSING_MODE``)."""

    AT_LEAST_ONCE = "AT_LEAST_ONCE"  # replayed from its recovery checkpoint
    AT_MOST_ONCE = "AT_MOST_ONCE"  # what it missed is skipped, never repeated
    EXACTLY_ONCE = "EXACTLY_ONCE"  # replayed identically from the newest usable checkpoint


def _mode(text: str) -> ProcessingMode:
    try:
        return ProcessingMode(str(text).upper())
    except ValueError:
        raise ValueError(f"{text!r} is not AT_LEAST_ONCE, AT_MOST_ONCE or EXACTLY_ONCE") \
            from None


def _bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not true or false")


def _on_error(text: str) -> str:
    value = str(text).strip().upper()
    if value not in ("FAIL", "DEAD_LETTER"):
        raise ValueError(f"{text!r} is not FAIL or DEAD_LETTER")
    return value


def _crash_points(text: str) -> str:
    parse_crash_points(text)
    return str(text)


_ALL = [
    Attribute("STREAMING_WINDOW_SIZE_MILLIS", _within(1, _HOUR_MS, " ms"), 500, Scope.DAG,
              "Length of one streaming window."),
    Attribute("HEARTBEAT_INTERVAL_MILLIS", _within(10, 60_000, " ms"), 500, Scope.DAG,
              "Time between two heartbeats of a container."),
    Attribute("HEARTBEAT_TIMEOUT_MILLIS", _within(100, _HOUR_MS, " ms"), 10_000, Scope.DAG,
              "A container silent this long is lost."),
    Attribute("CHECKPOINT_WINDOW_COUNT", _within(1, _MANY), 20, Scope.BOTH,
              "Streaming windows between two checkpoints (20 x 500 ms = 10 s of replay at most)."),
    Attribute("APPLICATION_WINDOW_COUNT", _within(1, _MANY), 1, Scope.OPERATOR,
              "Streaming windows per application window: window logic (one Spark job) runs "
              "once per application window."),
    Attribute("CONTAINERS", _count, 2, Scope.DAG,
              "Number of containers the operators are spread over."),
    Attribute("MAX_OPERATORS", _within(1, 1_000_000), 10_000, Scope.DAG,
              "The most physical operators the plan may have (partitions and unifiers "
              "counted); a DAG that would have more is refused at submit, before it is "
              "planned."),
    Attribute("SPARE_CONTAINERS", _spare_count, 0, Scope.DAG,
              "Warm standby containers kept beside the plan's: a lost container's operators "
              "go to a ready spare at once (its Spark already warm) instead of a new process; "
              "a new spare is then started in the background."),
    Attribute("CONTAINER_MEMORY_MB", _within(0, 16 << 20, " MB"), 0, Scope.DAG,
              "Memory each container asks its cluster manager for (a Kubernetes pod's request "
              "and limit, a Ray actor's memory; on the local launcher a limit on the "
              "container's processes, over which it is killed). A container keeps its "
              "buffers inside it (the buffer server spills past a quarter, an input port "
              "queues at most a sixteenth). 0 = no request. A request no "
              "node can meet, or one below what Spark's driver needs, is refused when the "
              "application is submitted."),
    Attribute("BUFFER_MEMORY_MB", _within(0, 16 << 20, " MB"), 0, Scope.DAG,
              "Memory each container's buffer server keeps streams in (every window is kept "
              "until it is committed) before it spills them to disk. 0 = a quarter of "
              "CONTAINER_MEMORY_MB up to 256 MB; without CONTAINER_MEMORY_MB, a sixteenth "
              "of the machine's memory (256 MB to 4 GB). With CONTAINER_MEMORY_MB, "
              "it must leave room for the rest (Spark's driver too): refused at submit "
              "otherwise."),
    Attribute("CONTAINER_CORES", _cores, 0.0, Scope.DAG,
              "CPU cores each container asks its cluster manager for (0.5 = half a core; "
              "the local launcher pins the container to that many cores, rounded up); "
              "0 = no request."),
    Attribute("CONTAINER", _within(-1, MAX_COUNT - 1), -1, Scope.OPERATOR,
              "Pin the operator to container number N (0-based); -1 = placed by the master."),
    Attribute("SPARK_MASTER", _text, "local[2]", Scope.DAG,
              "Spark master URL of each container's SparkSession."),
    Attribute("SPARK_SHUFFLE_PARTITIONS", _within(1, 100_000), 2, Scope.DAG,
              "spark.sql.shuffle.partitions: small, for small frequent jobs."),
    Attribute("SPARK_DRIVER_MEMORY", _text, "1g", Scope.DAG, "spark.driver.memory."),
    Attribute("SPARK_WARMUP_ROWS", _within(0, 100 * _MANY), 200_000, Scope.DAG,
              "Rows of the aggregations a Spark container runs as it starts, while the "
              "sources already read: the first round loads Spark's classes, later rounds "
              "warm the JIT until their time settles or SPARK_WARMUP_MILLIS is spent (a "
              "SparkSql fed by a source whose files give its schema also runs its own "
              "query, at least twice, over at most this many sample rows). 0 = "
              "none: the session only starts (short jobs, tests: the first windows pay "
              "the cold JIT instead)."),
    Attribute("SPARK_WARMUP_MILLIS", _within(0, _HOUR_MS, " ms"), 1_000, Scope.DAG,
              "How long a Spark container's warm-up goes on after its first round of each "
              "shape (which always runs: it loads Spark's classes, a cost the first window "
              "would pay anyway). 0 = the first rounds only. The sources run meanwhile; "
              "the Spark operators' first windows wait for it."),
    Attribute("SPARK_DRIVER_HOST", _text, "", Scope.DAG,
              "spark.driver.host: the address a cluster's executors reach each container's "
              "driver at; empty = 127.0.0.1 for a loopback spark:// master, else Spark's "
              "choice."),
    Attribute("SPARK_EXECUTOR_MEMORY", _text, "", Scope.DAG,
              "spark.executor.memory on a cluster; empty = Spark's default (1g)."),
    Attribute("SPARK_CORES_MAX", _within(0, 1_000_000), 0, Scope.DAG,
              "spark.cores.max: cores each container's Spark application takes from a "
              "standalone cluster; 0 = all it offers (a second container then waits)."),
    Attribute("SPARK_HANDOFF_DIR", _text, "", Scope.DAG,
              "A folder every Spark executor reads at the same path (e.g. NFS): windows "
              "reach Spark as Parquet files there. Empty = /dev/shm for local mode and a "
              "loopback spark:// master, createDataFrame (slower) for other clusters."),
    Attribute("STATE_DIR", _text, "", Scope.DAG,
              "Where checkpoints live (a path or pyarrow.fs URI); empty = a temporary folder."),
    Attribute("STATE_DIR_SHARED", _bool, False, Scope.DAG,
              "STATE_DIR is a folder every node mounts at the same path (NFS, a shared "
              "volume): a launcher that runs containers on several nodes (Kubernetes, Ray) "
              "refuses a local STATE_DIR without it, and any without a STATE_DIR."),
    Attribute("PROCESSING_MODE", _mode, "AT_LEAST_ONCE", Scope.BOTH,
              "AT_LEAST_ONCE, AT_MOST_ONCE or EXACTLY_ONCE."),
    Attribute("TIMEOUT_WINDOW_COUNT", _within(0, _MANY), 0, Scope.BOTH,
              "An operator whose window has not moved for this many windows while its input "
              "has data is blocked, and its container is restarted; 0 = 120 windows, but "
              "at least 60 s."),
    Attribute("SETUP_TIMEOUT_MILLIS", _within(1_000, _DAY_MS, " ms"), 120_000, Scope.DAG,
              "How long an operator's setup() (restoring its checkpoint, opening its "
              "connections) may run before it counts as stuck: the master restarts its "
              "container, and a redeploy that finds the previous deployment still in "
              "setup waits this long for it before asking for the same. Stretched by the "
              "machine's load per core, up to 4x: a busy machine sets up slower."),
    Attribute("STALL_TIMEOUT_MILLIS", _within(0, _DAY_MS, " ms"), 0, Scope.DAG,
              "The application is stalled once no window committed for this long while its "
              "sources emitted: said among its failures with the operator furthest behind, "
              "and shown by weir apps; 0 = the longest operator window timeout plus a "
              "checkpoint interval, at least 2 minutes."),
    Attribute("MAX_RESTARTS", _within(1, _MANY), 5, Scope.BOTH,
              "Restarts of an operator without a new checkpoint before the application fails."),
    Attribute("RESTART_BACKOFF_MILLIS", _within(0, _DAY_MS, " ms"), 1_000, Scope.DAG,
              "Delay before the second restart in a row (failures without a new checkpoint "
              "between them), doubled for each further one: a fault that lasts (a full disk, "
              "a broker down) does not spend MAX_RESTARTS in seconds. The first restart "
              "after a checkpoint is never delayed. 0 = no delay."),
    Attribute("RESTART_BACKOFF_MAX_MILLIS", _within(0, _DAY_MS, " ms"), 60_000, Scope.DAG,
              "The longest delay between restarts (RESTART_BACKOFF_MILLIS doubling stops "
              "here)."),
    Attribute("CRASH_AT", _crash_points, "", Scope.BOTH,
              "Kill the container on purpose at these named points, once each: "
              "'point' or 'point@n', comma-separated (tests of recovery; see operators.faults)."),
    Attribute("THROUGHPUT_CALCULATION_INTERVAL_MILLIS", _within(1, _DAY_MS, " ms"), 10_000,
              Scope.DAG,
              "Rates (tuples/s, bytes/s, CPU %) and latencies are moving averages over the "
              "windows that ended in this interval (at most the last 100 windows)."),
    Attribute("QUEUE_CAPACITY", _within(1, 100_000), 64, Scope.OPERATOR,
              "Messages buffered at one input port before its subscriber waits."),
    Attribute("PARTITIONS", _count, 1, Scope.OPERATOR,
              "Run the operator as N partitions, each taking the rows whose PARTITION_KEY "
              "hashes to its share; a unifier merges their output for an unpartitioned "
              "downstream operator."),
    Attribute("PARTITION_KEY", _text, "", Scope.OPERATOR,
              "The input column a partitioned operator's streams are split by (hash)."),
    Attribute("EVENT_TIME_COLUMN", _text, "", Scope.OPERATOR,
              "A source's event-time column (a timestamp, or epoch milliseconds): its "
              "watermark, sent downstream with every END_WINDOW, is the highest event time "
              "it emitted minus WATERMARK_DELAY_MILLIS. Empty = no watermark."),
    Attribute("WATERMARK_DELAY_MILLIS", _within(0, 30 * _DAY_MS, " ms"), 0, Scope.OPERATOR,
              "How far out of order a source's events may come: its watermark trails the "
              "highest event time it emitted by this much."),
    Attribute("IDLE_TIMEOUT_MILLIS", _within(0, 30 * _DAY_MS, " ms"), 0, Scope.OPERATOR,
              "A source partition with EVENT_TIME_COLUMN that emits no row for this long "
              "(counted in streaming windows, so a replay decides alike) is idle: it stops "
              "holding the watermark downstream back until it emits again. 0 = never."),
    Attribute("ON_ERROR", _on_error, "FAIL", Scope.OPERATOR,
              "What rows the operator's process() or Spark job raises on do: FAIL (the "
              "operator restarts, up to MAX_RESTARTS, then the application fails) or "
              "DEAD_LETTER (they leave on its errors port with the error, found by "
              "bisecting the batch, and the rest go on; connect op.errors to a sink)."),
    Attribute("DEAD_LETTER_MAX_ROWS", _within(1, _MANY), 100, Scope.OPERATOR,
              "With ON_ERROR=DEAD_LETTER, the most rows of one batch (a Spark operator: of "
              "one window) set aside: when more fail, or every row of a batch fails with an "
              "AttributeError, NameError, TypeError or ImportError (a bug), the operator "
              "fails naming the first error instead of turning its stream into dead letters."),
    Attribute("PARALLEL_PARTITION", _bool, False, Scope.OPERATOR,
              "Partition i reads partition i of its partitioned upstream operators (same "
              "count, no split, no unifier between them)."),
]

ATTRIBUTES: dict[str, Attribute] = {a.name: a for a in _ALL}


def _lookup(name: str, scope: Scope) -> Attribute:
    attribute = ATTRIBUTES.get(name)
    if attribute is None:
        import difflib

        near = difflib.get_close_matches(str(name).upper(), ATTRIBUTES, n=1)
        if near:  # the list of every attribute only when no name is close
            raise InvalidAttribute(f"unknown attribute {name!r}; did you mean {near[0]!r}?")
        known = ", ".join(sorted(ATTRIBUTES))
        raise InvalidAttribute(f"unknown attribute {name!r}; known attributes: {known}")
    if not attribute.scope & scope:
        where = "a DAG" if scope == Scope.DAG else "an operator"
        raise InvalidAttribute(f"attribute {name} cannot be set on {where}")
    return attribute


def parse_attributes(values: Mapping[str, Any], scope: Scope) -> dict[str, Any]:
    """Checks names and parses values (text or already typed); raises on the first bad one."""
    parsed: dict[str, Any] = {}
    for name, value in values.items():
        attribute = _lookup(name, scope)
        try:
            parsed[name] = attribute.parse(str(value))
        except (TypeError, ValueError) as exc:
            shown = repr(value) if len(str(value)) <= 80 else f"{str(value)[:80]!r}…"
            raise InvalidAttribute(f"attribute {name}={shown} is invalid: {exc}") from None
    return parsed


def check_together(values: Mapping[str, Any]) -> None:
    """Refuses typed DAG attributes that are valid alone but not together.

    >>> check_together({"HEARTBEAT_INTERVAL_MILLIS": 500, "HEARTBEAT_TIMEOUT_MILLIS": 600})
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    weir.operators.attributes.InvalidAttribute: HEARTBEAT_TIMEOUT_MILLIS=600 is less than twice ...
    """
    interval = values.get("HEARTBEAT_INTERVAL_MILLIS", ATTRIBUTES[
        "HEARTBEAT_INTERVAL_MILLIS"].default)
    timeout = values.get("HEARTBEAT_TIMEOUT_MILLIS", ATTRIBUTES[
        "HEARTBEAT_TIMEOUT_MILLIS"].default)
    if timeout < 2 * interval:
        raise InvalidAttribute(
            f"HEARTBEAT_TIMEOUT_MILLIS={timeout} is less than twice HEARTBEAT_INTERVAL_MILLIS="
            f"{interval}: one late heartbeat would lose a healthy container; raise the "
            f"timeout to {2 * interval} or more, or lower the interval")
    backoff = values.get("RESTART_BACKOFF_MILLIS", ATTRIBUTES["RESTART_BACKOFF_MILLIS"].default)
    longest = values.get("RESTART_BACKOFF_MAX_MILLIS",
                         ATTRIBUTES["RESTART_BACKOFF_MAX_MILLIS"].default)
    if longest < backoff:
        raise InvalidAttribute(
            f"RESTART_BACKOFF_MAX_MILLIS={longest} is less than RESTART_BACKOFF_MILLIS="
            f"{backoff}: the longest delay cannot be shorter than the first; raise the "
            "maximum or lower the first delay")


def resolve(name: str, *layers: Mapping[str, str]) -> Any:
    """The typed value of ``name`` from the first layer that sets it, else the default.

    Layers go from the strongest (command line) to the weakest (code).
    """
    attribute = ATTRIBUTES[name]
    for layer in layers:
        if name in layer:
            return attribute.parse(str(layer[name]))
    return attribute.default

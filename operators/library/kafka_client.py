"""What the Kafka source and sink share: the client library, their settings, clear errors.

Both use the official client, ``confluent-kafka`` (librdkafka), imported when an operator
is set up so that a DAG that reads no Kafka does not need it. Weir owns placement, so the
source assigns partitions itself (no group membership, no rebalances); a consumer group
only receives the source's committed offsets, for lag tools.
"""

from __future__ import annotations

import logging
import re
import time
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from weir.operators.operator import UnreachableAtStart

__all__ = [
    "KafkaSetupError",
    "KafkaUnreachableAtStart",
    "LIBRDKAFKA_LOG",
    "RepeatedLogFilter",
    "client_config",
    "kafka",
    "owns_partition",
    "partition_key",
    "split_key",
    "topic_partitions",
]

_METADATA_TIMEOUT_S = 10.0


class KafkaSetupError(RuntimeError):
    """The brokers cannot be reached, or a topic is not there: the operator cannot start."""


class KafkaUnreachableAtStart(KafkaSetupError, UnreachableAtStart):
    """A ``KafkaSetupError`` at an operator's first deployment: fatal."""


class RepeatedLogFilter(logging.Filter):
    """Lets each kind of librdkafka log line through once per ``every_s``: an unreachable
    broker makes it say the same thing hundreds of times. A kind is the line with its
    numbers taken out; the next line of a kind let through says how many were held back.
    """

    def __init__(self, every_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s = every_s
        self._clock = clock
        self._seen: dict[str, tuple[float, int]] = {}  # kind -> (last let through, held)

    def filter(self, record: logging.LogRecord) -> bool:
        kind = re.sub(r"\d+", "#", record.getMessage())
        now = self._clock()
        last, held = self._seen.get(kind, (float("-inf"), 0))
        if now - last < self.every_s:
            self._seen[kind] = (last, held + 1)
            return False
        if len(self._seen) > 1_000:  # bounded: kinds are few, but text may vary
            self._seen.clear()
        self._seen[kind] = (now, 0)
        if held:
            record.msg = f"{record.getMessage()} ({held} like it held back)"
            record.args = ()
        return True


LIBRDKAFKA_LOG = logging.getLogger("weir.operators.library.librdkafka")
"""Where the Kafka clients' own log lines go (``logger=``), each kind once a minute."""
LIBRDKAFKA_LOG.addFilter(RepeatedLogFilter())


def kafka() -> Any:
    """``confluent_kafka``, imported when an operator first needs it."""
    try:
        import confluent_kafka
        import confluent_kafka.admin  # noqa: F401 - makes confluent_kafka.admin available
    except ImportError as exc:
        raise ImportError("Kafka operators need confluent-kafka: pip install "
                          "'confluent-kafka>=2.5'") from exc
    return confluent_kafka


def client_config(bootstrap_servers: str, config: Mapping[str, Any] | None,
                  defaults: Mapping[str, Any], fixed: Mapping[str, Any],
                  who: str) -> dict[str, Any]:
    """librdkafka settings: ``defaults`` under the user's ``config``, ``fixed`` over it.

    Raises:
        ValueError: the user set a setting the operator must own (named, with why).
    """
    user = dict(config or {})
    clash = sorted(k for k in user if k in fixed and user[k] != fixed[k])
    if clash:
        raise ValueError(f"{who}: the Kafka setting(s) {clash} are set by Weir (it owns "
                         "offsets, transactions and placement); leave them out of config")
    return {**defaults, **user, **fixed, "bootstrap.servers": bootstrap_servers}


def partition_key(topic: str, partition: int) -> str:
    """How a topic partition is named in state, window records and metrics.

    >>> partition_key("orders", 3)
    'orders/3'
    """
    return f"{topic}/{partition}"


def split_key(key: str) -> tuple[str, int]:
    """The topic and partition of a ``partition_key``.

    >>> split_key("a/b/2")
    ('a/b', 2)
    """
    topic, _, partition = key.rpartition("/")
    return topic, int(partition)


def owns_partition(topic: str, partition: int, index: int, count: int) -> bool:
    """Whether source partition ``index`` of ``count`` reads this topic partition: stable
    as partitions are added (a topic's partition p goes to ``(crc32(topic) + p) % count``),
    and a topic's partitions spread evenly over the source's partitions.

    >>> [p for p in range(6) if owns_partition("t", p, 0, 2)] == \\
    ...     [p for p in range(6) if not owns_partition("t", p, 1, 2)]
    True
    """
    return count <= 1 or (zlib.crc32(topic.encode()) + partition) % count == index


def topic_partitions(client: Any, topics: list[str], bootstrap_servers: str,
                     who: str, first_deployment: bool = False) -> dict[str, list[int]]:
    """Each topic's partition numbers, from the brokers' metadata.

    Raises:
        KafkaSetupError: no broker answers, or a topic does not exist;
            ``KafkaUnreachableAtStart`` on the operator's ``first_deployment``.
    """
    failure = KafkaUnreachableAtStart if first_deployment else KafkaSetupError
    confluent = kafka()
    found: dict[str, list[int]] = {}
    for topic in topics:
        try:
            metadata = client.list_topics(topic, timeout=_METADATA_TIMEOUT_S)
        except confluent.KafkaException as exc:
            raise failure(
                f"{who}: no Kafka broker answers at {bootstrap_servers!r} "
                f"({exc.args[0].str() if exc.args else exc}); check bootstrap_servers and "
                "that the brokers run and are reachable from this container") from None
        described = metadata.topics.get(topic)
        error = described.error if described is not None else None
        if described is None or error is not None or not described.partitions:
            reason = error.str() if error is not None else "no partitions"
            raise failure(
                f"{who}: topic {topic!r} does not exist on the brokers at "
                f"{bootstrap_servers!r} ({reason}); create it, or fix the topic name")
        found[topic] = sorted(described.partitions)
    return found

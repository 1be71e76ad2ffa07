"""Ready-made operators: sources, Spark window logic and sinks to build DAGs from.

>>> from operators.library import TextFileSource, Tokenize, WindowedCount, ConsoleSink
"""

import logging

from operators.library.directory import DirectorySource
from operators.library.event_windows import EventTimeWindows
from operators.library.kafka_sink import KafkaSink  # confluent_kafka is imported in setup()
from operators.library.kafka_source import KafkaSource
from operators.library.parquet_source import ParquetSource
from operators.library.postgres import PostgresSink  # psycopg is imported in setup()
from operators.library.sinks import ConsoleSink, FileSink
from operators.library.sources import EVENT_SCHEMA, LINE_SCHEMA, EventGenerator, TextFileSource
from operators.library.tcp import TcpLineSource
from operators.library.transforms import (
    RunningCount,
    Tokenize,
    WindowedCount,
    WindowedCountUnifier,
)

__all__ = [
    "DirectorySource",
    "EVENT_SCHEMA",
    "EventTimeWindows",
    "LINE_SCHEMA",
    "ConsoleSink",
    "EventGenerator",
    "FileSink",
    "KafkaSink",
    "KafkaSource",
    "ParquetSource",
    "PostgresSink",
    "RunningCount",
    "TcpLineSource",
    "TextFileSource",
    "Tokenize",
    "WindowedCount",
    "WindowedCountUnifier",
]

_LOGGER = logging.getLogger(__name__)

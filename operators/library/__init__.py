"""Ready-made operators: sources, Spark window logic and sinks to build DAGs from.

>>> from weir.operators.library import TextFileSource, Tokenize, WindowedCount, ConsoleSink
"""

import logging

from weir.operators.library.deduplicate import Deduplicate
from weir.operators.library.directory import DirectorySource
from weir.operators.library.event_windows import EventTimeWindows
from weir.operators.library.interval_join import IntervalJoin
from weir.operators.library.kafka_sink import KafkaSink  # confluent_kafka is imported in setup()
from weir.operators.library.kafka_source import KafkaSource
from weir.operators.library.key_state import KeyContext, ListState, MapState, Timer, ValueState
from weir.operators.library.keyed_process import KeyedProcess
from weir.operators.library.lookup_join import LookupJoin
from weir.operators.library.parquet_source import CsvSource, JsonLinesSource, ParquetSource
from weir.operators.library.postgres import PostgresSink  # psycopg is imported in setup()
from weir.operators.library.regular_join import RegularJoin
from weir.operators.library.sinks import ConsoleSink, FileSink
from weir.operators.library.sources import EVENT_SCHEMA, LINE_SCHEMA, EventGenerator, TextFileSource
from weir.operators.library.table_join import TableJoin
from weir.operators.library.tcp import TcpLineSource
from weir.operators.library.top_n import TopN
from weir.operators.library.transforms import (
    RunningCount,
    Tokenize,
    WindowedCount,
    WindowedCountUnifier,
)
from weir.operators.library.window_join import WindowJoin

__all__ = [
    "Deduplicate",
    "DirectorySource",
    "EVENT_SCHEMA",
    "EventTimeWindows",
    "LINE_SCHEMA",
    "ConsoleSink",
    "EventGenerator",
    "FileSink",
    "IntervalJoin",
    "KafkaSink",
    "KeyContext",
    "KeyedProcess",
    "ListState",
    "LookupJoin",
    "MapState",
    "KafkaSource",
    "ParquetSource",
    "JsonLinesSource",
    "CsvSource",
    "PostgresSink",
    "RegularJoin",
    "RunningCount",
    "TableJoin",
    "TcpLineSource",
    "TextFileSource",
    "Timer",
    "Tokenize",
    "TopN",
    "ValueState",
    "WindowedCount",
    "WindowedCountUnifier",
    "WindowJoin",
]

_LOGGER = logging.getLogger(__name__)

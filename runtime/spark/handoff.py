"""How a window's Arrow data reaches Spark's executors: a Parquet file on a path they
share (``/dev/shm`` for local executors, ``SPARK_HANDOFF_DIR`` on a cluster), or Arrow
through the driver (``createDataFrame``) when no file can reach them; and the table as
Spark should read it either way."""

from __future__ import annotations

import ipaddress
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

import pyarrow as pa

from weir.operators.ports import conform

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Handoff", "arrow_dataframe", "default_scratch_parent", "handoff_for",
           "is_loopback_cluster", "row_group_rows", "to_table"]

_SHM = "/dev/shm"

Handoff = Literal["local", "shared", "arrow"]


def handoff_for(master: str, handoff_dir: str | os.PathLike[str] | None = None) -> Handoff:
    """How windows reach Spark's executors for this master (see the module docs)."""
    if handoff_dir:
        return "shared"
    if master.startswith("local") or is_loopback_cluster(master):
        return "local"
    return "arrow"


def is_loopback_cluster(master: str) -> bool:
    """A standalone master (or several, for HA) on loopback: its workers are on this host."""
    if not master.startswith("spark://"):
        return False
    hosts = [urlsplit(f"spark://{part.strip()}").hostname
             for part in master[len("spark://"):].split(",")]
    return bool(hosts) and all(is_loopback_host(host) for host in hosts)


def is_loopback_host(host: str | None) -> bool:
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_UNSIGNED_AS_PARQUET = {pa.uint8(): pa.int16(), pa.uint16(): pa.int32(),
                        pa.uint32(): pa.int64(), pa.uint64(): pa.decimal128(20, 0)}


def arrow_dataframe(spark: SparkSession, table: pa.Table) -> DataFrame:
    """``createDataFrame`` with the Spark types the Parquet path gives the same table.

    Spark's Arrow conversion refuses unsigned integers (its Parquet reader widens them)
    and makes naive timestamps ``timestamp`` (Parquet: ``timestamp_ntz``), so results
    would differ by path; both are evened out here.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    for i, field in enumerate(table.schema):
        wider = _UNSIGNED_AS_PARQUET.get(field.type)
        if wider is not None:
            table = table.set_column(i, field.with_type(wider), table.column(i).cast(wider))
    schema = from_arrow_schema(table.schema, prefer_timestamp_ntz=True)
    if table.num_rows == 0:  # PySpark fails on a table without chunks
        return spark.createDataFrame([], schema=schema)
    return spark.createDataFrame(table, schema=schema)


SHM_MIN_FREE_BYTES = 1 << 30
"""``/dev/shm`` is used for windows only with this much free: a pod's is 64 MiB by
default, where one large window would fail; then the temporary folder (a pod's emptyDir)."""


def default_scratch_parent() -> Path:
    """``/dev/shm`` if it is writable and roomy enough (``SHM_MIN_FREE_BYTES``), else the
    temporary folder."""
    if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK):
        try:
            usage = os.statvfs(_SHM)
        except OSError:
            usage = None
        if usage is not None and usage.f_bavail * usage.f_frsize >= SHM_MIN_FREE_BYTES:
            return Path(_SHM)
    return Path(tempfile.gettempdir())


PARQUET_OPTIONS = {"compression": "none", "use_dictionary": False,
                   "coerce_timestamps": "us", "allow_truncated_timestamps": True}
"""How a handed-off file is written: uncompressed, dictionary-free (what Spark's vectorised
reader scans fastest from memory), timestamps in the microseconds Spark keeps."""


def row_group_rows(num_rows: int, parallelism: int) -> int:
    """Rows per row group: enough row groups for Spark to split a big file across cores."""
    return max(131_072, -(-num_rows // max(1, parallelism * 2)))


def to_table(batches: list[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    batches = [conform(b, schema, "Spark input") for b in batches]
    table = pa.Table.from_batches(batches, schema=schema)
    # Parquet has no column type Spark reads for Arrow's null type: make such columns strings.
    nulls = [i for i, f in enumerate(table.schema) if pa.types.is_null(f.type)]
    for i in nulls:
        field = table.schema.field(i)
        table = table.set_column(i, field.with_type(pa.string()),
                                 table.column(i).cast(pa.string()))
    return table

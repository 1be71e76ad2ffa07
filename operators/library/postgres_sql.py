"""How Arrow data and names meet PostgreSQL: column types, quoted identifiers, DSNs fit for
messages, connections, and psycopg imported only when an operator first needs it."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from weir.operators.operator import OperatorContext, UnreachableAtStart

__all__ = ["CONNECT_TIMEOUT_SECONDS", "PostgresUnreachableAtStart", "connect", "identifier",
           "mask_dsn", "plain_columns", "postgres_type", "psycopg_module", "quoted"]

_STRING_VIEW = pa.string_view() if hasattr(pa, "string_view") else None  # pyarrow >= 16
_SUPPORTED = ("bool, int8-64, uint8-64, float16-64, decimal, string, large_string, "
              "string_view, date, time, timestamp (with or without time zone), and "
              "dictionaries of these")


def postgres_type(field: pa.Field) -> str:
    """The PostgreSQL column type for an Arrow field; TypeError names an unsupported one.

    >>> postgres_type(pa.field("n", pa.int64()))
    'BIGINT'
    >>> postgres_type(pa.field("at", pa.timestamp("us", tz="UTC")))
    'TIMESTAMPTZ'
    """
    kind = field.type.value_type if pa.types.is_dictionary(field.type) else field.type
    for test, name in _TYPES:
        if test(kind):
            return name(kind) if callable(name) else name
    raise TypeError(f"column {field.name!r} has Arrow type {field.type}, which PostgresSink "
                    f"cannot write to PostgreSQL (supported: {_SUPPORTED}); cast or drop the "
                    "column before the sink")


_TYPES: list[tuple[Callable[[pa.DataType], bool], str | Callable[[pa.DataType], str]]] = [
    (pa.types.is_boolean, "BOOLEAN"),
    (lambda t: t in (pa.int8(), pa.int16(), pa.uint8()), "SMALLINT"),
    (lambda t: t in (pa.int32(), pa.uint16()), "INTEGER"),
    (lambda t: t in (pa.int64(), pa.uint32()), "BIGINT"),
    (lambda t: t == pa.uint64(), "NUMERIC(20, 0)"),
    (lambda t: t in (pa.float16(), pa.float32()), "REAL"),
    (lambda t: t == pa.float64(), "DOUBLE PRECISION"),
    (pa.types.is_decimal, lambda t: f"NUMERIC({t.precision}, {t.scale})"),
    (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t)
     or (_STRING_VIEW is not None and t == _STRING_VIEW), "TEXT"),
    (pa.types.is_date, "DATE"),
    (pa.types.is_time, "TIME"),
    (lambda t: pa.types.is_timestamp(t) and t.tz is not None, "TIMESTAMPTZ"),
    (pa.types.is_timestamp, "TIMESTAMP"),
]


def mask_dsn(dsn: str) -> str:
    """The DSN with its password hidden, fit for messages and logs.

    >>> mask_dsn("host=db user=weir password=secret")
    'host=db user=weir password=***'
    >>> mask_dsn("postgresql://weir:secret@db:5432/app")
    'postgresql://weir:***@db:5432/app'
    """
    masked = re.sub(r"((?:^|\s)password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)
    masked = re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", masked)
    return re.sub(r"([?&]password=)[^&\s]*", r"\1***", masked)


def plain_columns(data: pa.Table) -> pa.Table:
    """Decodes dictionaries and casts the types Arrow's CSV writer lacks."""
    for i, field in enumerate(data.schema):
        kind = field.type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        if _STRING_VIEW is not None and kind == _STRING_VIEW:
            kind = pa.large_string()
        elif kind == pa.float16():
            kind = pa.float32()
        if kind != field.type:
            data = data.set_column(i, field.name, data.column(i).cast(kind))
    return data


def identifier(name: str) -> Any:
    """``"table"`` or ``"schema.table"`` as a quoted SQL identifier."""
    return psycopg_module().sql.Identifier(*name.split("."))


def quoted(name: str) -> str:
    """``"schema.table"`` quoted for ``to_regclass``."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split("."))


def psycopg_module() -> Any:
    """psycopg 3, imported when a sink first needs it."""
    try:
        import psycopg
        import psycopg.sql  # noqa: F401 - makes psycopg.sql available
    except ImportError as exc:
        raise ImportError("PostgresSink needs psycopg 3: pip install 'psycopg[binary]>=3.1'"
                          ) from exc
    return psycopg


class PostgresUnreachableAtStart(ConnectionError, UnreachableAtStart):
    """No PostgreSQL server answers at an operator's first deployment: fatal."""


CONNECT_TIMEOUT_SECONDS = 10


def connect(dsn: str, context: OperatorContext, kind: str) -> Any:
    """An autocommit connection for operator ``context.name`` (a ``kind``), with a connect
    timeout and the operator as application name. Unreachable at the operator's first
    deployment: ``PostgresUnreachableAtStart`` (fatal); later: ``ConnectionError`` (the
    operator is restarted, as for a server briefly away)."""
    psycopg = psycopg_module()
    options: dict[str, Any] = {"autocommit": True}
    if "connect_timeout" not in dsn:
        options["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
    if "application_name" not in dsn:
        options["application_name"] = f"weir {context.name}"[:63]
    try:
        return psycopg.connect(dsn, **options)
    except psycopg.Error as exc:
        detail = " ".join(str(exc).split())
        failure = PostgresUnreachableAtStart if context.recovered_window < 0 else ConnectionError
        raise failure(
            f"operator {context.name!r}: {kind} cannot connect to PostgreSQL at "
            f"{mask_dsn(dsn)!r}: {detail}. Check that the server is running and reachable "
            "from this container, and that the DSN's host, port, dbname, user and password "
            "are right") from exc

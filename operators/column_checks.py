"""Columns an operator names (keys, an event-time column, what an aggregation reads),
checked against what the source feeding it emits, when that is known before anything
runs: a misspelt column fails ``Dag.to_descriptor`` (so ``weir run`` and ``weir submit``)
with the columns there are, not a window later, after containers and Spark started.

What a source emits is its ``emitted_schema`` (a declared output schema; a
``ParquetSource``'s files); what a reader names is read from the attributes its class
lists in ``COLUMNS_READ``: a column (text), columns (a list), or Spark SQL aggregations
(a mapping: the column of each ``f(column)``; other expressions are not parsed, Spark
checks them). Only a source's direct readers are checked: further down, columns depend
on what the operators between compute.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from weir.operators.operator import InputOperator, Operator

__all__ = ["check_columns", "columns_read", "emitted_schema", "hide_internal_columns",
           "missing_column"]

_AGGREGATE_OF_A_COLUMN = re.compile(r"^\s*\w+\(\s*(?:DISTINCT\s+)?`?([A-Za-z_]\w*)`?\s*\)\s*$",
                                    re.IGNORECASE)


def columns_read(operator: Operator, port: str | None = None) -> Iterator[tuple[str, str]]:
    """(setting, column) for each column ``operator`` names in its ``COLUMNS_READ``, and
    in its ``COLUMNS_READ_BY_PORT`` for ``port`` (None: for every port).

    Raises:
        ValueError: ``COLUMNS_READ`` lists an attribute the operator does not have, or one
            that holds something else than a name (or None), names or aggregations.
    """
    by_port = operator.COLUMNS_READ_BY_PORT
    settings = [*operator.COLUMNS_READ, *(
        by_port.get(port, ()) if port is not None else
        (s for names in by_port.values() for s in names))]
    for setting in settings:
        if not hasattr(operator, setting):
            raise ValueError(f"COLUMNS_READ lists {setting!r}, which is not an attribute of "
                             f"{type(operator).__name__}; list the attributes that name columns")
        value: Any = getattr(operator, setting)
        if value is None:
            continue
        if isinstance(value, str):
            yield setting, value
        elif isinstance(value, Mapping):
            for name, expression in value.items():
                found = _AGGREGATE_OF_A_COLUMN.match(str(expression))
                if found:
                    yield f"{setting}[{name!r}]", found.group(1)
        elif isinstance(value, list | tuple) and all(isinstance(c, str) for c in value):
            yield from ((setting, column) for column in value)
        else:
            raise ValueError(f"COLUMNS_READ lists {setting!r}, which holds {value!r}: a "
                             "column's name, a list of names, or aggregations by output name "
                             "(or None) are what it can check")


def check_columns(sources: Mapping[str, pa.Schema | None],
                  readers: Mapping[str, list[tuple[str, str]]],
                  attributes: Mapping[str, Mapping[str, str]],
                  operators: Mapping[str, Operator]) -> None:
    """Raises ``DagError`` for a column a source's reader names, or a source's
    ``EVENT_TIME_COLUMN``, that is not among the source's columns.

    Args:
        sources: each source's output schema (None: not known before it runs).
        readers: the operators each source feeds directly, with the input port.
        attributes: each operator's attributes.
        operators: the operator instances by name.
    """
    from weir.operators.dag import DagError

    for name, operator in operators.items():  # what each declares, whatever feeds it
        try:
            list(columns_read(operator))
        except ValueError as exc:
            raise DagError(f"operator {name!r}: {exc}") from None
    for source, schema in sources.items():
        if schema is None:
            continue
        names = schema.names
        event_time = attributes.get(source, {}).get("EVENT_TIME_COLUMN")
        if event_time and event_time not in names:
            raise DagError(f"operator {source!r}: EVENT_TIME_COLUMN={event_time!r} is not "
                           f"among the columns it emits {names}{_hint(event_time, names)}; "
                           "set it to the column holding each row's time")
        for reader, port in readers.get(source, []):
            problem = missing_column(operators[reader], names, f"{source!r} does not emit",
                                     port)
            if problem:
                raise DagError(f"operator {reader!r}: {problem}; fix the name, or the "
                               "source's columns")


def missing_column(operator: Operator, names: list[str], where: str,
                   port: str | None = None) -> str | None:
    """What is wrong with the first column ``operator`` names (on ``port``) that is not in
    ``names`` (``where``: who does not have it), or None."""
    for setting, column in columns_read(operator, port):
        if column not in names:
            return (f"{setting} names column {column!r}, which {where} (its columns: "
                    f"{names}){_hint(column, names)}")
    return None


_INTERNAL = re.compile(r"`?__weir\w*`?(?:, )?")


def hide_internal_columns(message: str) -> str:
    """``message`` (Spark's, say: "Did you mean one of the following? [`amount`,
    `__weir_new`]") without the columns Weir adds for its own work (``__weir_*``), which
    the user never named and cannot use.

    >>> hide_internal_columns("Did you mean one of [`amount`, `__weir_new`, `user`]?")
    'Did you mean one of [`amount`, `user`]?'
    """
    return re.sub(r", \]", "]", _INTERNAL.sub("", message))


def emitted_schema(operator: InputOperator) -> pa.Schema | None:
    """The one output's schema a source says it emits, or None (unknown, or several)."""
    try:
        return operator.emitted_schema()
    except (OSError, ValueError, pa.ArrowException):  # unknown until it runs: its setup
        return None  # says what is wrong (a folder made later, a file being written)


def _hint(name: str, names: list[str]) -> str:
    near = difflib.get_close_matches(name, names, n=1)
    return f"; did you mean {near[0]!r}?" if near else ""

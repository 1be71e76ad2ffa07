"""What a ``KeyedProcess`` function sees of one key: its state, its timers, its output.

State is declared per operator class (``STATE = {"name": ValueState(pa.int64()), ...}``)
and typed: a value that does not fit its Arrow type is refused when it is set, naming the
state. A key's states live together in one row of the operator's keyed store (pickled),
read when the key is touched in a window and written back at the window's end if changed.
Timers are rows of the same store ordered by time, so the due ones are a range read.

Stored keys are bytes that sort as the store needs them: ``s`` + the key for a key's
state, ``e``/``p`` + the time (8 bytes, big-endian, offset to unsigned) + the key for an
event-time/processing-time timer.

>>> timer_row("e", 1_000, ("u1",)) < timer_row("e", 2_000, ("a",))
True
>>> parse_timer_row(timer_row("p", -5, ("u1", 7)))
('p', -5, ('u1', 7))
"""

from __future__ import annotations

import dataclasses
import pickle
import struct
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

__all__ = ["KeyContext", "ListState", "MapState", "Timer", "ValueState", "key_of_row",
           "parse_timer_row", "state_row", "timer_row"]

_OFFSET = 2**63
EVENT, PROCESSING = "e", "p"


def _encode_key(key: tuple[Any, ...]) -> bytes:
    return pickle.dumps(key, protocol=5)


def state_row(key: tuple[Any, ...]) -> bytes:
    return b"s" + _encode_key(key)


def timer_row(kind: str, time: int, key: tuple[Any, ...]) -> bytes:
    return kind.encode() + struct.pack(">Q", time + _OFFSET) + _encode_key(key)


def timer_bound(kind: str, time: int) -> bytes:
    """A stored key after every ``kind`` timer at or before ``time`` and before any later
    one (a timer row's key part is a pickle: its first byte is below 0xff)."""
    return kind.encode() + struct.pack(">Q", time + _OFFSET) + b"\xff"


def parse_timer_row(row: bytes) -> tuple[str, int, tuple[Any, ...]]:
    (time,) = struct.unpack(">Q", row[1:9])
    return row[:1].decode(), time - _OFFSET, pickle.loads(row[9:])


def key_of_row(row: bytes) -> tuple[Any, ...]:
    """The key a stored row (state or timer) belongs to."""
    return pickle.loads(row[1:] if row[:1] == b"s" else row[9:])


@dataclasses.dataclass(frozen=True)
class Timer:
    """A timer that fired: ``kind`` is ``"event"`` (the watermark passed ``time``) or
    ``"processing"`` (a streaming window ending at or after ``time`` on the application's
    clock, so the same window on every replay)."""

    kind: str
    time: int


# -- state kinds ---------------------------------------------------------------------
def _checked(value: Any, type_: pa.DataType | None, what: str) -> Any:
    if type_ is None:  # declared untyped: any picklable value
        return value
    try:
        pa.scalar(value, type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"{what} is declared {type_}; {value!r} does not fit: {exc}") from None
    return value


@dataclasses.dataclass(frozen=True)
class ValueState:
    """One value per key (``None`` until set). ``type``: its Arrow type (None: any
    picklable value, unchecked; the same for every kind)."""

    type: pa.DataType | None



@dataclasses.dataclass(frozen=True)
class ListState:
    """A list of values per key, appended to in arrival order."""

    type: pa.DataType | None



@dataclasses.dataclass(frozen=True)
class MapState:
    """A mapping per key (from ``key_type`` to ``value_type``)."""

    key_type: pa.DataType | None
    value_type: pa.DataType | None



StateKind = ValueState | ListState | MapState


class _Value:
    def __init__(self, owner: _States, name: str, kind: ValueState) -> None:
        self._owner, self._name, self._kind = owner, name, kind

    @property
    def value(self) -> Any:
        return self._owner.values.get(self._name)

    def update(self, value: Any) -> None:
        self._owner.set(self._name, _checked(value, self._kind.type, self._owner.what(
            self._name)))

    def clear(self) -> None:
        self._owner.set(self._name, None)


class _List:
    def __init__(self, owner: _States, name: str, kind: ListState) -> None:
        self._owner, self._name, self._kind = owner, name, kind

    def get(self) -> list[Any]:
        return list(self._owner.values.get(self._name) or [])

    def __iter__(self) -> Iterator[Any]:
        return iter(self.get())

    def __len__(self) -> int:
        return len(self._owner.values.get(self._name) or [])

    def append(self, value: Any) -> None:
        self.extend([value])

    def extend(self, values: list[Any]) -> None:
        what = self._owner.what(self._name)
        checked = [_checked(v, self._kind.type, what) for v in values]
        if checked:
            self._owner.values.setdefault(self._name, []).extend(checked)
            self._owner.changed = True

    def update(self, values: list[Any]) -> None:
        """Replaces the whole list."""
        what = self._owner.what(self._name)
        self._owner.set(self._name, [_checked(v, self._kind.type, what) for v in values])

    def clear(self) -> None:
        self._owner.set(self._name, None)


class _Map:
    def __init__(self, owner: _States, name: str, kind: MapState) -> None:
        self._owner, self._name, self._kind = owner, name, kind

    def _items(self) -> dict[Any, Any]:
        return self._owner.values.get(self._name) or {}

    def get(self, key: Any, default: Any = None) -> Any:
        return self._items().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        return self._items()[key]

    def __contains__(self, key: Any) -> bool:
        return key in self._items()

    def __len__(self) -> int:
        return len(self._items())

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._items().items())

    def __setitem__(self, key: Any, value: Any) -> None:
        what = self._owner.what(self._name)
        items = self._owner.values.setdefault(self._name, {})
        items[_checked(key, self._kind.key_type, f"{what}'s key")] = _checked(
            value, self._kind.value_type, what)
        self._owner.changed = True

    def __delitem__(self, key: Any) -> None:
        items = self._items()
        del items[key]
        if not items:
            self._owner.values.pop(self._name, None)
        self._owner.changed = True

    def clear(self) -> None:
        self._owner.set(self._name, None)


_VIEWS: dict[type, type] = {ValueState: _Value, ListState: _List, MapState: _Map}


class _States:
    """One key's declared states, by attribute (``ctx.state.count``) or by name.

    ``values`` holds the key's states as read; lists and maps are changed in place (a
    function that fails fails the window, which is then replayed from the store)."""

    def __init__(self, declared: dict[str, StateKind], values: dict[str, Any],
                 where: str) -> None:
        self.declared = declared
        self.values = values
        self.changed = False
        self._where = where

    def what(self, name: str) -> str:
        return f"{self._where}: state {name!r}"

    def set(self, name: str, value: Any) -> None:
        if value is None or value == [] or value == {}:
            self.values.pop(name, None)
        else:
            self.values[name] = value
        self.changed = True

    def __getitem__(self, name: str) -> Any:
        kind = self.declared.get(name)
        if kind is None:
            raise KeyError(f"{self._where}: no state {name!r}; its STATE declares "
                           f"{sorted(self.declared)}")
        return _VIEWS[type(kind)](self, name, kind)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(exc.args[0]) from None


class _Timers:
    """The key's timers: set or delete one by kind and time (epoch ms)."""

    def __init__(self, key: tuple[Any, ...], changes: dict[bytes, bytes | None],
                 on_set: Callable[[bytes], None]) -> None:
        self._key = key
        self._changes = changes
        self._on_set = on_set

    def event_time(self, time: int) -> None:
        """Fires ``on_timer`` once the watermark reaches ``time``."""
        self._set(EVENT, time)

    def processing_time(self, time: int) -> None:
        """Fires ``on_timer`` at the end of the first streaming window ending at or after
        ``time`` (the application's clock)."""
        self._set(PROCESSING, time)

    def delete_event_time(self, time: int) -> None:
        self._changes[timer_row(EVENT, int(time), self._key)] = None

    def delete_processing_time(self, time: int) -> None:
        self._changes[timer_row(PROCESSING, int(time), self._key)] = None

    def _set(self, kind: str, time: int) -> None:
        if isinstance(time, bool) or not isinstance(time, int):
            raise TypeError(f"a timer's time is epoch milliseconds (int), not {time!r}")
        row = timer_row(kind, time, self._key)
        self._changes[row] = b""
        self._on_set(row)


class KeyContext:
    """One key's view inside ``process_key`` and ``on_timer``.

    Attributes:
        key: the key (a value; a tuple when the operator is keyed by several columns).
        state: the key's declared states: ``ctx.state.name.value``, ``.update(v)``,
            ``.append(v)``, ``[k] = v``, ``.clear()``.
        timers: ``ctx.timers.event_time(t)``, ``.processing_time(t)``, and their deletes.
        watermark: the operator's watermark as of the window ending now.
        window_time: when the streaming window ends (epoch ms, the application's clock).
        port: the input port the rows came on (None in ``on_timer``).
    """

    def __init__(self, key: Any, state: _States, timers: _Timers, watermark: int,
                 window_time: int, out: list[Any], port: str | None = None) -> None:
        self.key = key
        self.port = port
        self.state = state
        self.timers = timers
        self.watermark = watermark
        self.window_time = window_time
        self._out = out

    def emit(self, row: dict[str, Any] | None = None, **columns: Any) -> None:
        """Adds one output row (a mapping, or columns as keyword arguments)."""
        self._out.append({**(row or {}), **columns})

    def emit_values(self, *values: Any) -> None:
        """Adds one output row given as its values in the output's column order (cheaper
        than ``emit`` for many rows)."""
        self._out.append(values)

    def emit_table(self, rows: pa.Table) -> None:
        """Adds output rows as a table (cheaper than one ``emit`` a row for rows that are
        already Arrow, such as a slice of ``rows``)."""
        self._out.append(rows)

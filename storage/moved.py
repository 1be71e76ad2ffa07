"""Modules that moved, for what was pickled before they did: an operator's checkpoint or
savepoint (a source keeping a ``RecordLog``, say) and the master's journal name classes
by module, so a new version must still find them under their old names."""

from __future__ import annotations

import io
import pickle
from typing import Any

__all__ = ["MOVED", "loads"]

MOVED = {
    "operators.durable": "storage",
    "operators.orphans": "storage.orphans",
    "operators.savepoints": "storage.savepoints",
    "operators.process_calls": "runtime.process_calls",
    "operators.event_time": "runtime.event_time",
    "operators.operator_state": "runtime.operator_state",
}
"""Old module (or package: its modules move with it) -> where it is now."""


def current_module(module: str) -> str:
    """Where ``module`` is now."""
    for old, new in MOVED.items():
        if module == old or module.startswith(old + "."):
            return new + module[len(old):]
    return module


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(current_module(module), name)


def loads(data: bytes) -> Any:
    """``pickle.loads`` (what ``cloudpickle.loads`` is), finding moved classes."""
    return _Unpickler(io.BytesIO(data)).load()

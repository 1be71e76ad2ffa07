"""Modules that moved, for what was pickled before they did: an operator's checkpoint or
savepoint (a source keeping a ``RecordLog``, say) and the master's journal name classes
by module, so a new version must still find them under their old names."""

from __future__ import annotations

import io
import pickle
from typing import Any

__all__ = ["MOVED", "loads"]

MOVED = {
    "operators.durable": "weir.storage",
    "operators.orphans": "weir.storage.orphans",
    "operators.savepoints": "weir.storage.savepoints",
    "operators.process_calls": "weir.runtime.process_calls",
    "operators.event_time": "weir.runtime.event_time",
    "operators.operator_state": "weir.runtime.operator_state",
    **{part: f"weir.{part}" for part in ("proto", "operators", "runtime", "storage", "master",
                                         "container")},  # before the one namespaced package
}
"""Old module (or package: its modules move with it) -> where it is now; the first that
matches wins."""


def current_module(module: str) -> str:
    """Where ``module`` is now (a class path too: ``operators.library.X``)."""
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

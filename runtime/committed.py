"""The committed window: every window up to it is done for good. One rule, for the master
(over its operators' recovery checkpoints) and for the local runner (over its operators'
last checkpoints).

>>> committed_window({"a": 40, "b": 20})
20
>>> committed_window({"a": 40, "b": 20}, ended={"b": 20})  # b ended at 20: done
40
>>> committed_window({"a": 40, "b": 60}, ended={"a": 40, "b": 60})  # all done: the newest
60
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TypeVar

from weir.operators.windows import NO_WINDOW

__all__ = ["committed_window", "is_done"]

K = TypeVar("K", bound=Hashable)


def committed_window(recovery: Mapping[K, int], ended: Mapping[K, int] | None = None) -> int:
    """The minimum recovery checkpoint over the operators that are not done; -1 before any.

    A done operator (``is_done``: it ended, and its recovery checkpoint reached its end)
    is never rerun, so it holds nothing back: the windows after its end can still be
    committed for the operators downstream of it, which wait for that to deliver
    ``committed`` before they tear down. Once every operator is done, the newest
    recovery checkpoint is committed.

    Args:
        recovery: each operator's recovery checkpoint.
        ended: the last window of each operator that ended its stream.
    """
    ended = ended or {}
    live = [w for key, w in recovery.items() if not is_done(ended.get(key), w)]
    if not live and recovery:
        return max(recovery.values())
    return min(live, default=NO_WINDOW)


def is_done(ended_window: int | None, recovery: int) -> bool:
    """An operator that ended (at ``ended_window``; None: it has not) and is checkpointed
    there: it is never rerun."""
    return ended_window is not None and recovery >= ended_window

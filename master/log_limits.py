"""Rate limits for repeated warnings: at most one line per key per interval, with a count.

A misbehaving or hostile container repeats the same mistake in every heartbeat (several a
second): logging each would drown the master's log and cost it time under its lock. The
first occurrence of a key is logged at once; later ones within the interval are only
counted, and the next line logged for that key says how many were held back.

>>> limiter = LogLimiter(interval_ms=1_000)
>>> limiter.admit("bad", 0), limiter.admit("bad", 10), limiter.admit("bad", 20)
(0, None, None)
>>> limiter.admit("bad", 1_000)  # the interval is over: logged, 2 were held back
2
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Hashable

__all__ = ["DEFAULT_INTERVAL_MS", "LogLimiter"]

DEFAULT_INTERVAL_MS = 60_000
"""One line per key a minute: enough to see a problem persists, not enough to flood."""

_MAX_KEYS = 1_024


class LogLimiter:
    """Decides which repeated warnings to log; not thread-safe (callers hold the master's lock).

    Keys are kept for the ``max_keys`` most recently seen (least recently logged ones are
    forgotten first), so a sender inventing new keys cannot grow the master's memory.

    Args:
        interval_ms: at most one line per key in this time.
        max_keys: keys remembered.
    """

    def __init__(self, interval_ms: int = DEFAULT_INTERVAL_MS, max_keys: int = _MAX_KEYS) -> None:
        self.interval_ms = interval_ms
        self.max_keys = max_keys
        # key -> [when last logged (ms), occurrences held back since]
        self._keys: collections.OrderedDict[Hashable, list[int]] = collections.OrderedDict()

    def admit(self, key: Hashable, now_ms: int) -> int | None:
        """None to hold this occurrence back; else log it (the int: how many were held back)."""
        entry = self._keys.get(key)
        if entry is not None and now_ms - entry[0] < self.interval_ms:
            entry[1] += 1
            return None
        held_back = entry[1] if entry is not None else 0
        self._keys[key] = [now_ms, 0]
        self._keys.move_to_end(key)
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)
        return held_back

    def log(self, logger: logging.Logger, level: int, key: Hashable, now_ms: int, msg: str,
            *args: object) -> bool:
        """Logs ``msg % args`` unless held back; True if it was logged."""
        held_back = self.admit(key, now_ms)
        if held_back is None:
            return False
        if held_back:
            msg += f" ({held_back} similar warning(s) suppressed since the last one)"
        logger.log(level, msg, *args)
        return True

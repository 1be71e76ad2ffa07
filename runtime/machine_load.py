"""How busy this machine is: the factor by which bounds on slow start-up work stretch.

A JVM that starts in 5 s on an idle machine takes 30 s when ten other processes share
its two cores; a fixed bound on setup either fires falsely there (a needless restart
starts another cold JVM) or waits far too long on an idle machine. Bounds on work whose
speed is the machine's (Spark's start, a setup restoring state) are therefore given for
an idle machine and stretched by the load per core, up to ``MAX_STRETCH``.
"""

from __future__ import annotations

import os

__all__ = ["MAX_STRETCH", "load_stretch", "stretched_ms"]

MAX_STRETCH = 4.0
"""The most a bound stretches: a stuck setup is still found within 4x its bound."""


def load_stretch(max_stretch: float = MAX_STRETCH) -> float:
    """The one-minute load average per core, between 1 and ``max_stretch``.

    >>> 1.0 <= load_stretch() <= MAX_STRETCH
    True
    """
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform: the bound as given
        return 1.0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(max_stretch, max(1.0, load / max(cores or 1, 1)))


def stretched_ms(bound_ms: float) -> int:
    """``bound_ms`` stretched by this machine's load now."""
    return int(bound_ms * load_stretch())

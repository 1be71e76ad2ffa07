"""The runner's half of in-band watermarks, kept in ``operators.event_time`` (the local
test runner, ``operators.local_run``, needs the same logic); re-exported here for the
container's modules."""

from __future__ import annotations

from operators.event_time import (
    EventTimeError,
    SourceEventTimes,
    idle_windows,
    merged_watermarks,
    operator_watermarks,
)

__all__ = ["EventTimeError", "SourceEventTimes", "idle_windows", "merged_watermarks",
           "operator_watermarks"]

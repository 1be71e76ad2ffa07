"""Crash injection at named points, switched on by configuration, to test the hard cases.

A crash here is what a power cut or ``kill -9`` does: the process dies at once, with no
``finally`` blocks, no flushed buffers and no goodbye to the master. Set the attribute
``CRASH_AT`` (on the DAG, an operator, a config file or ``-D``) to a comma-separated list of
``point`` or ``point@n`` (crash the ``n``-th time the point is reached, default 1). Each
point crashes once per operator and state folder: a marker file, written before the
crash, keeps the recovered operator from dying again at the same place.

Points the library reaches (``operator`` is the operator's name):

- ``commit.recorded``: a commit-step sequence is durable, none of its steps has run.
- ``commit.between_steps``: after the first step of a sequence of two or more.
- ``commit.executed``: every step ran, the sequence is not marked done.
- ``wal.appended``: a push source's log holds records it has not acknowledged yet.
- ``postgres.before_commit``: a window's rows are written, the transaction is open.
- ``kafka.records_sent``: a window's records are acknowledged, its transaction is open.
- ``kafka.before_commit``: its progress record too; the transaction is not committed.
- ``kafka.committed``: the transaction is committed, the window has not ended.

>>> parse_crash_points("commit.between_steps, wal.appended@3")
{'commit.between_steps': 1, 'wal.appended': 3}
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Mapping
from typing import Any

__all__ = ["CrashPoints", "parse_crash_points"]

_LOGGER = logging.getLogger(__name__)
_POINT = re.compile(r"^([A-Za-z0-9_.-]+)(?:@([1-9][0-9]*))?$")


def parse_crash_points(text: str) -> dict[str, int]:
    """``"a, b@3"`` → ``{"a": 1, "b": 3}``; raises ValueError naming a malformed entry."""
    points: dict[str, int] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        match = _POINT.match(entry)
        if match is None:
            raise ValueError(f"CRASH_AT entry {entry!r} is not 'point' or 'point@n' (n >= 1)")
        points[match.group(1)] = int(match.group(2) or 1)
    return points


class CrashPoints:
    """The crash points armed for one operator; ``reach(name)`` kills the process when due.

    Args:
        attributes: the operator's resolved attributes (``CRASH_AT`` is read).
        marker_dir: a folder that outlives the process (the operator's state folder); the
            marker of a point that fired lives there. None = no markers (crash every time).
    """

    def __init__(self, attributes: Mapping[str, Any], marker_dir: str | None) -> None:
        self.armed = parse_crash_points(str(attributes.get("CRASH_AT", "") or ""))
        self.marker_dir = marker_dir
        self._hits: dict[str, int] = {}

    def reach(self, name: str) -> None:
        """Counts a visit of point ``name``; dies like ``kill -9`` on the armed visit."""
        due = self.armed.get(name)
        if due is None:
            return
        self._hits[name] = self._hits.get(name, 0) + 1
        if self._hits[name] != due or self._fired(name):
            return
        if self.marker_dir is not None:
            os.makedirs(self.marker_dir, exist_ok=True)
            marker = os.path.join(self.marker_dir, f"crashed-at-{name}")
            with open(marker, "w") as out:
                out.write(f"{os.getpid()}\n")
                out.flush()
                os.fsync(out.fileno())
        _LOGGER.warning("CRASH_AT %s: killing process %d on purpose", name, os.getpid())
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)

    def _fired(self, name: str) -> bool:
        return self.marker_dir is not None and os.path.exists(
            os.path.join(self.marker_dir, f"crashed-at-{name}"))

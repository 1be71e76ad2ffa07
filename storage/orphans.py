"""Folders a Weir process leaves behind when it is killed, swept by the next one.

A master or container names its temporary folders ``<prefix><pid>-<random>``; one whose
process no longer runs (SIGKILLed, or its machine restarted) is removed by the next
process that makes a folder with the same prefix, if it belongs to the same user.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path

__all__ = ["pid_alive", "remove_orphans"]

_LOGGER = logging.getLogger(__name__)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (also one of another user)."""
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True


def remove_orphans(parent: Path, prefix: str) -> int:
    """Removes this user's ``<prefix><pid>-*`` folders under ``parent`` whose process is
    gone; returns how many."""
    try:
        entries = list(parent.glob(f"{prefix}*-*"))
    except OSError:
        return 0
    removed = 0
    for entry in entries:
        pid_text = entry.name[len(prefix):].split("-", 1)[0]
        if not pid_text.isdecimal() or int(pid_text) == os.getpid() or pid_alive(int(pid_text)):
            continue
        try:
            if entry.is_dir() and not entry.is_symlink() and entry.stat().st_uid == os.getuid():
                shutil.rmtree(entry, ignore_errors=True)
                removed += 1
                _LOGGER.info("removed %s, left by process %s that no longer runs", entry,
                             pid_text)
        except OSError:
            pass
    return removed

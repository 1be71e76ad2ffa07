"""A container started by a process that holds it (a Ray actor) dies with that process:
the kernel SIGKILLs it when its parent ends (``PR_SET_PDEATHSIG``), and Spark's JVM then
ends too (PySpark's gateway exits when its stdin, the container's pipe, closes). Without
it, a container whose actor was killed (its node lost, ``ray.kill``) would run on as an
orphan nobody can reach, holding a JVM."""

from __future__ import annotations

import ctypes
import os
import signal

from weir.proto.contract import PARENT_PID_ENV

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> bool:
    """If the launcher asked for it (``PARENT_PID_ENV`` names the parent), be SIGKILLed
    when the parent ends; True if asked. A parent already gone is the same: exit now.

    Raises:
        OSError: the kernel refused (not Linux): the container must not run unheld.
    """
    parent = os.environ.pop(PARENT_PID_ENV, "")
    if not parent:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"cannot tie the container to its parent: {os.strerror(errno)}")
    if os.getppid() != int(parent):  # it ended before the tie was made
        os.kill(os.getpid(), signal.SIGKILL)
    return True

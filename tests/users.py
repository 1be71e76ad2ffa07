"""Acting as another local user in a test: a forked child that drops to ``nobody`` runs a
function, as the attacker of a shared machine would (tests run as root in CI)."""

from __future__ import annotations

import os
import pwd
import traceback
from collections.abc import Callable

__all__ = ["as_other_user", "other_user_available", "other_uid"]


def other_uid() -> int:
    return pwd.getpwnam("nobody").pw_uid


def other_user_available() -> bool:
    """Whether this process can act as another user (it runs as root)."""
    try:
        other_uid()
    except KeyError:
        return False
    return os.getuid() == 0


def as_other_user(action: Callable[[], object], timeout_s: float = 30.0,
                  groups: tuple[int, ...] = ()) -> None:
    """Runs ``action`` in a child process as user ``nobody`` (in the supplementary
    ``groups``, as a pod's process is in its ``fsGroup``); raises if it failed."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, act, report, exit without cleanup
        os.close(read_end)
        status = 0
        try:
            uid = other_uid()
            os.setgroups(list(groups))
            os.setgid(pwd.getpwuid(uid).pw_gid)
            os.setuid(uid)
            os.umask(0o022)
            action()
        except BaseException:  # noqa: BLE001 - reported to the parent
            os.write(write_end, traceback.format_exc().encode()[-4000:])
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        error = reader.read()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise AssertionError(f"acting as another user failed:\n{error.decode()}")

"""The end of a container's log for ``weir logs``: as its cluster manager keeps it (a
pod's log), or read from the folder the master's local launcher writes each container's
output to (``--log-dir``), never through a link."""

from __future__ import annotations

import os
from pathlib import Path

from weir.master.errors import FailedPrecondition, InvalidArgument, NotFound
from weir.master.launcher import Launcher

__all__ = ["DEFAULT_BYTES", "MAX_BYTES", "log_tail"]

DEFAULT_BYTES = 65_536
MAX_BYTES = 4 << 20


def log_tail(launcher: Launcher, container_id: str, max_bytes: int = 0
             ) -> tuple[str, bool, str]:
    """(text, truncated, path): the last ``max_bytes`` of the container's log, from the
    start of a line.

    Raises:
        FailedPrecondition: this master keeps no container logs (no log folder, or its
            containers are started by hand).
        NotFound: the container wrote no log here.
        InvalidArgument: ``max_bytes`` out of range.
    """
    if not 0 <= max_bytes <= MAX_BYTES:
        raise InvalidArgument(f"max_bytes must be 0 (the default, {DEFAULT_BYTES:,}) to "
                              f"{MAX_BYTES:,}, not {max_bytes}")
    try:
        kept = launcher.log(container_id, max_bytes or DEFAULT_BYTES)
    except KeyError:
        raise NotFound(f"container {container_id} was not launched by this master") from None
    if kept is not None:
        data, truncated, where = kept
        return _from_a_line(data, truncated).decode("utf-8", errors="replace"), truncated, where
    folder = getattr(launcher, "log_dir", None)
    if folder is None:
        raise FailedPrecondition(
            "this master keeps no container logs: its containers write to its own output, "
            "or were started by hand; start it with --log-dir DIR (weir master, weir run) "
            "to keep each container's log")
    path = Path(folder) / f"{container_id}.log"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise NotFound(f"container {container_id} has no log in {folder} (it was not "
                       "launched by this master)") from None
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(fd).st_size
        wanted = max_bytes or DEFAULT_BYTES
        start = max(0, size - wanted)
        handle.seek(start)
        data = handle.read(wanted)
    return _from_a_line(data, start > 0).decode("utf-8", errors="replace"), start > 0, str(path)


def _from_a_line(data: bytes, truncated: bool) -> bytes:
    """A tail cut at a line's start: its first, partial line dropped."""
    if not truncated:
        return data
    cut = data.find(b"\n")
    return data[cut + 1:] if cut >= 0 else data

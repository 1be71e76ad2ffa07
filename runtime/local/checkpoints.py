"""Checkpoint files of the local test runner (``runtime.local.run``): one file per
operator and window under a folder, so a second run can resume from the first one's.

A run resumes from the newest window at which *every* operator has a checkpoint (the
committed window, as the master would compute it), and only checkpoints older than that
window are deleted, so an aborted run always leaves one it can resume from.

Checkpoints are pickles a resumed run loads: the folder is owner-only (made so, or
refused if others could write into it), each file is written owner-only through a fresh
random name (``write_private_file``: never through a link planted at a predictable name)
and read only if it is a regular file of this user.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterable
from pathlib import Path

from weir.storage.private_files import (
    check_private_file,
    make_private_dir,
    write_private_file,
)

__all__ = ["LocalCheckpointError", "LocalCheckpoints"]

_SUFFIX = ".ckpt"
_WHAT = "the local runner's checkpoint folder"
_ADVICE = "remove it, or give checkpoint_dir a folder of your own"


class LocalCheckpointError(RuntimeError):
    """The checkpoint folder holds checkpoints but no window every operator saved."""


class LocalCheckpoints:
    """Checkpoints under ``folder/<operator>/<window id, 16 hex digits>.ckpt``.

    Args:
        folder: where they go (created owner-only, or checked: ``UntrustedPath`` if
            another user could write into it).
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        make_private_dir(str(self.folder), _WHAT, advice=_ADVICE)

    def _dir(self, name: str) -> Path:
        return self.folder / urllib.parse.quote(name, safe="")

    def save(self, name: str, window_id: int, data: bytes) -> None:
        """Writes atomically and owner-only (random temporary name, sync, rename)."""
        folder = self._dir(name)
        make_private_dir(str(folder), f"a folder of {_WHAT}", advice=_ADVICE)
        write_private_file(str(folder / f"{window_id:016x}{_SUFFIX}"), data)

    def load(self, name: str, window_id: int) -> bytes:
        """The checkpoint's bytes, from a regular file of this user only (never a link).

        Raises:
            UntrustedPath: it is a link, another user's, or others may write it.
        """
        path = self._dir(name) / f"{window_id:016x}{_SUFFIX}"
        check_private_file(str(path), "a local checkpoint", advice=_ADVICE)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))  # no swap since
        with os.fdopen(fd, "rb") as file:
            return file.read()

    def windows(self, name: str) -> list[int]:
        """The windows ``name`` has checkpoints of, oldest first."""
        folder = self._dir(name)
        if not folder.is_dir():
            return []
        return sorted(int(p.stem, 16) for p in folder.glob(f"*{_SUFFIX}"))

    def common_window(self, names: Iterable[str]) -> int:
        """The newest window every operator in ``names`` checkpointed; -1 when there are no
        checkpoints at all.

        Raises:
            LocalCheckpointError: some exist, but no window is common to all operators.
        """
        saved = {name: set(self.windows(name)) for name in names}
        if not any(saved.values()):
            return -1
        common = set.intersection(*saved.values())
        if not common:
            counts = {name: len(windows) for name, windows in saved.items()}
            raise LocalCheckpointError(
                f"{self.folder} holds checkpoints but none at a window every operator saved "
                f"(checkpoints per operator: {counts}); is it another DAG's folder?")
        return max(common)

    def purge(self, names: Iterable[str]) -> None:
        """Deletes each operator's checkpoints older than the newest common window."""
        names = list(names)
        try:
            keep_from = self.common_window(names)
        except LocalCheckpointError:
            return
        for name in names:
            for window_id in self.windows(name):
                if window_id < keep_from:
                    (self._dir(name) / f"{window_id:016x}{_SUFFIX}").unlink(missing_ok=True)

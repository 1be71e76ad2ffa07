"""The Parquet files handed to Spark: where they live (one scratch folder per bridge,
``weir-spark-<pid>-...``; folders of dead processes are swept) and when they go: tracked
per calling thread, deleted when the job that read them ran (see ``runtime.spark.bridge``)."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from weir.storage.orphans import remove_orphans

__all__ = ["ScratchFiles"]

_LOGGER = logging.getLogger("weir.runtime.spark.bridge")

_SCRATCH_PREFIX = "weir-spark-"


class ScratchFiles:
    """Files handed to Spark, tracked per calling thread, in a folder made on first use.

    Args:
        parent: where the scratch folder is made.
        check_running: raises if the bridge was stopped (no folder is made then).
    """

    def __init__(self, parent: Path, check_running: Callable[[], None]) -> None:
        self.parent = parent
        self._check_running = check_running
        self._folder: Path | None = None
        self._lock = threading.Lock()
        self._local = threading.local()

    @property
    def folder(self) -> Path | None:
        """The scratch folder, once made."""
        return self._folder

    def new_path(self, suffix: str) -> Path:
        """A fresh file path, tracked for the calling thread (its job, or loose)."""
        return self.track(self.reserve(suffix))

    def reserve(self, suffix: str) -> Path:
        """A fresh file path, not tracked yet: its writer ``track``s it once the file is
        handed to Spark, or deletes it."""
        return self._scratch_folder() / f"{uuid.uuid4().hex}{suffix}"

    def track(self, path: Path) -> Path:
        """Deletes ``path`` with the calling thread's files: at the end of its job, or
        loose (see ``release``)."""
        scopes = self._scopes()
        (scopes[-1] if scopes else self._loose()).append(path)
        return path

    def in_job(self) -> bool:
        """Whether the calling thread is inside a ``job()`` block."""
        return bool(self._scopes())

    @contextlib.contextmanager
    def job(self) -> Iterator[None]:
        """Keeps the files made in this block (this thread) until it ends; blocks nest."""
        scopes = self._scopes()
        files: list[Path] = []
        scopes.append(files)
        try:
            yield
        finally:
            scopes.pop()
            _delete(files)

    def release(self) -> None:
        """Deletes the files this thread made outside any ``job()`` block."""
        loose = self._loose()
        files = list(loose)
        loose.clear()
        _delete(files)

    def remove(self) -> None:
        """Deletes the scratch folder and everything in it."""
        with self._lock:
            folder, self._folder = self._folder, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def _scopes(self) -> list[list[Path]]:
        scopes = getattr(self._local, "scopes", None)
        if scopes is None:
            scopes = self._local.scopes = []
        return scopes

    def _loose(self) -> list[Path]:
        loose = getattr(self._local, "loose", None)
        if loose is None:
            loose = self._local.loose = []
        return loose

    def _scratch_folder(self) -> Path:
        folder = self._folder
        if folder is not None:
            return folder
        with self._lock:
            self._check_running()
            if self._folder is None:
                self.parent.mkdir(parents=True, exist_ok=True)
                remove_orphans(self.parent, _SCRATCH_PREFIX)
                self._folder = Path(tempfile.mkdtemp(
                    prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-", dir=self.parent))
                atexit.register(shutil.rmtree, self._folder, True)
                _LOGGER.debug("Spark scratch folder %s", self._folder)
            return self._folder


def _delete(files: list[Path]) -> None:
    for path in files:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            _LOGGER.warning("could not delete Spark scratch file %s: %s", path, exc)

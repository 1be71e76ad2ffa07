"""MkDocs hook: lays the package out as a wheel does (``weir/`` holding the part folders,
as links) under ``site/.api-src``, where the API reference's docstrings are read
statically; in a checkout the parts are top-level folders that only ``weir/__init__``
reaches at import time, which a static reader does not run."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGED = ROOT / "build" / "api-src"
PARTS = ("proto", "operators", "runtime", "storage", "master", "container")


def on_startup(command: str, dirty: bool) -> None:  # noqa: ARG001 - MkDocs' signature
    package = STAGED / "weir"
    if package.exists():
        shutil.rmtree(package)
    package.mkdir(parents=True)
    shutil.copyfile(ROOT / "weir" / "__init__.py", package / "__init__.py")
    for part in PARTS:
        (package / part).symlink_to(ROOT / part, target_is_directory=True)

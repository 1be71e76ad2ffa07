"""Weir: a stream-processing runtime for Python (an Apex-style master and containers,
Arrow Flight buffer servers, Spark for each operator's window logic).

One namespaced package: ``weir.operators`` (the API an application is written in),
``weir.master``, ``weir.container``, ``weir.proto``, ``weir.runtime``, ``weir.storage``.
In a wheel those are folders of this package; in a source checkout they are the
repository's top-level folders, which this package's path reaches (so a checkout runs
without being installed, and a user's own ``operators.py`` shadows nothing of Weir's).
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

_HERE = Path(__file__).resolve().parent
if not (_HERE / "operators").is_dir() and (_HERE.parent / "operators").is_dir():
    __path__.append(str(_HERE.parent))  # a source checkout: the parts sit beside this folder

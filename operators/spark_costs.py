"""Where a Spark operator's window jobs spend their time (its ``spark`` metric)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

__all__ = ["JobCosts"]


class JobCosts:
    """Running totals of a Spark operator's window jobs, by phase (see ``spark_costs``)."""

    PHASES = ("write", "handoff", "job", "emit")

    def __init__(self) -> None:
        self.jobs = 0
        self.rows_in = 0
        self.seconds = dict.fromkeys(self.PHASES, 0.0)

    @contextlib.contextmanager
    def job(self) -> Any:
        yield
        self.jobs += 1

    @contextlib.contextmanager
    def phase(self, name: str) -> Any:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - started

    def figures(self) -> dict[str, float]:
        return {"jobs": self.jobs, "rows_in": self.rows_in,
                **{f"{name}_ms": round(s * 1000, 3) for name, s in self.seconds.items()}}

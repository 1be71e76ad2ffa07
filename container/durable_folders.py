"""Where a container's operators keep their durable folders (logs, keyed stores): in the
folder of their run, ``STATE_DIR/runs/<first generation>/operators/<id>``, so a run on a
STATE_DIR never reads what an earlier run left there; a run is named by its first
generation, unique across the runs on one folder (``master.state_owner.first_generation``).
"""

from __future__ import annotations

import os
import shutil
import threading

__all__ = ["DurableFolders", "redeployed"]


def redeployed(first_generation: int, generation: int) -> bool:
    """An earlier deployment of the operator ran in this run: its generation is above the
    run's first."""
    return generation > max(1, first_generation)


class DurableFolders:
    """The durable folders of one run's operators under a local STATE_DIR ("" for a
    remote one: logs need append and fsync)."""

    def __init__(self, state_dir: str) -> None:
        remote = "://" in state_dir and not state_dir.startswith("file://")
        self.runs = "" if remote else os.path.join(state_dir.removeprefix("file://"), "runs")
        self.run = 0  # the run's first generation (0 until a deploy names it)
        self._lock = threading.Lock()

    def operator_dir(self, operator_id: int) -> str:
        """The operator's durable folder in this run's ("" without a local STATE_DIR)."""
        if not self.runs:
            return ""
        return os.path.join(self.runs, str(self.run), "operators", str(operator_id))

    def enter_run(self, first_generation: int) -> None:
        """Takes the run and, the first time, deletes the folders earlier runs left: they
        are over (the master claims STATE_DIR for one run at a time), and a stray
        deployment of one is fenced off."""
        with self._lock:
            if first_generation <= self.run:
                return
            self.run = first_generation
        if not self.runs or not os.path.isdir(self.runs):
            return
        for name in os.listdir(self.runs):
            if name.isdecimal() and int(name) < first_generation:
                shutil.rmtree(os.path.join(self.runs, name), ignore_errors=True)

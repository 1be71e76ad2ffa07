"""When a run's results were out, read from outside: the mtimes of its output data files.

Every system's internal clock starts after its own start-up (a JVM, a session, a
master), which a user waits for all the same. Timed from the runner's spawn of the run's
process to the files' mtimes, start-up counts against every system alike, and the same
code reads the output of all of them (Weir's ``FileSink``, Spark SS's ``foreachBatch``
files, Flink's filesystem sink).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["OUTSIDE_FIGURES", "has_rows", "outside_figures", "result_times"]

OUTSIDE_FIGURES = ("launch_to_first_result_s", "launch_to_last_result_s", "launch_to_exit_s",
                   "events_per_second_outside")
"""The keys ``outside_figures`` gives (None: not measured, e.g. no output at all)."""

_NOT_DATA = (".crc", ".tmp", ".inprogress")


def _is_data_file(path: Path, folder: Path) -> bool:
    """A finished data file: no part of its path hidden (``.``: temporary and in-progress
    files) or a marker (``_SUCCESS``, ``_temporary/``), no checksum or in-progress name."""
    if not path.is_file():
        return False
    parts = path.relative_to(folder).parts
    if any(part.startswith((".", "_")) for part in parts):
        return False
    return not (path.name.endswith(_NOT_DATA) or ".inprogress" in path.name)


def has_rows(path: Path) -> bool:
    """Whether the file holds at least one row: Parquet by its footer's row count (an
    unreadable footer: a file still being written, no rows yet); any other format (CSV,
    JSON lines, no header) by holding a byte."""
    if path.suffix == ".parquet":
        try:
            return pq.ParquetFile(path).metadata.num_rows > 0
        except (OSError, pa.ArrowInvalid):
            return False
    return path.stat().st_size > 0


def result_times(folder: Path, pattern: str) -> tuple[float, float] | None:
    """The mtimes (epoch seconds) of the first and the last data file with rows among
    ``folder.glob(pattern)``; None when none has a row (or the folder is missing).

    The mtime is when a file's last byte was written: Weir's sink and Spark's committers
    write under another name and rename, which keeps it.
    """
    if not folder.is_dir():
        return None
    times = [path.stat().st_mtime for path in folder.glob(pattern)
             if _is_data_file(path, folder) and has_rows(path)]
    return (min(times), max(times)) if times else None


def outside_figures(launched_at: float, returned_at: float | None,
                    times: tuple[float, float] | None, events: int) -> dict[str, float | None]:
    """A run as its user waits for it, from ``launched_at`` (the runner's spawn of the
    run's process, epoch s): to the first and the last result file (``result_times``), to
    the system's run returning (``returned_at``), and all ``events`` over the seconds to
    the last result. A figure that cannot be taken is None."""
    first = last = None
    if times is not None:
        first, last = (round(t - launched_at, 3) for t in times)
    exit_s = round(returned_at - launched_at, 3) if returned_at is not None else None
    return {"launch_to_first_result_s": first, "launch_to_last_result_s": last,
            "launch_to_exit_s": exit_s,
            "events_per_second_outside": round(events / last, 1) if last and last > 0
            else None}

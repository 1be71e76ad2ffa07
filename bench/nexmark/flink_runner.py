"""Runs a Nexmark query on Apache Flink and checks its output: ``flink_job`` in the Flink
venv's Python as a subprocess (PyFlink never enters the project's venvs), its CSV
output read back here and compared with the reference.

The Flink venv is ``.venv-flink`` beside the project (``make bench`` creates it), or
the Python ``$WEIR_FLINK_PYTHON`` names.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from bench.common import JobResult
from bench.nexmark import compare, flink_job
from bench.nexmark.generator import csv_path
from bench.nexmark.model import AUCTION, BID, PERSON, NexmarkSpec
from bench.nexmark.reference import answer, read_events

__all__ = ["OUT_DIR", "RESULT_FILES", "flink_python", "run"]

_ROOT = Path(__file__).resolve().parents[2]
_SYSTEM = "flink"

OUT_DIR, RESULT_FILES = "flink-out", "**/*"
"""Where under the run's work folder the job's filesystem sink writes, and which files
(at any depth; ``bench.output_times`` and ``read_output`` leave out hidden in-progress
ones): read back for the check and for the times from outside."""

_WARM_ROWS = 5_000
_TYPES = {"BIGINT": pa.int64(), "STRING": pa.string(), "TIMESTAMP(3)": pa.timestamp("ms")}


def flink_python() -> Path:
    """The Flink venv's Python."""
    return Path(os.environ.get("WEIR_FLINK_PYTHON") or _ROOT / ".venv-flink" / "bin" / "python")


def _arrow_type(sql: str) -> pa.DataType:
    decimal = re.fullmatch(r"DECIMAL\((\d+), (\d+)\)", sql)
    if decimal:
        return pa.decimal128(int(decimal[1]), int(decimal[2]))
    return _TYPES[sql]


def output_schema(query: str) -> pa.Schema:
    """The Arrow schema of the query's CSV output (from ``flink_job``'s table)."""
    fields = []
    for column in re.split(r",\s(?![^()]*\))", flink_job._OUTPUT[query]):
        name, sql = column.strip().split(" ", 1)
        fields.append((name, _arrow_type(sql)))
    return pa.schema(fields)


def read_output(query: str, out_dir: Path) -> pa.Table:
    """Every committed part file's rows (in-progress files are hidden, ``.``-named)."""
    schema = output_schema(query)
    files = [p for p in sorted(out_dir.glob(RESULT_FILES)) if p.is_file()
             and not any(part.startswith(".") for part in p.relative_to(out_dir).parts)]
    tables = [pacsv.read_csv(p, read_options=pacsv.ReadOptions(column_names=schema.names),
                             convert_options=pacsv.ConvertOptions(
                                 column_types=dict(zip(schema.names, schema.types,
                                                       strict=True))))
              for p in files if p.stat().st_size]
    return pa.concat_tables(tables) if tables else schema.empty_table()


def _warm_input(data: Path, warm: Path) -> None:
    """The first rows of each kind's CSV file, for the warm-up run."""
    for kind in (PERSON, AUCTION, BID):
        target = warm / kind / f"{kind}.csv"
        target.parent.mkdir(parents=True, exist_ok=True)
        share = {PERSON: 1, AUCTION: 3, BID: 46}[kind]
        with csv_path(data, kind).open() as source, target.open("w") as out:
            for _, line in zip(range(_WARM_ROWS * share // 50 + 1), source, strict=False):
                out.write(line)


def run(query: str, spec: NexmarkSpec, data: Path, work: Path, timeout_s: float = 600.0,
        parallelism: int = 2, warm_up: bool = True) -> JobResult:
    """Runs the query on Flink over the CSV files under ``data``; checks it exactly.

    ``seconds``: the timed job from its submission to its end (the job's mini-cluster
    start included: PyFlink starts one per job); no per-window latency is measured.
    ``warm_up``: first an untimed job over a few thousand rows, which a user does not
    run: timed from outside, the runner turns it off. ``extra["system_returned_at"]``:
    the epoch second the Flink process had exited, before the check.
    """
    python = flink_python()
    if not python.exists():
        return JobResult(_SYSTEM, spec.events, 0.0, [], False,
                         f"no Flink venv at {python}: `make bench` creates .venv-flink "
                         "(apache-flink from PyPI)")
    warm, out, warm_out = work / "flink-warm", work / OUT_DIR, work / "flink-warm-out"
    settings = {"window_ms": spec.window_ms, "slide_ms": spec.slide_ms,
                "session_gap_ms": spec.session_gap_ms, "q2_modulo": spec.q2_modulo,
                "watermark_delay_ms": spec.watermark_delay_ms, "category": spec.category,
                "q3_states": list(spec.q3_states), "top_n": spec.top_n}
    argv = [str(python), str(Path(flink_job.__file__)), query, "--csv",
            str(csv_path(data, BID).parent.parent), "--out", str(out), "--spec",
            json.dumps(settings), "--parallelism", str(parallelism)]
    if warm_up:
        _warm_input(data, warm)
        argv += ["--warm", str(warm), "--warm-out", str(warm_out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK"))}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              env=env, cwd=work)
        returned_at = time.time()  # the Flink process exited: before the check
    except subprocess.TimeoutExpired:
        return JobResult(_SYSTEM, spec.events, 0.0, [], False,
                         f"timed out after {timeout_s:.0f} s")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = " | ".join(proc.stderr.strip().splitlines()[-6:])
        return JobResult(_SYSTEM, spec.events, 0.0, [], False,
                         f"exit {proc.returncode}: {tail[-1500:]}",
                         extra={"system_returned_at": returned_at})
    timing = json.loads(lines[-1])
    expected = answer(query, read_events(data, query), spec)
    correct, detail = compare.check(compare.canonical(query, read_output(query, out)),
                                    expected)
    return JobResult(_SYSTEM, spec.events, float(timing["seconds"]), [], correct, detail,
                     extra={"warm_up_seconds": None if timing["warm_up_seconds"] is None
                            else round(float(timing["warm_up_seconds"]), 2),
                            "flink_version": timing.get("flink_version", "?"),
                            "parallelism": parallelism, "warm_up": warm_up,
                            "system_returned_at": returned_at})

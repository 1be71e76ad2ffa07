"""The package as a user installs it: a wheel built from the checkout's tracked files
(no generated modules among them), installed into a fresh venv outside the checkout, runs
a word count with ``weir run`` beside a user's own ``operators.py``."""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.harness import WeirProcess, poll_for, tagged_env, tagged_processes

pytestmark = pytest.mark.timeout(600)

CHECKOUT = Path(__file__).resolve().parents[2]

APP = """
    from weir.operators import Dag
    from weir.operators.library import DirectorySource, FileSink, Tokenize, WindowedCount

    dag = Dag("wheel-wordcount", STREAMING_WINDOW_SIZE_MILLIS=200, HEARTBEAT_INTERVAL_MILLIS=200,
              SPARK_MASTER="local[1]", SPARK_SHUFFLE_PARTITIONS=1, SPARK_WARMUP_ROWS=0)
    source = dag.add_operator("source", DirectorySource("inbox"))
    tokenize = dag.add_operator("tokenize", Tokenize())
    count = dag.add_operator("count", WindowedCount(key="word"))
    sink = dag.add_operator("sink", FileSink("out", format="jsonl"), CONTAINER=1)
    dag.add_stream("lines", source.output, tokenize.input)
    dag.add_stream("words", tokenize.output, count.input)
    dag.add_stream("counts", count.output, sink.input)
"""

# A user's module of their own named like one of Weir's parts: Weir must never import it.
USERS_OPERATORS = 'raise ImportError("a user module named operators was imported by Weir")\n'


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built (without build isolation: offline) from a copy of the tracked and
    untracked-but-not-ignored files, as ``pip install git+…`` would see them."""
    work = tmp_path_factory.mktemp("wheel")
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=CHECKOUT,
                            capture_output=True, text=True, check=True).stdout.split("\n")
    source = work / "source"
    for name in filter(None, listed):
        path = CHECKOUT / name
        if path.is_file() and not name.startswith(("tests/", "bench/", "docs/")):
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name)
    assert not list((source / "proto").glob("*_pb2*")), "generated modules must not be copied"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--no-build-isolation", "-w", str(work / "dist"), str(source)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (found,) = (work / "dist").glob("weir_streams-*.whl")
    return found


def test_the_wheel_holds_one_top_level_package_with_the_generated_modules(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"weir"}
    for module in ("weir/proto/plan_pb2.py", "weir/proto/umbilical_pb2_grpc.py",
                   "weir/proto/client_pb2.py", "weir/master/dashboard.html",
                   "weir/operators/library/window_sessions.py", "weir/__main__.py"):
        assert module in names, f"{module} missing from the wheel"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "weir = weir.master.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.fixture(scope="module")
def fresh_venv(wheel, tmp_path_factory) -> Path:
    """A new venv with only the wheel installed; its dependencies are this test venv's,
    reached by a path file (CI installs nothing more from the registry for it)."""
    venv = tmp_path_factory.mktemp("venv") / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                                "--no-index", str(wheel)], capture_output=True, text=True,
                               timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "weir-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def outside_the_checkout() -> dict[str, str]:
    """This environment without a PYTHONPATH (a test run may put the checkout there)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_the_installed_package_is_the_wheels_and_names_no_part_at_the_top(fresh_venv, tmp_path):
    python = str(fresh_venv / "bin" / "python")
    where = subprocess.run([python, "-c", "import weir.operators, weir.proto.plan_pb2; "
                            "print(weir.operators.__file__)"], cwd=tmp_path,
                           env=outside_the_checkout(), capture_output=True, text=True,
                           timeout=60)
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(str(fresh_venv)), where.stdout
    for part in ("operators", "proto", "master", "container"):
        missing = subprocess.run([python, "-c", f"import {part}"], cwd=tmp_path,
                                 env=outside_the_checkout(), capture_output=True, text=True,
                                 timeout=60)
        assert "ModuleNotFoundError" in missing.stderr, f"{part}: {missing.stderr}"


def test_weir_run_from_the_wheel_counts_every_word(fresh_venv, tmp_path):
    (tmp_path / "inbox").mkdir()
    lines = ["the quick brown fox", "jumps over the lazy dog", "the end"] * 50
    (tmp_path / "inbox" / "part-000.txt").write_text("\n".join(lines) + "\n")
    expected = collections.Counter(w for line in lines for w in line.split())
    (tmp_path / "app.py").write_text(textwrap.dedent(APP))
    (tmp_path / "operators.py").write_text(USERS_OPERATORS)
    env, tag = tagged_env(PYSPARK_PYTHON=str(fresh_venv / "bin" / "python"))
    env.pop("PYTHONPATH", None)
    proc = WeirProcess(["run", "app.py"], env, tmp_path, tmp_path / "weir.log",
                       python=str(fresh_venv / "bin" / "python"))
    try:
        assert proc.wait(300) == 0, proc.output()
    finally:
        proc.stop()
        for leftover in tagged_processes(tag):
            leftover.kill()
    poll_for(lambda: not tagged_processes(tag), 15, "the run's processes to exit")
    counted: collections.Counter[str] = collections.Counter()
    for path in (tmp_path / "out").rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            counted[row["word"]] += row["count"]
    assert counted == expected, proc.output()

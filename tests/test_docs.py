"""The documentation: the site builds strictly (a broken link, anchor or API reference
fails it), and every Python sample in it and in the README runs.

How a page's samples run, in a folder of their own, in page order:
- a block titled ``title="NAME.py"`` is a file the reader saves: it is written there, and
  runs when a command of the page runs it (the client sample needs a master: it is only
  written and compiled);
- any other Python block runs, in one namespace per page (a page builds on its earlier
  blocks), and every ``test_*`` function a block defines is called (with ``tmp_path``
  when it asks for it), so a sample test is a test;
- a ``sh`` block's ``python NAME.py`` and ``weir run NAME.py`` lines run, for the page's
  own files (installing, ``make`` and the like are this checkout's own business);
- a ``text`` block titled ``output`` must be what the command before it printed.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness import tagged_env, tagged_processes

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^```(\w+)?([^\n]*)\n(.*?)^```\s*$", re.M | re.S)
TITLE = re.compile(r'title="([^"]+)"')
COMMAND = re.compile(r"^(python|weir run) (\S+\.py)\s*(?:#.*)?$")

pytestmark = pytest.mark.timeout(900)


@dataclass
class Block:
    language: str
    title: str
    code: str
    line: int


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        title = TITLE.search(match.group(2) or "")
        found.append(Block(match.group(1) or "", title.group(1) if title else "",
                           match.group(3), text.count("\n", 0, match.start()) + 1))
    return found


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                            "--site-dir", str(tmp_path / "site")], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "WARNING" not in built.stderr, built.stderr  # strict counts them; say them too
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "weir.operators.dag.Dag" in api and "add_operator" in api  # docstrings were read
    library = (tmp_path / "site" / "reference" / "library" / "index.html").read_text()
    assert "EventTimeWindows" in library and "file_schema" in library


def test_every_page_has_a_place_in_the_site():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert {p for p in pages if p not in nav} == set()


def _call_tests(namespace: dict, tmp_path: Path, done: set[str]) -> None:
    for name, value in list(namespace.items()):
        if name.startswith("test_") and callable(value) and name not in done:
            done.add(name)
            wants = inspect.signature(value).parameters
            folder = tmp_path / name
            folder.mkdir()
            value(**({"tmp_path": folder} if "tmp_path" in wants else {}))


def _run(command: list[str], cwd: Path, what: str) -> str:
    env, tag = tagged_env(PYSPARK_PYTHON=sys.executable)
    try:
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=600)
    finally:
        for leftover in tagged_processes(tag):
            leftover.kill()
    assert done.returncode == 0, f"{what}: {done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_sample_runs(page, tmp_path, monkeypatch):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")  # samples may name the example
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs_sample_{page.stem}"}
    tests_run: set[str] = set()
    last_output: str | None = None
    ran = 0
    for block in blocks(page):
        where = f"{page.relative_to(ROOT)}:{block.line}"
        if block.language == "python" and block.title:
            compile(block.code, where, "exec")  # at least its syntax, when nothing runs it
            (tmp_path / block.title).write_text(block.code)
        elif block.language == "python":
            exec(compile(block.code, where, "exec"), namespace)  # noqa: S102 - the sample
            _call_tests(namespace, tmp_path, tests_run)
            ran += 1
        elif block.language == "sh":
            for line in block.code.splitlines():
                command = COMMAND.match(line.strip())
                if command and (tmp_path / command.group(2)).exists():
                    program = ([sys.executable] if command.group(1) == "python"
                               else [sys.executable, "-m", "weir", "run"])
                    last_output = _run([*program, command.group(2)], tmp_path, where)
                    ran += 1
        elif block.language == "text" and block.title == "output":
            assert last_output is not None, f"{where}: an output block with no command before"
            assert last_output.strip() == block.code.strip(), f"{where}: the output differs"
    if "dag" in namespace:  # the page's application is one the master would take
        namespace["dag"].to_descriptor()
    python_blocks = [b for b in blocks(page) if b.language == "python" and not b.title]
    assert ran or not python_blocks, f"{page}: it has samples, and none ran"

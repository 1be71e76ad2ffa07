"""Spark's class-data archive: mapped only when it is this user's alone, made by one
process at a time, and handed to every JVM a bridge starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import poll_for
from weir.runtime.spark import class_archive

pytestmark = pytest.mark.timeout(420)


@pytest.fixture
def archive(tmp_path, monkeypatch) -> Path:
    """The archive's path, in a folder of the test's (``java -version`` not asked)."""
    path = tmp_path / "spark-test.jsa"
    monkeypatch.setitem(class_archive._PATHS, "archive", path)
    return path


def test_an_archive_is_mapped_only_when_it_is_this_users_alone(archive) -> None:
    assert class_archive.java_options() == ""  # none made yet: the JVM starts without
    archive.write_bytes(b"classes")
    archive.chmod(0o666)  # others may write it: a JVM would map their code
    assert class_archive.java_options() == ""
    archive.chmod(0o600)
    assert class_archive.java_options().startswith(f"-XX:SharedArchiveFile={archive} ")


def test_one_maker_at_a_time_and_a_dead_makers_lock_is_taken_over(archive, monkeypatch
                                                                    ) -> None:
    trained: list[Path] = []

    def train(path: Path, timeout_s: float, on_start) -> str:
        trained.append(path)
        return "made"

    monkeypatch.setattr(class_archive, "_train", train)
    lock = archive.with_suffix(".lock")
    lock.write_text("")  # another process is making it now
    assert "another process is making" in class_archive.make_archive()
    assert trained == [] and lock.exists()
    old = time.time() - class_archive.MAKE_TIMEOUT_S - 120
    os.utime(lock, (old, old))  # a maker that died long ago
    assert class_archive.make_archive() == "made"
    assert trained == [archive] and not lock.exists()  # its own lock is gone too
    archive.write_bytes(b"classes")
    assert "start from the class-data archive" in class_archive.make_archive()
    assert trained == [archive]  # there already: not made again


@pytest.mark.slow
def test_a_bridge_starts_its_jvm_from_the_archive() -> None:
    """A real JVM of a bridge of its own (in a process of its own: one JVM per process),
    once the archive exists (made here, or by the suite's maker meanwhile)."""
    path = class_archive.archive_path()
    if not path.is_file():
        note = class_archive.make_archive()
        poll_for(path.is_file, 300, f"the class-data archive ({note})")
    script = ("from weir.runtime.spark.bridge import SparkSessionBridge\n"
              "b = SparkSessionBridge(master='local[1]', shuffle_partitions=1)\n"
              "print(b.session.sparkContext.getConf().get('spark.driver.extraJavaOptions'))\n"
              "b.stop()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=240, check=True)
    assert f"-XX:SharedArchiveFile={path}" in done.stdout


def test_a_maker_removes_partial_archives_a_killed_training_left(archive, monkeypatch) -> None:
    monkeypatch.setattr(class_archive, "_train", lambda path, timeout_s, on_start: "made")
    old, fresh = archive.parent / ".partial-old.jsa", archive.parent / ".partial-new.jsa"
    old.write_bytes(b"half")
    fresh.write_bytes(b"half")  # another maker's, being written now
    long_ago = time.time() - class_archive.MAKE_TIMEOUT_S - 120
    os.utime(old, (long_ago, long_ago))
    assert class_archive.make_archive() == "made"
    assert not old.exists() and fresh.exists()


def test_a_maker_that_fails_says_so_as_a_warning(monkeypatch, caplog) -> None:
    import logging

    caplog.set_level(logging.INFO, logger=class_archive.__name__)
    for note, level in (("the class-data archive was not made (exit code 1)", "WARNING"),
                        ("another process is making the class-data archive x", "INFO")):
        monkeypatch.setattr(class_archive, "make_archive", lambda on_start, note=note: note)
        maker = class_archive.ArchiveMaker()
        maker.start()
        assert maker.join(10) and maker.note == note
        assert [r.levelname for r in caplog.records if r.getMessage() == note] == [level]

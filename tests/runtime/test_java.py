"""Whether the Java Spark would start is there and new enough: asked with a real ``java``
(this machine's), a missing one, and stand-ins that say an old or a new version."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from weir.runtime.spark import java as java_module
from weir.runtime.spark.java import java_problem


@pytest.fixture(autouse=True)
def _fresh_answers(monkeypatch):
    monkeypatch.setattr(java_module, "_ASKED", {})


def fake_java_home(folder: Path, version_line: str, code: int = 0) -> str:
    """A JAVA_HOME whose bin/java prints ``version_line`` for -version, as java does."""
    binary = folder / "bin" / "java"
    binary.parent.mkdir(parents=True)
    binary.write_text(f"#!/bin/sh\necho '{version_line}' >&2\nexit {code}\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return str(folder)


def test_this_machines_java_is_enough():
    assert java_problem() is None


def test_no_java_anywhere_says_what_to_install(tmp_path):
    problem = java_problem({"PATH": str(tmp_path)})
    assert problem is not None and "JAVA_HOME is not set and there is no java" in problem
    assert "install Java 17 or newer" in problem and "openjdk-17-jre-headless" in problem
    problem = java_problem({"JAVA_HOME": str(tmp_path / "none"), "PATH": os.environ["PATH"]})
    assert problem is not None and "has no bin/java" in problem


def test_an_old_java_is_named_with_its_version(tmp_path):
    home = fake_java_home(tmp_path / "jdk8", 'java version "1.8.0_392"')
    problem = java_problem({"JAVA_HOME": home, "PATH": ""})
    assert problem is not None and "is Java 8" in problem and "Java 17 or newer" in problem
    home = fake_java_home(tmp_path / "jdk21", 'openjdk version "21.0.2" 2024-01-16')
    assert java_problem({"JAVA_HOME": home, "PATH": ""}) is None


def test_a_java_that_does_not_say_its_version_is_a_problem(tmp_path):
    home = fake_java_home(tmp_path / "broken", "Error: could not find libjava.so", code=1)
    problem = java_problem({"JAVA_HOME": home, "PATH": ""})
    assert problem is not None and "did not say its version" in problem
    assert "could not find libjava.so" in problem

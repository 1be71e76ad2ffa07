"""The docstrings' examples of every module of Weir, run as the modules are imported
(``weir.…``): the parts are collected by module name, not by file, so a module is never
imported twice under two names."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import weir

PARTS = ("proto", "operators", "runtime", "storage", "master", "container")


def module_names() -> list[str]:
    names = ["weir"]
    for part in PARTS:
        package = importlib.import_module(f"weir.{part}")
        names.append(package.__name__)
        modules = pkgutil.walk_packages(package.__path__, f"{package.__name__}.")
        names += [info.name for info in modules
                  if not info.name.endswith("__main__") and "_pb2" not in info.name]
    return sorted(names)


@pytest.mark.parametrize("name", module_names())
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed"


def test_every_part_is_found_under_the_one_package():
    names = module_names()
    assert weir.__version__
    assert {n.split(".")[1] for n in names if n != "weir"} == set(PARTS)
    assert "weir.operators.library.window_sessions" in names
